"""A live follow stream broken right after the first event of a shared revision (group commit put
several creations in it) and resumed by the two consumers in the repo that resume on their own:
``coordinator events --follow`` and the chaos runner's Follower. Each resumes after the position
of the last event it received, so nothing of that revision is lost and nothing repeats.

The break is made in the server so that it falls exactly there: the stream fails UNAVAILABLE as it
is about to send the second event of a revision, which is what a client sees when its replica
dies mid-revision. Neither real break can be aimed at that point: a maximum age ends a stream
only between watch batches, and etcd never splits a revision across batches; a kill lands
wherever it lands.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from chaos.follower import Follower
from coordinator import lifeline
from coordinator.domain.positions import EventPosition
from coordinator.errors import StoreUnavailable
from coordinator.sdk import PRINCIPAL_METADATA
from coordinator.server.identity import CURRENT_IDENTITY
from coordinator.server.wire import event_wire
from coordinator.store import EventFilter, Store, StoredEvent
from coordinator.v1 import tasks_pb2
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.lifecycle.support import create, create_concurrently

CLI, FOLLOWER = "cli-reader", "chaos-follower"
TIMEOUT = 30.0


def _break_inside_shared_revisions(monkeypatch: pytest.MonkeyPatch) -> dict[str, EventPosition]:
    """Break each principal's stream once, UNAVAILABLE, as it is about to send the second event
    of a revision; returns, by principal, the position of the last event sent before."""
    real = event_wire.event_to_proto
    broken_after: dict[str, EventPosition] = {}
    sent: dict[str, StoredEvent] = {}
    lock = threading.Lock()

    def sending(event: StoredEvent) -> tasks_pb2.TaskEvent:
        identity = CURRENT_IDENTITY.get()
        who = identity.principal if identity is not None else ""
        with lock:
            before = sent.get(who)
            if who not in broken_after and before is not None and before.revision == event.revision:
                broken_after[who] = before.position
                raise StoreUnavailable("the replica went away mid-revision (injected by the test)")
            sent[who] = event
        return real(event)

    monkeypatch.setattr(event_wire, "event_to_proto", sending)
    return broken_after


class _Cli:
    """``coordinator events --follow --json`` on the burst queue, its lines read as they come."""

    def __init__(self, target: str) -> None:
        command = "from coordinator.cli import main; main()"
        args = ["events", "--follow", "--json", "--queue", "burst", "--target", target]
        self._process = subprocess.Popen(
            [sys.executable, "-c", command, *args, "--insecure", "--principal", CLI],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lifeline.kill_with_parent(self._process.pid)  # dies with this test run
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        assert self._process.stdout is not None and self._process.stderr is not None
        for stream, lines in ((self._process.stdout, self.out), (self._process.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, lines), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, lines: queue.Queue[str]) -> None:
        for line in stream:
            lines.put(line)

    def position(self) -> EventPosition:
        """The position of the next event it prints."""
        p = json.loads(self.out.get(timeout=TIMEOUT))["position"]
        return EventPosition(p["revision"], p["task_id"], p["prev_state_version"])

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


@pytest.fixture
def cli(server: str) -> Iterator[_Cli]:
    started = _Cli(server)
    try:
        yield started
    finally:
        started.stop()


def _log(store: Store) -> list[EventPosition]:
    return [e.position for e in store.events.history(EventFilter(queue="burst"))]


def _first_of_a_shared_revision(position: EventPosition, log: list[EventPosition]) -> bool:
    at = log.index(position)
    starts = at == 0 or log[at - 1].revision != position.revision
    return starts and at + 1 < len(log) and log[at + 1].revision == position.revision


def test_a_stream_broken_inside_a_shared_revision_resumes_losing_and_repeating_nothing(
    store: Store, server: str, cli: _Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_after = _break_inside_shared_revisions(monkeypatch)
    create(store, "marker", queue="burst")
    follower = Follower(
        lambda: grpc.insecure_channel(server, options=GRPC_OPTIONS),
        "burst",
        ((PRINCIPAL_METADATA, FOLLOWER),),
    ).start()
    try:
        printed = [cli.position()]
        eventually(lambda: follower.last() == printed[0], message="the follower got nothing")
        create_concurrently(store, [f"t{i:03}" for i in range(160)])
        whole = _log(store)
        while printed[-1] != whole[-1]:
            printed.append(cli.position())
        eventually(lambda: follower.last() == whole[-1], timeout=TIMEOUT)
        # One more, written after all of them: the next event each prints is it, no repeat.
        create(store, "after", queue="burst")
        whole = _log(store)
        printed.append(cli.position())
        eventually(lambda: follower.last() == whole[-1], timeout=TIMEOUT)
    finally:
        follower.stop()
    assert printed == whole  # every event, once, in position order
    assert [w.position for w in follower.received] == whole
    # Both streams really broke right after the first event of a shared revision.
    assert set(broken_after) == {CLI, FOLLOWER}
    for position in broken_after.values():
        assert _first_of_a_shared_revision(position, whole), position
    broke = cli.err.get(timeout=TIMEOUT)
    assert broke.startswith("# stream broke (the replica went away mid-revision")
    assert broke.rstrip().endswith(f"resuming after {broken_after[CLI]}")
    assert follower.breaks == {"UNAVAILABLE": 1}
