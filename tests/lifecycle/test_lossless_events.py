"""WatchEvents loses nothing: several events share one etcd revision (group commit nests
concurrent transition txns into one), and readers order and resume by event position, never by
revision alone. A slow follower is ended with the position to resume after, and its memory on
the server stays bounded."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import coordinator.store.lifecycle.events as events_module
from coordinator.domain.positions import EventPosition, StreamBehind
from coordinator.domain.stream_limits import StreamLimits
from coordinator.metrics import Metrics
from coordinator.server import build_server
from coordinator.server.interceptors import stream_interceptor
from coordinator.server.wire import event_wire
from coordinator.store import EventFilter, Store
from coordinator.store.lifecycle.events import EventLog
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.lifecycle.support import create, create_concurrently, who

READ = who("viewer")


def _key(event: tasks_pb2.TaskEvent) -> tuple[int, str, int]:
    p = event.position
    return (p.revision, p.task_id, p.prev_state_version)


def _stream(tasks: tasks_pb2_grpc.TaskServiceStub, **fields: Any) -> list[tasks_pb2.TaskEvent]:
    return list(tasks.WatchEvents(tasks_pb2.WatchEventsRequest(**fields), metadata=READ))


def _shared_revisions(events: list[tasks_pb2.TaskEvent]) -> list[int]:
    counts = Counter(e.revision for e in events)
    return sorted(rev for rev, n in counts.items() if n > 1)


def _follow(
    tasks: tasks_pb2_grpc.TaskServiceStub, **fields: Any
) -> tuple[Any, queue.Queue[tasks_pb2.TaskEvent | grpc.RpcError]]:
    call = tasks.WatchEvents(tasks_pb2.WatchEventsRequest(follow=True, **fields), metadata=READ)
    received: queue.Queue[tasks_pb2.TaskEvent | grpc.RpcError] = queue.Queue()

    def pump() -> None:
        try:
            for event in call:
                received.put(event)
        except grpc.RpcError as exc:
            received.put(exc)

    threading.Thread(target=pump, daemon=True).start()
    return call, received


def _take(received: queue.Queue[Any], count: int) -> list[tasks_pb2.TaskEvent]:
    return [received.get(timeout=20) for _ in range(count)]


def test_a_follower_receives_every_event_of_shared_revisions_exactly_once_in_order(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    create(store, "marker", queue="burst")
    call, received = _follow(tasks, queue="burst")
    try:
        assert _take(received, 1)[0].task_id == "marker"
        names = [f"t{i:03}" for i in range(400)]
        create_concurrently(store, names)
        live = _take(received, 400)
        # One more, written after all 400: the next event must be it, not a late repeat.
        create(store, "after", queue="burst")
        assert _take(received, 1)[0].task_id == "after"
    finally:
        call.cancel()
    assert sorted(e.task_id for e in live) == names  # every create, none twice
    assert [_key(e) for e in live] == sorted(_key(e) for e in live)  # in position order
    assert _shared_revisions(live), "group commit shared no revision: the test proves nothing"
    history = _stream(tasks, queue="burst")[1:-1]  # without "marker" and "after"
    assert [_key(e) for e in live] == [_key(e) for e in history]


def test_resuming_after_the_first_event_of_a_shared_revision_loses_and_repeats_nothing(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    create_concurrently(store, [f"t{i:03}" for i in range(160)])
    everything = _stream(tasks, queue="burst")
    shared = _shared_revisions(everything)
    assert shared, "group commit shared no revision: the test proves nothing"
    cut = next(i for i, e in enumerate(everything) if e.revision == shared[0])
    # History: resume after the first event of that revision.
    rest = _stream(tasks, queue="burst", after=everything[cut].position)
    assert [_key(e) for e in rest] == [_key(e) for e in everything[cut + 1 :]]
    # Follow: a stream broken there and resumed after it.
    call, received = _follow(tasks, queue="burst", after=everything[cut].position)
    try:
        resumed = _take(received, len(everything) - cut - 1)
    finally:
        call.cancel()
    assert [_key(e) for e in resumed] == [_key(e) for e in everything[cut + 1 :]]
    # The compatibility rule: from_revision replays the whole revision.
    from_rev = _stream(tasks, queue="burst", from_revision=shared[0])
    assert [_key(e) for e in from_rev] == [_key(e) for e in everything[cut:]]


def test_history_in_passes_smaller_than_the_log_is_the_whole_log_in_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_concurrently(store, [f"t{i:03}" for i in range(64)])
    whole = [e.position for e in store.events.history(EventFilter(queue="burst"))]
    monkeypatch.setattr(events_module, "_SELECT", 3)
    passes = [e.position for e in store.events.history(EventFilter(queue="burst"))]
    assert passes == whole == sorted(whole)
    assert len(whole) == 64


def test_a_follower_that_falls_behind_is_ended_with_the_position_to_resume_after(
    store: Store,
) -> None:
    slow = EventLog(store.ctx, inbox_events=5, patience=0.2)
    behind = threading.Event()
    create(store, "first", queue="burst")
    stream = slow.follow(EventFilter(queue="burst"), alive=lambda: True, on_behind=behind.set)
    try:
        got = [next(stream).position]
        create_concurrently(store, [f"t{i:03}" for i in range(48)])
        assert behind.wait(10), "a reader that stopped reading was never found behind"
        with pytest.raises(StreamBehind) as raised:
            got.extend(event.position for event in stream)
    finally:
        slow.close()  # its shared watch, which the store's own close does not know of
    assert raised.value.position == got[-1]
    rest = [e.position for e in store.events.history(EventFilter(queue="burst"), after=got[-1])]
    whole = [e.position for e in store.events.history(EventFilter(queue="burst"))]
    assert got + rest == whole
    assert len(whole) == 49


def _stall_after_first_send(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event]:
    """Make the server's WatchEvents thread stall before its second event, as a slow reader's
    does; returns (behind: the server found the stream behind, release: let the thread go
    on)."""
    behind, release = threading.Event(), threading.Event()
    real = event_wire.event_to_proto
    real_cut = stream_interceptor.cut_when_stuck
    sent = [0]

    def cut_when_stuck(message: Any) -> Any:
        cut = real_cut(message)

        def on_behind() -> None:
            behind.set()
            cut()

        return on_behind

    def slow(event: Any) -> tasks_pb2.TaskEvent:
        sent[0] += 1
        if sent[0] == 2:
            release.wait(30)
        return real(event)

    monkeypatch.setattr(event_wire, "event_to_proto", slow)
    monkeypatch.setattr(stream_interceptor, "cut_when_stuck", cut_when_stuck)
    return behind, release


def _ended(metrics: Metrics, reason: str) -> float:
    """Streams the server ended for ``reason`` (coordinator_streams_ended_total)."""
    value = metrics.registry.get_sample_value("coordinator_streams_ended_total", {"reason": reason})
    return value or 0.0


def test_a_grpc_follower_that_falls_behind_gets_resource_exhausted_and_its_resume_position(
    store: Store,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
) -> None:
    store.events = EventLog(store.ctx, inbox_events=5, patience=0.2)
    create(store, "first", queue="burst")
    behind, release = _stall_after_first_send(monkeypatch)
    call, received = _follow(tasks, queue="burst")
    got = _take(received, 1)
    create_concurrently(store, [f"t{i:03}" for i in range(48)])
    assert behind.wait(10), "the stalled stream was never found behind"
    release.set()
    while not isinstance(item := received.get(timeout=20), grpc.RpcError):
        got.append(item)
    assert item.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "fell 5 events behind" in (item.details() or "")
    trailing = {m.key: m.value for m in item.trailing_metadata() or ()}
    resume = tasks_pb2.EventPosition.FromString(trailing[event_wire.RESUME_AFTER_METADATA])
    assert _key_of(resume) == _key(got[-1])
    rest = _stream(tasks, queue="burst", after=resume)
    whole = _stream(tasks, queue="burst")
    assert [_key(e) for e in got + rest] == [_key(e) for e in whole]  # none lost, none twice
    assert len(whole) == 49
    # Counted once, as ended behind; its handler noticed, so it was not cut.
    assert (_ended(metrics, "behind"), _ended(metrics, "cancelled")) == (1, 0)
    call.cancel()


# A client's HTTP/2 receive window of 4 KiB (about 50 events), fixed (no BDP probing): a
# client that stops reading fills it at once and the server's send then blocks.
SMALL_WINDOW = [*GRPC_OPTIONS, ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4096)]


@pytest.fixture
def quick_cut(store: Store) -> Iterator[tasks_pb2_grpc.TaskServiceStub]:
    """TaskService of a server that cuts a stuck stream half a second after its end was
    decided (the default is seconds), reached through a client with a small receive window."""
    limits = StreamLimits(sweep_interval=0.1, stuck_grace=0.5)
    server, port = build_server(store, max_workers=4, streams=limits, health_interval=0.2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=SMALL_WINDOW)
    try:
        yield tasks_pb2_grpc.TaskServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None).wait()


def test_a_client_that_stops_reading_is_cut_resource_exhausted_naming_where_to_resume(
    store: Store, quick_cut: tasks_pb2_grpc.TaskServiceStub, metrics: Metrics
) -> None:
    # A second of patience: a handler merely slowed by the writers is not taken for stuck.
    store.events = EventLog(store.ctx, inbox_events=5, patience=1.0)
    create(store, "first", queue="burst")
    request = tasks_pb2.WatchEventsRequest(follow=True, queue="burst")
    call = quick_cut.WatchEvents(request, metadata=READ, timeout=60)  # not read until cut
    create_concurrently(store, [f"t{i:03}" for i in range(320)])
    eventually(
        lambda: (_ended(metrics, "behind"), _ended(metrics, "cancelled")) == (1, 1),
        message="the stuck stream was not found behind and cut",
    )
    open_now = "coordinator_streams_open"
    eventually(lambda: metrics.registry.get_sample_value(open_now) == 0, message="slot kept")
    # Now read: what had left the server, then the typed end naming the last event read.
    got: list[tasks_pb2.TaskEvent] = []
    with pytest.raises(grpc.RpcError) as raised:
        got.extend(call)
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    last = got[-1].position
    named = f"revision: {last.revision}, task_id: {last.task_id!r}, "
    assert named + f"prev_state_version: {last.prev_state_version}}}" in (
        raised.value.details() or ""
    )
    assert 1 < len(got) < 321, "the window held nothing back: the stream was never stuck"
    rest = _stream(quick_cut, queue="burst", after=last)
    whole = _stream(quick_cut, queue="burst")
    assert [_key(e) for e in got + rest] == [_key(e) for e in whole]  # none lost, none twice
    assert len(whole) == 321


def _key_of(position: tasks_pb2.EventPosition) -> tuple[int, str, int]:
    return (position.revision, position.task_id, position.prev_state_version)


def test_a_boundary_the_server_hands_out_is_taken_back_as_after(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    # A follower ended behind before it received anything is told the start of the revision it
    # asked for (not an event): sent back as after, it resumes exactly there.
    create_concurrently(store, [f"t{i:03}" for i in range(32)])
    everything = _stream(tasks, queue="burst")
    middle = everything[len(everything) // 2].revision
    ((_, told),) = event_wire.resume_after_to_metadata(EventPosition.start_of(middle))
    resumed = _stream(tasks, queue="burst", after=tasks_pb2.EventPosition.FromString(told))
    assert [_key(e) for e in resumed] == [_key(e) for e in everything if e.revision >= middle]
    assert resumed[0].revision == middle


def test_the_after_position_must_name_an_event(tasks: tasks_pb2_grpc.TaskServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _stream(tasks, after=tasks_pb2.EventPosition(revision=3))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "after must be the position of an event" in (raised.value.details() or "")
    with pytest.raises(grpc.RpcError) as raised:
        _stream(tasks, from_revision=2, after=tasks_pb2.EventPosition(revision=3, task_id="t"))
    assert "either from_revision or after" in (raised.value.details() or "")
