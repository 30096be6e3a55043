"""Events: each transition appends exactly one event in its own txn; WatchEvents streams them
from a revision and live; ``coordinator events`` prints them."""

from __future__ import annotations

import itertools
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from click.testing import CliRunner

from coordinator import lifeline
from coordinator.cli import main
from coordinator.domain.states import Op, TaskState
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2
from tests.helpers import cancel, eventually
from tests.lifecycle.support import claim, commit, create, events, finish, who

READ = who("viewer")


def _stream(tasks: tasks_pb2_grpc.TaskServiceStub, **fields: Any) -> list[tasks_pb2.TaskEvent]:
    return list(tasks.WatchEvents(tasks_pb2.WatchEventsRequest(**fields), metadata=READ))


def _name(state: int) -> str:
    return types_pb2.TaskState.Name(state).removeprefix("TASK_STATE_") if state else "-"  # type: ignore[arg-type]


def _lifecycle(store: Store) -> int:
    """up (review) and down (waits on up) through every kind of transition; returns the claim
    generation of up's second attempt."""
    create(store, "up", review=True, thread="export")
    create(store, "down", depends_on=("up",), root="up", parent="up", queue="q")
    finish(store, "up", "w1")
    store.review.reject("up", revision=1, reviewer="pm", reason="no tests")
    fence = claim(store, "up", "w2")
    commit(store, fence, "w2")
    store.review.accept("up", revision=2, reviewer="pm")
    eventually(lambda: store.tasks.get("down").state is TaskState.READY, timeout=5)
    store.tasks.cancel("down", by="pm", reason="not needed")
    return fence.claim_generation


def test_each_transition_appends_exactly_one_event(store: Store, etcd_client: Any) -> None:
    generation = _lifecycle(store)
    up = [(e.op, e.from_state, e.to_state) for e in events(store, etcd_client, "up")]
    s = TaskState
    assert up == [
        (Op.CREATE, None, s.READY),
        (Op.CLAIM, s.READY, s.CLAIMED),
        (Op.COMMIT, s.CLAIMED, s.REVIEW),
        (Op.REJECT, s.REVIEW, s.READY),
        (Op.CLAIM, s.READY, s.CLAIMED),
        (Op.COMMIT, s.CLAIMED, s.REVIEW),
        (Op.ACCEPT, s.REVIEW, s.DONE),
    ]
    down = [(e.op, e.from_state, e.to_state) for e in events(store, etcd_client, "down")]
    assert down == [
        (Op.CREATE_WAITING, None, s.WAITING),
        (Op.UNBLOCK, s.WAITING, s.READY),
        (Op.CANCEL, s.READY, s.CANCELLED),
    ]
    # Each event key is the state_version the transition replaced: the chain has no gap.
    for task_id in ("up", "down"):
        metas = sorted(
            (m for _, m in etcd_client.get_prefix(store.ctx.keys.events_prefix(task_id))),
            key=lambda m: m.key,
        )
        assert int(metas[0].key.decode().rsplit("/", 1)[1]) == 0
        for before, after in itertools.pairwise(metas):
            assert int(after.key.decode().rsplit("/", 1)[1]) == before.create_revision
        assert metas[-1].create_revision == store.tasks.get(task_id).state_version
    accept = events(store, etcd_client, "up")[-1]
    assert (accept.by, accept.claim_generation) == ("pm", generation)


def test_watch_events_streams_every_field_with_its_revision(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    generation = _lifecycle(store)
    streamed = _stream(tasks, task_id="up")
    assert [e.op for e in streamed] == [
        "create",
        "claim",
        "commit",
        "reject",
        "claim",
        "commit",
        "accept",
    ]
    assert [e.revision for e in streamed] == sorted({e.revision for e in streamed})
    second_claim = streamed[4]
    # The claim txn stored generation 0 (it cannot know its own revision): filled on read.
    assert second_claim.claim_generation == second_claim.revision == generation
    assert (second_claim.by, _name(second_claim.from_state), _name(second_claim.to_state)) == (
        "w2",
        "READY",
        "CLAIMED",
    )
    assert second_claim.scheduler_epoch == 1
    assert second_claim.attempt_id.startswith("a2-")
    assert second_claim.at.seconds > 0
    reject = streamed[3]
    assert (reject.detail, reject.prev_state_version) == (
        "rejected revision 1: no tests",
        streamed[2].revision,
    )


def test_watch_events_filters_by_task_root_queue_and_op(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    _lifecycle(store)
    create(store, "elsewhere")
    assert {e.task_id for e in _stream(tasks)} == {"up", "down", "elsewhere"}
    assert {e.task_id for e in _stream(tasks, root_task_id="up")} == {"up", "down"}
    assert [e.op for e in _stream(tasks, queue="q")] == ["create_waiting", "unblock", "cancel"]
    claims = _stream(tasks, ops=["claim", "accept"])
    assert [(e.task_id, e.op) for e in claims] == [
        ("up", "claim"),
        ("up", "claim"),
        ("up", "accept"),
    ]


def test_watch_events_resumes_from_a_revision_without_gaps_or_repeats(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    _lifecycle(store)
    everything = _stream(tasks)
    cut = everything[4].revision
    assert _stream(tasks, from_revision=cut) == everything[4:]
    assert _stream(tasks, from_revision=everything[-1].revision + 1) == []


def test_watch_events_follows_new_events_live(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    create(store, "before")
    received: queue.Queue[tasks_pb2.TaskEvent] = queue.Queue()
    call = tasks.WatchEvents(tasks_pb2.WatchEventsRequest(follow=True), metadata=READ)

    def pump() -> None:
        try:
            for event in call:
                received.put(event)
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert received.get(timeout=5).task_id == "before"
        create(store, "after")
        claim(store, "after")
        live = [received.get(timeout=5), received.get(timeout=5)]
        assert [(e.task_id, e.op) for e in live] == [("after", "create"), ("after", "claim")]
        assert live[0].revision < live[1].revision
        assert received.empty()
    finally:
        cancel(call)


def test_events_cli_prints_one_line_per_event(store: Store, server: str) -> None:
    create(store, "t")
    fence = claim(store, "t", "w1")
    result = CliRunner().invoke(
        main, ["events", "--task", "t", "--target", server, "--insecure"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert " t -->READY op=create by=pm" in lines[0]
    assert f" t READY->CLAIMED op=claim by=w1 attempt={fence.attempt_id} " in lines[1]
    assert f"gen={fence.claim_generation} epoch=1" in lines[1]
    assert lines[1].split()[0] == str(fence.claim_generation)


def _lines(process: subprocess.Popen[str]) -> Iterator[str]:
    assert process.stdout is not None
    yield from process.stdout


def test_events_cli_follow_prints_events_live(store: Store, server: str) -> None:
    create(store, "first")
    command = "from coordinator.cli import main; main()"
    process = subprocess.Popen(
        [sys.executable, "-c", command, "events", "--follow", "--target", server, "--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lifeline.kill_with_parent(process.pid)  # dies with this test run
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in _lines(process):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert " first -->READY op=create " in lines.get(timeout=20)
        create(store, "second")
        assert " second -->READY op=create " in lines.get(timeout=10)
        assert process.poll() is None  # still following
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_events_follow_against_a_wrong_address_says_why_it_cannot_follow() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    command = "from coordinator.cli import main; main()"
    args = ["events", "--follow", "--target", f"127.0.0.1:{port}", "--insecure"]
    process = subprocess.Popen(
        [sys.executable, "-c", command, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lifeline.kill_with_parent(process.pid)  # dies with this test run
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.startswith("# stream broke (failed to connect to all addresses"), line
        assert "Connection refused" in line and line.rstrip().endswith("resuming from revision 0")
    finally:
        process.terminate()
        process.wait(timeout=10)
