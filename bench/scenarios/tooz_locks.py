"""d. tooz with its etcd3gw driver, one lock per task: lock, write the result, unlock.

etcd3gw speaks etcd's JSON gRPC gateway over HTTP (etcd 3.4 serves it on the client port). tooz
is optional at run time: if it (or etcd3gw) does not import, or a first lock cycle fails against
this etcd, the scenario is skipped and the reason goes into the report. Like the etcd3 recipe,
tooz leaves each lock's lease to expire; the benchmark revokes them after the run, off the clock.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import CycleFn, RunSpec, Scenario
from bench.scenarios.coordinator import RESULT

PREFIX = "/bench-tooz"
TTL = 30


def _import_tooz() -> tuple[Any, str | None]:
    """tooz's ``coordination`` module, or None and why it is not usable."""
    try:
        import etcd3gw  # noqa: F401 - the driver imports it lazily; fail early and clearly
        from tooz import coordination
    except ImportError as exc:
        return None, (
            f"tooz/etcd3gw not importable ({exc}); install them with pip install -e '.[bench]'"
        )
    return coordination, None


class ToozScenario(Scenario):
    """tooz ``get_lock(name)``: acquire -> put result -> release, over etcd3gw."""

    key = "d"
    title = "tooz (etcd3gw driver): lock + put result + unlock (no fencing)"

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self._url = f"etcd3+http://{host}:{port}?timeout=10&lock_timeout={TTL}"
        self._coordination, self.skip_reason = _import_tooz()
        self._members: list[Any] = []
        # The leases tooz left behind, per member (each member's HTTP session revokes its own).
        self._leases: dict[int, list[Any]] = {}
        self._leases_lock = threading.Lock()
        self._run = ""

    def setup(self, max_level: int) -> None:
        """One started tooz coordinator per worker; a first lock cycle proves the driver works."""
        if self.skip_reason is not None:
            return
        try:
            for i in range(len(self._members), max_level):
                member = self._coordination.get_coordinator(self._url, f"bench-w{i:02d}".encode())
                # Loopback: an $http_proxy from the environment must not carry this traffic.
                member.client.session.trust_env = False
                member.start()
                self._members.append(member)
            self._cycle(0, "probe")()
            self.finish()
        except Exception as exc:
            self.skip_reason = f"tooz with etcd3gw failed against this etcd: {exc!r}"[:300]

    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Nothing to seed: every cycle locks a fresh name."""
        self._run = spec.name
        return [self._cycle(i, f"{spec.name}/w{i:02d}") for i in range(spec.level)]

    def _cycle(self, index: int, name: str) -> CycleFn:
        member = self._members[index]
        counter = itertools.count()

        def cycle() -> tuple[float, float]:
            task = f"{name}/t{next(counter):07d}"
            lock = member.get_lock(f"bench/{task}".encode())
            t0 = time.perf_counter()
            if not lock.acquire(blocking=True):
                raise RuntimeError(f"tooz lock {task} not acquired")
            t1 = time.perf_counter()
            member.client.put(f"{PREFIX}/results/{task}", RESULT.decode())
            if not lock.release():
                raise RuntimeError(f"tooz lock {task} was not ours at release")
            t2 = time.perf_counter()
            with self._leases_lock:
                self._leases.setdefault(index, []).append(lock._lease)
            return t1 - t0, t2 - t1

        return cycle

    def finish(self) -> None:
        """Revoke the leases tooz left behind and drop the run's results."""
        with self._leases_lock:
            leases, self._leases = self._leases, {}
        if leases:
            with ThreadPoolExecutor(16, thread_name_prefix="tooz-revoke") as pool:
                for future in [pool.submit(_revoke, batch) for batch in leases.values()]:
                    future.result()
        if self._run and self._members:
            self._members[0].client.delete_prefix(f"{PREFIX}/results/{self._run}/")
            self._run = ""

    def close(self) -> None:
        """Stop every tooz coordinator."""
        for member in self._members:
            try:
                member.stop()
            except Exception:  # closing must not hide the measurements
                continue


def _revoke(leases: list[Any]) -> None:
    for lease in leases:
        lease.revoke()  # over the session of the member that granted it
