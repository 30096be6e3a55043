"""The follower check on handmade streams: a gap, a duplicate, an event out of order, an event
etcd does not hold - each must be reported; a faithful stream passes. Several events share a
revision (group commit, the releaser), so the order is by position, not by revision."""

from __future__ import annotations

from chaos.etcd_history import from_watch_events
from chaos.follow_check import follower_agreement
from chaos.history import EtcdWrite
from coordinator.domain.states import Op, TaskState
from coordinator.v1 import tasks_pb2, types_pb2


def w(revision: int, task: str, prev: int, op: Op = Op.CREATE) -> EtcdWrite:
    return EtcdWrite(task, revision, op, TaskState.READY, prev_state_version=prev)


# Revision 7 holds three events (one group-committed txn): ordered by task, then version.
LOG = [w(5, "a", 0), w(6, "b", 0), w(7, "a", 5), w(7, "b", 6), w(7, "c", 0), w(9, "a", 7)]


def rules(received: list[EtcdWrite]) -> list[tuple[str, str]]:
    return [(v.rule.value, v.task) for v in follower_agreement(received, LOG)]


def test_a_faithful_stream_passes() -> None:
    assert follower_agreement(LOG, LOG) == []


def test_a_gap_is_reported_once_per_run_of_missing_events() -> None:
    # The classic resume bug: "after revision 7" skips the rest of revision 7.
    received = [*LOG[:3], LOG[5]]
    (gap,) = follower_agreement(received, LOG)
    assert (gap.rule.value, gap.task) == ("follower-gap", "")
    assert gap.detail == "2 event(s) of etcd's history never received, from 7/b/6 to 7/c/0"
    assert rules(LOG[:-1]) == [("follower-gap", "a")]  # the stream never caught up


def test_a_duplicate_is_reported() -> None:
    # Resuming "from revision 7" again replays the part of revision 7 already received.
    received = [*LOG[:4], LOG[2], LOG[3], *LOG[4:]]
    assert rules(received) == [("follower-duplicate", "a"), ("follower-duplicate", "b")]


def test_an_event_out_of_order_is_reported() -> None:
    received = [LOG[0], LOG[1], LOG[3], LOG[2], LOG[4], LOG[5]]
    (late,) = follower_agreement(received, LOG)
    assert (late.rule.value, late.task) == ("follower-out-of-order", "a")
    assert late.detail == "7/a/5 received after 7/b/6"


def test_an_event_etcd_does_not_hold_is_reported() -> None:
    assert rules([*LOG[:5], w(8, "z", 0), LOG[5]]) == [("follower-unknown-event", "z")]


def test_watch_events_are_ordered_by_position_within_a_revision() -> None:
    def event(task: str, prev: int) -> tasks_pb2.TaskEvent:
        return tasks_pb2.TaskEvent(
            revision=7,
            task_id=task,
            op="create",
            to_state=types_pb2.TASK_STATE_READY,
            prev_state_version=prev,
        )

    writes = from_watch_events([event("c", 0), event("b", 6), event("a", 5), event("b", 2)])
    assert [(x.task, x.prev_state_version) for x in writes] == [
        ("a", 5),
        ("b", 2),
        ("b", 6),
        ("c", 0),
    ]
