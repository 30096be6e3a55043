"""The pruner's rate limit: every etcd request of a pass - index pages, history reads, defer,
prune and tombstone txns - waits for its own slot of the pacer, counted per interval on an
injected clock (no wall-clock asserts)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.effects import EffectState
from coordinator.store.etcd.pacer import Pacer
from coordinator.store.retention.pruner import Pruner
from tests.retention.conftest import TOMBSTONE_RETENTION
from tests.retention.test_pruner import PAST, effect, finish
from tests.store.support import claim, create


class FakeTime:
    """The pacer's clock: waiting moves it on at once (no test sleeps). History reads are sent
    from several threads, so each thread's slot (the time it waited until) is its own."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()
        self._mine = threading.local()

    def clock(self) -> float:
        with self._lock:
            self._mine.slot = self.now
            return self.now

    def wait(self, seconds: float) -> bool:
        with self._lock:
            self._mine.slot += seconds
            self.now = max(self.now, self._mine.slot)
        return False

    def slot(self) -> float:
        """The slot of this thread's last request."""
        return float(self._mine.slot)


class Recording:
    """The pruner's etcd connection, noting the pacer's time of every slot taken through it,
    and every request made through it that took no slot of its own (``unpaced``)."""

    def __init__(self, inner: Any, time: FakeTime, log: list[float]) -> None:
        self._inner, self._time, self.log = inner, time, log
        self.unpaced: list[str] = []
        self._lock = threading.Lock()
        self._mine = threading.local()  # slots this thread took

    def paced(self, take: Callable[[], None]) -> Recording:
        twin = Recording(self._inner, self._time, self.log)

        def noted() -> None:
            take()
            with twin._lock:
                twin.log.append(self._time.slot())
            twin._mine.taken = getattr(twin._mine, "taken", 0) + 1

        twin._inner = self._inner.paced(noted)
        return twin

    def _request(self, what: str, call: Callable[[], Any], slots: int = 1) -> Any:
        before = getattr(self._mine, "taken", 0)
        result = call()
        if getattr(self._mine, "taken", 0) - before < slots:
            self.unpaced.append(what)
        return result

    def txn(self, *args: Any, **kwargs: Any) -> Any:
        return self._request("txn", lambda: self._inner.txn(*args, **kwargs))

    def txn_in_order(self, txns: Any) -> Any:
        return self._request("txn_in_order", lambda: self._inner.txn_in_order(txns), len(txns))

    def read(self, *ops: Any) -> Any:
        return self._request("read", lambda: self._inner.read(*ops))

    def get(self, key: str) -> Any:
        return self._request("get", lambda: self._inner.get(key))

    def range_page(self, *args: Any, **kwargs: Any) -> Any:
        return self._request("range_page", lambda: self._inner.range_page(*args, **kwargs))

    def prefix_end(self, prefix: str) -> str:
        return str(self._inner.prefix_end(prefix))


def test_the_rate_limit_paces_every_request_of_a_pass_reads_defers_and_expiries_too(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    store = make_store()
    for n in range(20):
        finish(store, f"old{n:02d}")
    clock.advance(PAST)
    assert store.pruner is not None and store.pruner.run_pass().pruned == 20
    clock.advance(TOMBSTONE_RETENTION + 1)  # their tombstones expire in the paced pass
    for n in range(40):
        finish(store, f"t{n:02d}")
    create(store, "unknown")
    effect(store, claim(store, "unknown"), "s", EffectState.UNKNOWN)
    store.tasks.cancel("unknown", by="pm", reason="stop")  # due, but deferred
    clock.advance(PAST)
    fake, rate = FakeTime(), 10.0
    log: list[float] = []
    recording = Recording(store.ctx.kv, fake, log)
    ctx = replace(store.ctx, kv=cast(Any, recording))
    pruner = Pruner(ctx, sink, pacer=Pacer(rate, clock=fake.clock, wait=fake.wait))
    paced = cast(Recording, pruner._ctx.kv)

    report = pruner.run_pass()

    assert (report.pruned, report.deferred, report.tombstones_expired) == (40, 1, 20)
    # Every request had a slot of its own, one per 1/rate: the index pages, the batched history
    # reads, the defer txn and the tombstone txn as much as the prune txns (a slot each, though
    # a page of them goes in one request).
    assert paced.unpaced == []
    slots = sorted(round(t * rate) for t in log)
    assert slots == list(range(len(log))), slots
    per_second = Counter(slot // int(rate) for slot in slots)
    assert max(per_second.values()) == rate and len(log) > 40 + 1 + 1
