"""``coordinator effects list|show|resolve|approve`` against a running coordinator."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import EffectState
from coordinator.domain.states import Outcome, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import Store, TaskSpec
from tests.reconcile.support import prepare, record, release
from tests.sdk.support import served
from tests.store.support import claim, claim_result


def cli(target: str, *args: str) -> Result:
    remote = ["--target", target, "--insecure", "--principal", "ops"]
    return CliRunner().invoke(main, ["effects", *args, *remote], env={"COORDINATOR_TOKEN": ""})


def unknown(store: Store, task_id: str, *, non_replayable: bool = False) -> str:
    spec = TaskSpec(task_id=task_id, queue="q", input=b"in", non_replayable=non_replayable)
    store.tasks.create(spec, by="pm")
    fence = claim(store, task_id, principal="w1")
    result = prepare(store, fence)
    assert result.effect is not None
    eid = result.effect.effect_id
    record(store, fence, eid, EffectState.UNKNOWN)
    release(store, fence)
    return eid


def test_show_then_resolve_an_unknown_effect(etcd: EtcdProcess, prefix: str) -> None:
    with served(etcd.endpoint, prefix) as coord:
        eid = unknown(coord.store, "t1")
        shown = cli(coord.target, "show", eid)
        assert shown.exit_code == 0, shown.output
        assert "state UNKNOWN" in shown.output
        assert "reconcile_owner w1\n" in shown.output
        assert "reconcile open; escalation NEEDS_APPROVAL" in shown.output

        done = cli(coord.target, "resolve", eid, "--resolution", "absent", "--reason", "log")
        assert done.exit_code == 0, done.output
        assert "state ABSENT" in done.output and "reconcile closed" in done.output
        assert coord.store.effects.get(eid).state is EffectState.ABSENT

        never = effect_id("t1", 1, 1, "notify", "never")
        missing = cli(coord.target, "show", never)
        assert missing.exit_code == 1 and never in missing.output
        bad = cli(coord.target, "resolve", eid, "--resolution", "maybe")
        assert bad.exit_code == 2 and "--resolution" in bad.output


def test_approve_a_task_waiting_for_approval(etcd: EtcdProcess, prefix: str) -> None:
    with served(etcd.endpoint, prefix) as coord:
        eid = unknown(coord.store, "t2", non_replayable=True)
        held = claim_result(coord.store, "t2", principal="w2")
        assert held.verdict.outcome is Outcome.NEEDS_APPROVAL
        approved = cli(coord.target, "approve", "t2", "--resolution", "committed")
        assert approved.exit_code == 0, approved.output
        # (the in-process server logs to the same stdout: its lines come first)
        assert approved.output.splitlines()[-2:] == ["task t2 READY", f"resolved {eid}"]
        assert coord.store.tasks.get("t2").state is TaskState.READY
        again = cli(coord.target, "approve", "t2", "--resolution", "committed")
        assert again.exit_code == 1 and "only a NEEDS_APPROVAL task" in again.output


def test_list_prints_every_effect_or_the_open_ones_and_pages(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as coord:
        open_one = unknown(coord.store, "t1")
        settled = unknown(coord.store, "t2")
        assert cli(coord.target, "resolve", settled, "--resolution", "absent").exit_code == 0
        listed = cli(coord.target, "list")
        assert listed.exit_code == 0, listed.output
        # (the in-process server logs to the same stdout: its lines come first)
        lines = listed.stdout.splitlines()
        start = next(n for n, line in enumerate(lines) if line.startswith("EFFECT"))
        rows = [line.split() for line in lines[start:]]
        assert rows[0] == ["EFFECT", "TASK", "REV", "SLOT", "STATE", "EXTERNAL_REF", "RECONCILE"]
        assert [(r[0], r[1], r[4]) for r in rows[1:]] == [
            (open_one, "t1", "UNKNOWN"),
            (settled, "t2", "ABSENT"),
        ]
        assert rows[1][6:] == ["w1", "(open)"]
        opened = cli(coord.target, "list", "--open", "--json")
        (line,) = [ln for ln in opened.stdout.splitlines() if ln.startswith("{")]
        assert json.loads(line)["effect_id"] == open_one
        cut = cli(coord.target, "list", "--limit", "1")
        assert [ln.split()[0] for ln in cut.stdout.splitlines() if ln.startswith("eff")] == [
            open_one
        ]
        assert cut.stderr.endswith("more effects than --limit 1: raise it or filter by --task\n")
        assert cli(coord.target, "list", "--task", "t3").stderr.endswith("no effects\n")
