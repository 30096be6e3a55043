"""Follow streams share one etcd watch per replica (store/lifecycle/event_hub.py): each gets
every event once and in order from it, and one that falls behind is ended typed without
holding the others back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from coordinator.domain.positions import EventPosition, StreamBehind
from coordinator.store import EventFilter, Store
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent
from coordinator.store.lifecycle.event_hub import Behind, Mailbox
from coordinator.store.lifecycle.events import EventLog, StoredEvent
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.helpers import eventually, next_of
from tests.lifecycle.support import create, create_concurrently, who

READ = who("viewer")
FOLLOWERS = 20


class EventWatches:
    """Counts the etcd watches the store opens on the event log, and how many are open."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = 0
        self.open = 0
        self._lock = threading.Lock()
        kv, events = store.ctx.kv, store.ctx.keys.events_prefix("")
        real = kv.watch_prefix

        def watch_prefix(prefix: str, **kwargs: Any) -> PrefixWatch:
            watch = real(prefix, **kwargs)
            if prefix.startswith(events):
                self._count(watch)
            return watch

        monkeypatch.setattr(kv, "watch_prefix", watch_prefix)

    def _count(self, watch: PrefixWatch) -> None:
        real_close = watch.close
        closed = [False]

        def close() -> None:
            with self._lock:
                self.open -= 0 if closed[0] else 1
                closed[0] = True
            real_close()

        with self._lock:
            self.opened += 1
            self.open += 1
        watch.close = close  # type: ignore[method-assign]


def _key(event: tasks_pb2.TaskEvent) -> tuple[int, str, int]:
    p = event.position
    return (p.revision, p.task_id, p.prev_state_version)


def _follow(tasks: tasks_pb2_grpc.TaskServiceStub, revision: int) -> Any:
    request = tasks_pb2.WatchEventsRequest(follow=True, queue="burst", from_revision=revision)
    return tasks.WatchEvents(request, metadata=READ, timeout=60)


def test_follow_streams_share_one_etcd_watch_and_each_gets_every_event_once_in_order(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any, monkeypatch: Any
) -> None:
    watches = EventWatches(store, monkeypatch)
    first = _follow(tasks, etcd_client.put("/shared-follow/now", "").header.revision)
    follows = [first]
    try:
        create(store, "marker", queue="burst")
        assert next_of(first).task_id == "marker"
        eventually(lambda: watches.open == 1, message="the first follower kept its own watch")
        opened = watches.opened
        # Followers from now on join the hub's watch: none opens one of its own.
        now = etcd_client.put("/shared-follow/now", "").header.revision
        follows += [_follow(tasks, now) for _ in range(FOLLOWERS - 1)]
        names = [f"t{i:03}" for i in range(100)]
        create_concurrently(store, names)
        got = [[next_of(call) for _ in names] for call in follows]
        assert (watches.opened, watches.open) == (opened, 1)
    finally:
        for call in follows:
            call.cancel()
    history = list(tasks.WatchEvents(tasks_pb2.WatchEventsRequest(queue="burst"), metadata=READ))
    assert sorted(e.task_id for e in history[1:]) == names
    for received in got:  # every event once, in the log's order
        assert [_key(e) for e in received] == [_key(e) for e in history[1:]]


def _drain(stream: Iterator[StoredEvent], count: int, into: list[EventPosition]) -> None:
    for event in stream:
        into.append(event.position)
        if len(into) == count:
            return


def test_a_slow_follower_is_ended_behind_while_one_beside_it_on_the_same_watch_gets_all(
    store: Store,
) -> None:
    log = EventLog(store.ctx, inbox_events=5, patience=0.2)
    behind = threading.Event()
    create(store, "first", queue="burst")
    burst = EventFilter(queue="burst")
    slow = log.follow(burst, alive=lambda: True, on_behind=behind.set)
    got = [next(slow).position]
    stop = threading.Event()
    fast = log.follow(burst, alive=lambda: not stop.is_set())
    quick: list[EventPosition] = []
    reader = threading.Thread(target=_drain, args=(fast, 49, quick), daemon=True)
    reader.start()
    try:
        create_concurrently(store, [f"t{i:03}" for i in range(48)])
        assert behind.wait(10), "a reader that stopped reading was never found behind"
        reader.join(20)
        whole = [e.position for e in store.events.history(burst)]
        assert quick == whole, "the reader beside the slow one lost or repeated events"
        with pytest.raises(StreamBehind) as raised:
            got.extend(event.position for event in slow)
        assert raised.value.position == got[-1]
        assert got == whole[: len(got)]
    finally:
        stop.set()
        log.close()


def _entries(*revisions: int) -> list[tuple[EventPosition, WatchEvent]]:
    return [
        (EventPosition(r, "t", 0), WatchEvent(f"/p/events/t/{r}", False, b"", r)) for r in revisions
    ]


def _mailbox(alive: Callable[[], bool] = lambda: True) -> tuple[Mailbox, list[int]]:
    told: list[int] = []
    return Mailbox(2, 1.0, alive=alive, on_behind=lambda: told.append(1)), told


def test_a_full_mailbox_is_detached_and_its_drained_reader_told_to_join_again() -> None:
    box, told = _mailbox()
    box.attach([], now=0.0)
    box.offer(_entries(1, 2), now=0.0)
    box.offer(_entries(3), now=0.1)  # full: not taken, the box is detached
    box.check(0.5)  # within its patience
    assert box.get() == _entries(1, 2)
    assert box.get() is None  # drained: join again from the cursor
    assert told == []


def test_a_mailbox_detached_past_its_patience_is_behind_once() -> None:
    box, told = _mailbox()
    box.attach(_entries(1, 2, 3), now=0.0)  # more than it holds: detached at once
    box.check(0.9)
    assert told == []
    box.check(1.0)
    box.check(2.0)
    assert told == [1]
    with pytest.raises(Behind):
        box.get()


def test_a_mailbox_whose_call_ended_wakes_its_reader() -> None:
    ended = threading.Event()
    box, _ = _mailbox(alive=lambda: not ended.is_set())
    box.attach([], now=0.0)
    ended.set()
    box.check(0.0)
    assert box.get() == []  # the reader looks at alive() and ends


def test_a_grpc_follower_ended_by_its_caller_frees_its_place_on_the_shared_watch(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any
) -> None:
    call = _follow(tasks, etcd_client.put("/shared-follow/now", "").header.revision)
    create(store, "one", queue="burst")
    assert next_of(call).task_id == "one"
    call.cancel()
    with pytest.raises(grpc.RpcError):
        next_of(call)
    eventually(lambda: store.events.followers == 0, message="an ended follower stayed on the hub")


def test_a_follower_on_the_shared_watch_ends_when_its_store_closes(store: Store) -> None:
    log = EventLog(store.ctx)
    create(store, "one", queue="burst")
    got: list[str] = []
    stream = log.follow(EventFilter(queue="burst"), alive=lambda: True)
    reader = threading.Thread(target=lambda: got.extend(e.record.task_id for e in stream))
    reader.start()
    eventually(lambda: got == ["one"], message="the follower read nothing")
    create(store, "two", queue="burst")  # takes it past the hub's floor if it was not yet
    eventually(lambda: got == ["one", "two"], message="the follower missed an event")
    eventually(lambda: log.followers == 1, message="the follower never joined the hub")
    log.close()  # no ticker looks at it any more: it must not wait forever
    reader.join(10)
    assert not reader.is_alive(), "a follower outlived its store's close"
