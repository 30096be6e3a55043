"""``coordinator doctor``: each inconsistency is made by writing raw keys; doctor must name it,
exit 1, and ``--repair`` must fix exactly the unambiguous ones (each printed)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.cli.doctor import apply_repair, diagnose
from coordinator.doctor import Guard, Problem, Repair, RepairWrite
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.records import ResultRecord, TaskRecord, decode, encode
from coordinator.domain.states import AttemptEnd, Outcome, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import Store, TaskSpec
from tests.helpers import eventually
from tests.lifecycle.conftest import StoreFactory
from tests.lifecycle.support import claim, create, finish


class Doctor:
    """Runs ``coordinator doctor`` on this test's keyspace."""

    def __init__(self, etcd: EtcdProcess, store: Store) -> None:
        self.etcd = etcd
        self.store = store

    def run(self, *args: str, window: str = "0") -> Result:
        argv = ["doctor", "--etcd", self.etcd.endpoint, "--prefix", self.store.ctx.keys.prefix]
        return CliRunner().invoke(main, [*argv, "--reclaim-window", window, *args])

    def problems(self, *args: str, window: str = "0") -> list[tuple[str, str, bool]]:
        result = self.run("--json", *args, window=window)
        report = json.loads(result.output)
        assert result.exit_code == (0 if report["consistent"] else 1), result.output
        return [(f["problem"], f["task_id"], f["repair"] is not None) for f in report["findings"]]


@pytest.fixture
def doctor(etcd: EtcdProcess, store: Store) -> Doctor:
    store.reclaimer.close()  # the faults below must stay put until doctor looks
    store.releaser.close()
    return Doctor(etcd, store)


def _record(etcd_client: Any, store: Store, task_id: str) -> TaskRecord:
    return decode(TaskRecord, etcd_client.get(store.ctx.keys.task(task_id))[0])


def test_a_consistent_keyspace_exits_zero(doctor: Doctor, store: Store) -> None:
    create(store, "root", review=True)
    create(store, "child", root="root", parent="root", depends_on=("root",))
    finish(store, "root")
    store.review.reject("root", revision=1, reviewer="pm", reason="again")
    claim(store, "root", "w2")
    result = doctor.run()
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"doctor: keyspace {store.ctx.keys.prefix} is consistent")


def test_a_ready_task_missing_from_the_ready_index(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    task = create(store, "t")
    key = store.ctx.keys.ready(task.queue, task.priority, task.ready_seq, "t")
    etcd_client.delete(key)
    assert doctor.problems() == [(Problem.READY_KEY_MISSING.value, "t", True)]
    result = doctor.run("--repair")
    assert result.exit_code == 0, result.output
    assert f"  repaired: add ready key {key}" in result.output
    assert etcd_client.get(key)[1] is not None
    assert doctor.problems() == []


def test_a_task_in_two_places_ready_key_of_a_claimed_task(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    create(store, "t")
    claim(store, "t")
    stale = store.ctx.keys.ready("default", 0, 7, "t")
    etcd_client.put(stale, b"")
    result = doctor.run()
    assert result.exit_code == 1
    assert "CLAIMED but also listed in the ready index (in two places)" in result.output
    assert doctor.run("--repair").exit_code == 0
    assert etcd_client.get(stale)[1] is None


def test_a_task_in_two_places_live_claim_on_a_ready_record_is_not_guessed(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    create(store, "t")
    claim(store, "t")
    record = _record(etcd_client, store, "t")
    etcd_client.put(store.ctx.keys.task("t"), encode(replace(record, state=TaskState.READY)))
    found = doctor.problems()
    assert (Problem.TASK_IN_TWO_PLACES.value, "t", False) in found
    assert (Problem.EVENT_CHAIN_BROKEN.value, "t", False) in found
    # Its derived keys are not "fixed" either: which side is true is for a person to decide.
    assert all(not repairable for _, _, repairable in found)
    result = doctor.run("--repair")
    assert result.exit_code == 1
    assert "  repaired: " not in result.output
    assert sorted(doctor.problems()) == sorted(found)


def test_a_claimed_task_whose_claim_key_is_gone_beyond_the_reclaim_window(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    create(store, "t")
    claim(store, "t")
    etcd_client.revoke_lease(etcd_client.get(store.ctx.keys.claim("t"))[1].lease_id)
    assert doctor.problems(window="0.3") == [(Problem.CLAIM_EXPIRED_UNRECLAIMED.value, "t", False)]


def test_an_expired_claim_reclaimed_within_the_window_is_not_reported(
    doctor: Doctor, store: Store, make_store: StoreFactory, etcd_client: Any
) -> None:
    create(store, "t")
    claim(store, "t")
    reclaimer = make_store(scan_interval=1.0)  # a replica that does its job
    reclaimer.reclaimer.close()  # ... but only when the test says so
    etcd_client.revoke_lease(etcd_client.get(store.ctx.keys.claim("t"))[1].lease_id)

    def reclaim_within_the_window(seconds: float) -> None:
        reclaimer.reclaimer.scan()

    findings, _ = diagnose(
        reclaimer.ctx.kv, store.ctx.keys, reclaim_window=0.1, sleep=reclaim_within_the_window
    )
    assert findings == []
    assert store.tasks.get("t").state is TaskState.READY


def test_a_done_task_without_its_result(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    create(store, "t")
    finish(store, "t")
    etcd_client.delete(store.ctx.keys.result("t", 1))
    assert doctor.problems("--repair") == [(Problem.RESULT_MISSING.value, "t", False)]


def test_a_result_without_done_or_review(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    create(store, "t")
    forged = ResultRecord("t", 1, "a1-x", 5, 1, "w1", "sha256:" + "0" * 64, 1.0)
    etcd_client.put(store.ctx.keys.result("t", 1), encode(forged))
    assert doctor.problems() == [(Problem.RESULT_UNEXPECTED.value, "t", False)]


def test_a_broken_event_chain(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    create(store, "t")
    claim(store, "t")
    chain = etcd_client.get_prefix(store.ctx.keys.events_prefix("t"))
    etcd_client.delete(sorted(m.key.decode() for _, m in chain)[-1])  # the claim's event
    result = doctor.run()
    assert result.exit_code == 1
    assert "event-chain-broken: event log of t (CLAIMED) disagrees" in result.output
    assert "a transition without its event" in result.output


def test_dangling_and_inconsistent_dependency_edges(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    create(store, "up")
    create(store, "down", depends_on=("up",))
    create(store, "other")
    etcd_client.delete(keys.dependent("up", "down"))  # reverse edge missing
    etcd_client.put(keys.dependent("other", "down"), b"")  # reverse edge without forward edge
    record = _record(etcd_client, store, "up")
    for _, meta in etcd_client.get_prefix(keys.events_prefix("up")):
        etcd_client.delete(meta.key)
    etcd_client.delete(keys.task("up"))  # down now depends on a task that does not exist
    etcd_client.delete(keys.input("up"))
    etcd_client.delete(keys.ready(record.queue, record.priority, record.ready_seq, "up"))
    for kind, value in (("root", "up"), ("thread", "up")):
        etcd_client.delete(keys.by_identity(kind, value, "up"))
    assert sorted(doctor.problems()) == [
        (Problem.DEPENDENCY_DANGLING.value, "down", False),
        (Problem.REVERSE_EDGE_MISSING.value, "down", True),
        (Problem.REVERSE_EDGE_ORPHAN.value, "down", True),
    ]
    result = doctor.run("--repair")
    assert result.exit_code == 1  # the dangling edge stays: only a person can say what to do
    assert result.output.count("  repaired: ") == 2
    assert doctor.problems() == [(Problem.DEPENDENCY_DANGLING.value, "down", False)]


@pytest.mark.parametrize("state", [TaskState.CLAIMED, TaskState.WAITING], ids=lambda s: s.name)
def test_state_indexes_missing_and_orphaned(
    state: TaskState, doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    create(store, "up")
    create(store, "ready")
    if state is TaskState.CLAIMED:
        create(store, "t")
        claim(store, "t")
        index, orphan_for, problem = keys.claimed, "ready", "claimed-index"
    else:
        create(store, "t", depends_on=("up",))
        index, orphan_for, problem = keys.waiting, "ready", "waiting-index"
    etcd_client.delete(index("t"))
    etcd_client.put(index(orphan_for), b"")
    etcd_client.put(index("ghost"), b"")
    assert sorted(doctor.problems()) == [
        (f"{problem}-missing", "t", True),
        (f"{problem}-orphan", "ghost", True),
        (f"{problem}-orphan", orphan_for, True),
    ]
    assert doctor.run("--repair").exit_code == 0
    assert doctor.problems() == []


def test_lineage_index_missing_and_orphaned(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    keys = store.ctx.keys
    create(store, "root")
    create(store, "child", root="root", parent="root")
    etcd_client.delete(keys.by_identity("parent", "root", "child"))
    etcd_client.put(keys.by_identity("thread", "elsewhere", "child"), b"")
    assert sorted(doctor.problems()) == [
        (Problem.IDENTITY_INDEX_MISSING.value, "child", True),
        (Problem.IDENTITY_INDEX_ORPHAN.value, "child", True),
    ]
    assert doctor.run("--repair").exit_code == 0
    assert [t.task_id for t in store.tasks.list(parent="root")[0]] == ["child"]


def test_repair_fixes_only_the_unambiguous_and_prints_each(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    ready = create(store, "a")
    create(store, "b")
    finish(store, "b")
    etcd_client.delete(keys.ready(ready.queue, ready.priority, ready.ready_seq, "a"))  # fixable
    etcd_client.put(keys.ready("default", 0, 1, "ghost"), b"")  # fixable
    etcd_client.delete(keys.result("b", 1))  # ambiguous
    result = doctor.run("--repair")
    assert result.exit_code == 1
    assert result.output.count("  repaired: ") == 2
    assert "result-missing: task b is DONE but revision 1 has no canonical result" in result.output
    assert "  not repaired: ambiguous, needs a person" in result.output
    assert doctor.problems() == [(Problem.RESULT_MISSING.value, "b", False)]


def test_a_repair_is_skipped_when_its_keys_changed_since_the_snapshot(
    store: Store, etcd_client: Any
) -> None:
    key = store.ctx.keys.ready("default", 0, 1, "ghost")
    etcd_client.put(key, b"")
    revision = etcd_client.get(key)[1].mod_revision
    etcd_client.put(key, b"")  # changed after "the snapshot"
    repair = Repair("delete", (Guard(key, revision),), (RepairWrite(key, None),))
    assert apply_repair(store.ctx.kv, repair) is False
    assert etcd_client.get(key)[1] is not None


def test_doctor_exits_one_and_names_the_problem_in_text(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    task = create(store, "t")
    etcd_client.delete(store.ctx.keys.ready(task.queue, task.priority, task.ready_seq, "t"))
    result = doctor.run()
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        "ready-key-missing: task t is READY but missing from the ready index: no worker can "
        "ClaimNext it"
    )
    assert "1 disagreement(s)" in result.output
    eventually(lambda: store.tasks.get("t").state is TaskState.READY)


def test_a_waiting_task_of_a_cancelled_upstream_left_unmarked_beyond_the_window(
    doctor: Doctor, store: Store
) -> None:
    create(store, "up")
    create(store, "down", depends_on=("up",))
    store.tasks.cancel("up", by="pm", reason="dropped")  # the releaser is closed: no mark
    assert doctor.problems(window="0.3") == [(Problem.BLOCKED_MARK_OVERDUE.value, "down", False)]
    assert "marked blocked by () but its FAILED or CANCELLED upstreams are (up)" in (
        doctor.run().output
    )
    store.releaser.scan()  # a replica comes back and does its job
    assert doctor.problems() == []
    assert store.tasks.get("down").blocked_by == ("up",)


def test_the_blocked_and_overdue_mark_indexes_are_checked_against_the_record(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    create(store, "up")
    create(store, "down", depends_on=("up",))
    create(store, "other")
    store.tasks.cancel("up", by="pm", reason="dropped")
    store.releaser.scan()  # marks "down" blocked (the watch is closed)
    keys = store.ctx.keys
    assert etcd_client.get(keys.blocked("down"))[0] == b"default"
    assert doctor.problems() == []
    etcd_client.delete(keys.blocked("down"))
    etcd_client.put(keys.overdue("other"), b"default")  # READY: never overdue
    etcd_client.put(keys.overdue("ghost"), b"default")
    assert doctor.problems() == [
        (Problem.BLOCKED_INDEX_MISSING.value, "down", True),
        (Problem.OVERDUE_INDEX_ORPHAN.value, "other", True),
        (Problem.OVERDUE_INDEX_ORPHAN.value, "ghost", True),  # of a task that does not exist
    ]
    assert doctor.run("--repair").exit_code == 0
    assert doctor.problems() == []
    assert etcd_client.get(keys.blocked("down"))[0] == b"default"
    assert etcd_client.get(keys.overdue("other"))[0] is None


def test_effect_indexes_missing_and_orphaned_are_repaired_from_the_effect_record(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    create(store, "t")
    fence = claim(store, "t")
    prepared = store.effects.prepare(
        fence, principal="w1", node_id="n", effect_slot="mail", payload_digest=digest_of(b"x")
    )
    assert prepared.effect is not None
    eid = prepared.effect.effect_id
    recorded = store.effects.record(
        fence, principal="w1", effect_id=eid, state=EffectState.UNKNOWN, external_ref="", etag=""
    )
    assert recorded.verdict.outcome is Outcome.OK
    reconcile_value = etcd_client.get(keys.reconcile("t", eid))[0]
    assert reconcile_value is not None and doctor.problems() == []
    etcd_client.delete(keys.open_effect("t", eid))
    etcd_client.delete(keys.reconcile("t", eid))
    etcd_client.put(keys.open_effect("t", "eff-gone"), b"")  # names no effect
    etcd_client.put(keys.reconcile("t", "eff-gone"), reconcile_value)
    assert sorted(doctor.problems()) == [
        (Problem.OPEN_EFFECT_INDEX_MISSING.value, "t", True),
        (Problem.OPEN_EFFECT_INDEX_ORPHAN.value, "t", True),
        (Problem.RECONCILE_INDEX_MISSING.value, "t", True),
        (Problem.RECONCILE_INDEX_ORPHAN.value, "t", True),
    ]
    result = doctor.run("--repair")
    assert result.exit_code == 0, result.output
    assert result.output.count("  repaired: ") == 4
    assert doctor.problems() == []
    assert etcd_client.get(keys.reconcile("t", eid))[0] == reconcile_value
    assert etcd_client.get(keys.open_effect("t", "eff-gone"))[0] is None


def _delayed(store: Store, task_id: str, *, deadline: float = 0.0) -> TaskRecord:
    """A task DELAYED an hour (the promoter leaves it alone), with a deadline if given."""
    spec = TaskSpec(
        task_id=task_id,
        input=b"later",
        not_before=store.ctx.clock.now() + 3600,
        schedule_to_close=deadline,
    )
    task = store.tasks.create(spec, by="pm")
    assert task.state is TaskState.DELAYED
    return task


def test_a_delayed_task_without_its_delayed_key_or_with_one_at_another_time(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    lost, moved = _delayed(store, "lost"), _delayed(store, "moved")
    etcd_client.delete(keys.delayed(lost.not_before, "lost"))
    wrong = keys.delayed(moved.not_before + 60, "moved")  # due a minute late
    etcd_client.delete(keys.delayed(moved.not_before, "moved"))
    etcd_client.put(wrong, b"")
    assert doctor.problems() == [
        (Problem.DELAYED_KEY_MISSING.value, "lost", True),
        (Problem.DELAYED_KEY_MISMATCH.value, "moved", True),
    ]
    result = doctor.run("--repair")
    assert result.exit_code == 0, result.output
    assert "the promoter never makes it READY" in result.output
    assert f"  repaired: add delayed key {keys.delayed(lost.not_before, 'lost')}" in result.output
    assert f"  repaired: move its delayed key to {keys.delayed(moved.not_before, 'moved')}" in (
        result.output
    )
    assert etcd_client.get(wrong)[1] is None
    assert sorted(m.key.decode() for _, m in etcd_client.get_prefix(keys.delayed_prefix)) == [
        keys.delayed(lost.not_before, "lost"),
        keys.delayed(moved.not_before, "moved"),
    ]
    assert doctor.problems() == []


def test_delayed_keys_of_a_task_not_delayed_or_missing_are_orphans(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    keys = store.ctx.keys
    create(store, "ready")
    stray, ghost = keys.delayed(1.0, "ready"), keys.delayed(2.0, "ghost")
    etcd_client.put(stray, b"")
    etcd_client.put(ghost, b"")
    assert doctor.problems() == [
        (Problem.DELAYED_KEY_ORPHAN.value, "ready", True),
        (Problem.DELAYED_KEY_ORPHAN.value, "ghost", True),
    ]
    result = doctor.run("--repair")
    assert result.exit_code == 0, result.output
    assert f"task ready is READY yet has a delayed key {stray}" in result.output
    assert f"delayed key {ghost} names task ghost, which does not exist" in result.output
    assert result.output.count("  repaired: delete delayed key ") == 2
    assert not list(etcd_client.get_prefix(keys.delayed_prefix))
    assert doctor.problems() == []


def test_deadline_keys_missing_and_orphaned(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    keys = store.ctx.keys
    awaiting = _delayed(store, "awaiting", deadline=7200)  # DELAYED still awaits a result
    done = store.tasks.create(TaskSpec(task_id="done", input=b"x", schedule_to_close=7200), by="pm")
    finish(store, "done")
    create(store, "plain")  # no deadline
    etcd_client.delete(keys.deadline(awaiting.deadline, "awaiting"))
    terminal = keys.deadline(done.deadline, "done")  # a DONE task awaits no result
    assert etcd_client.get(terminal)[1] is None  # the commit deleted it
    etcd_client.put(terminal, b"")
    undue = keys.deadline(5.0, "plain")
    etcd_client.put(undue, b"")
    assert doctor.problems() == [
        (Problem.DEADLINE_KEY_MISSING.value, "awaiting", True),
        (Problem.DEADLINE_KEY_ORPHAN.value, "done", True),
        (Problem.DEADLINE_KEY_ORPHAN.value, "plain", True),
    ]
    result = doctor.run("--repair")
    assert result.exit_code == 0, result.output
    assert "but has no deadline key" in result.output and "it is never timed out" in result.output
    assert f"task done is DONE, awaiting no result, yet has a deadline key {terminal}" in (
        result.output
    )
    assert f"task plain is READY with no deadline yet has a deadline key {undue}" in result.output
    assert result.output.count("  repaired: ") == 3
    assert [m.key.decode() for _, m in etcd_client.get_prefix(keys.deadlines_prefix)] == [
        keys.deadline(awaiting.deadline, "awaiting")
    ]
    assert doctor.problems() == []


def test_due_index_keys_are_not_repaired_when_the_record_is_in_conflict(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    task = _delayed(store, "t")
    etcd_client.delete(store.ctx.keys.delayed(task.not_before, "t"))
    chain = etcd_client.get_prefix(store.ctx.keys.events_prefix("t"))
    etcd_client.delete(sorted(m.key.decode() for _, m in chain)[-1])  # its only event
    assert doctor.problems() == [
        (Problem.EVENT_CHAIN_BROKEN.value, "t", False),
        (Problem.DELAYED_KEY_MISSING.value, "t", False),
    ]


def test_an_input_key_missing_or_left_over(doctor: Doctor, store: Store, etcd_client: Any) -> None:
    create(store, "lost")
    create(store, "kept")
    assert _record(etcd_client, store, "lost").input_in_key  # schema 2: inputs have own keys
    etcd_client.delete(store.ctx.keys.input("lost"))
    etcd_client.put(store.ctx.keys.input("gone"), b"an input nobody keeps")
    assert doctor.problems("--repair") == [
        (Problem.INPUT_MISSING.value, "lost", False),
        (Problem.ORPHAN_RECORDS.value, "gone", False),
    ]
    assert "task lost keeps its input in a key of its own, which is gone" in doctor.run().output


def test_an_attempt_the_task_record_holds_is_checked_against_its_key_and_state(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    create(store, "t")
    finish(store, "t")  # the committed attempt stays in the task record (schema 3)
    task = _record(etcd_client, store, "t")
    assert task.attempt_in_record and doctor.problems() == []
    # A key that says otherwise than the record that still holds the attempt.
    key = store.ctx.keys.attempt("t", task.attempt_id)
    (committed,) = store.tasks.attempts("t")
    etcd_client.put(key, encode(replace(committed, end=AttemptEnd.RELEASED)))
    result = doctor.run()
    assert result.exit_code == 1
    assert (
        f"attempt {task.attempt_id} of t ended RELEASED by its key but COMMITTED" in result.output
    )
    etcd_client.delete(key)
    # A record that holds its attempt in a state no claim or commit leaves.
    etcd_client.put(store.ctx.keys.task("t"), encode(replace(task, state=TaskState.CANCELLED)))
    found = doctor.run()
    assert f"the record of t holds attempt {task.attempt_id} but the task is CANCELLED" in (
        found.output
    )


def test_a_task_held_for_a_person_is_not_scheduled_for_its_prune(
    doctor: Doctor, store: Store, etcd_client: Any
) -> None:
    """--repair used to schedule the prune of a DONE task whose result is gone (its prune-index
    key gone too): the pruner archived it without its result and the next run said the
    keyspace was consistent. The person goes first."""
    create(store, "t")
    finish(store, "t")
    etcd_client.delete(store.ctx.keys.result("t", 1))
    etcd_client.delete_prefix(store.ctx.keys.prune_due_prefix)
    result = doctor.run("--repair")
    assert result.exit_code == 1
    assert "result-missing: task t is DONE but revision 1 has no canonical result" in result.output
    assert (
        "  not repaired: task t has a finding that needs a person first (its prune would "
        "archive it as it is)"
    ) in result.output
    assert list(etcd_client.get_prefix(store.ctx.keys.prune_due_prefix)) == []
    assert sorted(doctor.problems()) == [
        (Problem.RESULT_MISSING.value, "t", False),
        (Problem.TERMINAL_NOT_SCHEDULED.value, "t", True),
    ]


def test_a_prefix_no_coordinator_ever_served_is_an_error_not_consistent(
    doctor: Doctor, store: Store
) -> None:
    """`doctor --prefix /coordinatr` said "keyspace /coordinatr is consistent" and exited 0."""
    typo = store.ctx.keys.prefix + "x"
    argv = ["doctor", "--etcd", doctor.etcd.endpoint, "--prefix", typo, "--reclaim-window", "0"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1
    assert (
        f"Error: no coordinator has served prefix '{typo}' on {doctor.etcd.endpoint} (it has "
        f"no {typo}/meta/versions record): is --prefix right?"
    ) in " ".join(result.output.split())
