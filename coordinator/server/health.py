"""The readiness half of the health service: SERVING only while etcd answers.

A checker reads the epoch every interval and publishes the answer for "" and every coordinator
service, so a load balancer stops routing to a replica that cannot reach its store. The
"liveness" service is set by ``app.build_server`` alone: it stays SERVING while the process
serves, whatever etcd does.
"""

from __future__ import annotations

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

from coordinator.errors import CoordinatorError
from coordinator.store import Store

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthChecker:
    """Sets SERVING / NOT_SERVING for "" and ``services`` from whether etcd answers and the
    version record admits this replica; stops with the server."""

    def __init__(
        self,
        store: Store,
        servicer: health.HealthServicer,
        server: grpc.Server,
        interval: float,
        services: tuple[str, ...],
    ) -> None:
        self._store = store
        self._servicer = servicer
        self._server = server
        self._interval = interval
        self._services = services
        self._serving: bool | None = None

    def set_liveness(self, name: str) -> None:
        """``name`` answers SERVING for as long as the process serves, whatever etcd does."""
        self._servicer.set(name, SERVING)

    def check(self) -> None:
        """Read the epoch once and publish the result for "" and every service."""
        error = ""
        try:
            self._store.admin.epoch()
            # A replica the version record refuses answers nothing but health: not ready, so
            # a load balancer sends its calls to the replicas that serve them.
            refusal = self._store.standing.current()[1]
            serving, error = refusal is None, refusal or ""
        except CoordinatorError as exc:
            serving = False
            error = str(exc)
        except Exception as exc:  # the checker must outlive any surprise
            serving = False
            error = f"{type(exc).__name__}: {exc}"
        status = SERVING if serving else NOT_SERVING
        for name in ("", *self._services):
            self._servicer.set(name, status)
        if serving != self._serving:  # log transitions, not every tick
            if serving:
                log.info("health: SERVING")
            else:
                log.warning("health: NOT_SERVING", error=error)
            self._serving = serving

    def run(self) -> None:
        """Check every interval until the server terminates."""
        # wait_for_termination returns True on timeout, False once the server has stopped.
        while self._server.wait_for_termination(timeout=self._interval):
            self.check()
