"""Bounded replays (issue 25 item 3): replays of the event log's past run within slots, per
replica and per principal (typed RESOURCE_EXHAUSTED past them, nothing read), and a replay of
a long log holds at most a pass of it in memory, given back when it ends. Real etcd; the slots
test through a real server (callers name themselves: insecure mode)."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from coordinator.domain.keys import Keyspace
from coordinator.domain.records import EventRecord, encode
from coordinator.domain.states import Op, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.server import build_server
from coordinator.server.wire import event_wire
from coordinator.store import EtcdKV, EventFilter, Store
from coordinator.store.etcd.ops import put
from coordinator.store.lifecycle import events as event_log
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually, next_of
from tests.lifecycle.support import create, who
from tests.store.support import write_in_txns

WHOLE = tasks_pb2.WatchEventsRequest()  # no follow: the log's past, from its start


@pytest.fixture
def bounded(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[tuple[Store, str]]:
    """A store allowing 3 replays at once, 2 per principal, and a server for it."""
    kv = EtcdKV.connect([etcd.endpoint])
    store = Store.open(
        kv, keys=Keyspace(prefix), metrics=metrics, max_replays=3, max_replays_per_principal=2
    )
    store.start()
    server, port = build_server(store, listen="127.0.0.1:0", health_interval=0.2)
    try:
        yield store, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()
        store.close()
        kv.close()


def _stall_after_first_event(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Each replay stops after sending its first event (a reader still reading it), holding
    its slot, until the returned event is set."""
    release = threading.Event()
    real = event_wire.event_to_proto
    sent = threading.local()

    def slow(event: Any) -> tasks_pb2.TaskEvent:
        sent.count = getattr(sent, "count", 0) + 1
        if sent.count == 2:
            release.wait(30)
        return real(event)

    monkeypatch.setattr(event_wire, "event_to_proto", slow)
    return release


def test_replays_past_the_slots_are_refused_typed_and_freed_slots_admit_again(
    bounded: tuple[Store, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target = bounded
    channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    for task_id in ("a", "b"):
        create(store, task_id)
    release = _stall_after_first_event(monkeypatch)

    def replay(principal: str) -> Any:
        call = tasks.WatchEvents(WHOLE, metadata=who(principal), timeout=30)
        next_of(call)  # admitted: its first event arrived
        return call

    def refused(principal: str) -> str:
        with pytest.raises(grpc.RpcError) as info:
            next_of(tasks.WatchEvents(WHOLE, metadata=who(principal), timeout=30))
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        return info.value.details() or ""

    held = [replay("reader-1"), replay("reader-1")]
    assert "max_replays_per_principal" in refused("reader-1")
    held.append(replay("reader-2"))
    assert "(max_replays)" in refused("reader-3")
    assert store.events.replays_running == 3  # the refused ones took no slot
    release.set()
    for call in held:
        assert len(list(call)) == 1  # the rest of the log: the second event
    eventually(lambda: store.events.replays_running == 0)
    assert len(list(tasks.WatchEvents(WHOLE, metadata=who("reader-3")))) == 2
    channel.close()


def _write_events(store: Store, first: int, count: int) -> None:
    """``count`` events of 50 tasks straight into the log (what transitions would write), at
    state versions from ``first`` on."""
    keys = store.ctx.keys
    ops = []
    for n in range(first, first + count):
        record = EventRecord(f"t{n % 50:02d}", Op.CREATE, TaskState.READY, at=float(n))
        ops.append(put(keys.event(record.task_id, n), encode(record)))
    write_in_txns(store, ops)


def _replay_peak(store: Store) -> tuple[int, int, int]:
    """Events replayed, the peak of memory traced during the replay above where it started,
    and what stayed allocated once it ended."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        replayed = sum(1 for _ in store.events.history(EventFilter()))
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return replayed, peak - start, now - start


def _least_of_three(store: Store) -> tuple[int, int, int]:
    """``_replay_peak``'s figures, each the least of three replays: tracemalloc counts every
    thread, and the replica's own watches may still be busy with the events just written (a
    busy CI machine once saw a replay "keep" 197 KB that were theirs)."""
    runs = [_replay_peak(store) for _ in range(3)]
    return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)


def test_a_replay_holds_one_pass_in_memory_whatever_the_log_length(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_log, "_SELECT", 500)
    _write_events(store, 0, 1500)
    short, short_peak, _ = _least_of_three(store)
    _write_events(store, 1500, 4500)  # four times as long
    long, long_peak, kept = _least_of_three(store)
    assert (short, long) == (1500, 6000)
    # Passes of 500 events either way: four times the log is not four times the memory.
    assert long_peak < 2 * short_peak
    assert kept < short_peak / 4  # given back when the replay ended
