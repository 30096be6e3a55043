"""A WatchEvents follower that runs through a whole scenario, the way a real consumer would.

It opens ``WatchEvents(queue=..., follow=True)`` on the run's queue when the run starts and keeps
it open through the fault. Whenever the stream breaks - whatever the status: a replica killed
(UNAVAILABLE), the stream's maximum age (UNAVAILABLE), refused or cut for being behind
(RESOURCE_EXHAUSTED), anything else - it resumes with ``after=`` the position of the last event
it received (several events share a revision, so the revision alone would skip or repeat some).
What it received, in arrival order, is then compared with etcd's own history by the checker
(``chaos/follow_check.py``): any gap, duplicate or out-of-order event is a violation.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import grpc

from chaos.etcd_history import from_watch_event
from chaos.history import EtcdWrite
from coordinator.domain.positions import EventPosition
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc

MAX_EVENTS = 500_000
"""Events kept at most (the long profile's 300 s produce about 15,000); past it the follower
stops and says so, rather than growing without bound."""
RESUME_DELAY = 0.2
"""Seconds between a break and the resume: a refusal (RESOURCE_EXHAUSTED) is not retried in a
tight loop."""

Metadata = tuple[tuple[str, str | bytes], ...]


class Follower:
    """One follow stream on ``queue``, resumed after every break until ``stop()``."""

    def __init__(
        self,
        channel: Callable[[], grpc.Channel],
        queue: str,
        metadata: Metadata,
        *,
        max_events: int = MAX_EVENTS,
    ) -> None:
        self._channel = channel
        self._queue = queue
        self._metadata = metadata
        self._max_events = max_events
        self._lock = threading.Lock()
        self._received: list[EtcdWrite] = []
        self._breaks: Counter[str] = Counter()
        self._overflowed = False
        self._stopping = threading.Event()
        self._call: grpc.Call | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-follower", daemon=True)

    def start(self) -> Follower:
        """Open the stream (on a thread of its own)."""
        self._thread.start()
        return self

    @property
    def received(self) -> list[EtcdWrite]:
        """Every event received so far, in arrival order."""
        with self._lock:
            return list(self._received)

    @property
    def breaks(self) -> dict[str, int]:
        """How many times the stream broke, by status code name."""
        with self._lock:
            return dict(self._breaks)

    @property
    def overflowed(self) -> bool:
        """Whether it stopped at ``max_events`` (what it holds is then a prefix)."""
        with self._lock:
            return self._overflowed

    def last(self) -> EventPosition | None:
        """The position of the last event received."""
        with self._lock:
            return self._received[-1].position if self._received else None

    def wait_for(self, position: EventPosition, timeout: float) -> bool:
        """Wait until it has received ``position`` or beyond; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.last()
            if (last is not None and last >= position) or self.overflowed:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Cancel the stream and end the thread."""
        self._stopping.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopping.is_set():
            request = tasks_pb2.WatchEventsRequest(queue=self._queue, follow=True)
            last = self.last()
            if last is not None:
                request.after.CopyFrom(
                    tasks_pb2.EventPosition(
                        revision=last.revision,
                        task_id=last.task_id,
                        prev_state_version=last.prev_state_version,
                    )
                )
            cause = self._follow(request)
            if cause is None:
                return
            with self._lock:
                self._breaks[cause] += 1
            self._stopping.wait(RESUME_DELAY)

    def _follow(self, request: tasks_pb2.WatchEventsRequest) -> str | None:
        """One stream until it breaks: the status code name, or None when the follower is done
        (stopped, or full)."""
        try:
            with self._channel() as channel:
                call = tasks_pb2_grpc.TaskServiceStub(channel).WatchEvents(
                    request, metadata=self._metadata
                )
                with self._lock:
                    self._call = call
                if self._stopping.is_set():  # stop() came between the loop's check and the call
                    call.cancel()  # type: ignore[no-untyped-call]
                for event in call:
                    if not self._keep(event):
                        call.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
                        return None
        except grpc.RpcError as exc:
            return None if self._stopping.is_set() else exc.code().name
        finally:
            with self._lock:
                self._call = None
        return "ENDED"  # a follow stream ended without a status: resume all the same

    def _keep(self, event: tasks_pb2.TaskEvent) -> bool:
        with self._lock:
            if len(self._received) >= self._max_events:
                self._overflowed = True
                return False
            self._received.append(from_watch_event(event))
            return True
