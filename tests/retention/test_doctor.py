"""doctor and retention: a pruned keyspace is consistent; a half-done prune's records are
reported and deleted only with --repair-pruned; a terminal task outside the prune index is
scheduled by --repair."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.clock import ManualClock
from coordinator.domain.effects import EffectState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import Store, TaskSpec
from coordinator.store.retention.history_read import read_histories
from coordinator.store.retention.prune_ops import prune_txn
from tests.retention.conftest import RETENTION
from tests.retention.test_pruner import PAST, effect, finish, keys_naming, tombstone_keys
from tests.store.support import claim, commit, create, snapshot


def doctor(etcd: EtcdProcess, prefix: str, *args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(
        main,
        ["doctor", "--etcd", etcd.endpoint, "--prefix", prefix, "--json", *args],
        env={"COORDINATOR_ETCD": "", "COORDINATOR_PREFIX": ""},
    )
    return result, json.loads(result.output.splitlines()[-1])


def problems(report: dict[str, Any]) -> list[str]:
    return sorted(f["problem"] for f in report["findings"])


def test_a_pruned_keyspace_with_dependents_and_tombstones_is_consistent(
    make_store: Any, clock: ManualClock, etcd: EtcdProcess, prefix: str, etcd_client: Any
) -> None:
    store = make_store()
    finish(store, "up")
    store.tasks.create(TaskSpec(task_id="down", input=b"i", depends_on=("up",)), by="pm")
    store.tasks.create(TaskSpec(task_id="later", input=b"i", depends_on=("up",)), by="pm")
    commit(store, claim(store, "down"))
    clock.advance(PAST)
    assert store.pruner is not None
    assert store.pruner.run_pass().pruned == 2  # up and down; "later" is READY

    result, report = doctor(etcd, prefix)
    assert (result.exit_code, report["findings"]) == (0, []), result.output
    left = keys_naming(store, etcd_client, "down")  # its edge to up went with it
    assert left == tombstone_keys(store, etcd_client, "down") and len(left) == 2, left


def half_pruned(store: Store) -> str:
    """A task with more effects than one txn holds, stopped after its prune txn."""
    create(store, "big")
    fence = claim(store, "big")
    for slot in range(80):
        effect(store, fence, f"s{slot}", EffectState.COMMITTED)
    commit(store, fence)
    (history,) = list(read_histories(store.ctx, ["big"]))
    due = next(iter(snapshot_due(store)))
    txn = prune_txn(store.ctx, history, due, archive="file:///a", now=store.ctx.clock.now())
    assert txn.pending and store.ctx.kv.txn(txn.compares, txn.ops).succeeded
    return "big"


def snapshot_due(store: Store) -> list[str]:
    kv, keys = store.ctx.kv, store.ctx.keys
    page, _ = kv.range_page(keys.prune_due_prefix, kv.prefix_end(keys.prune_due_prefix))
    return [item.key for item in page]


def test_records_a_half_done_prune_left_are_deleted_only_with_repair_pruned(
    make_store: Any, etcd: EtcdProcess, prefix: str, etcd_client: Any
) -> None:
    store = make_store()
    half_pruned(store)
    keys = store.ctx.keys
    left = [k for k in snapshot(store, etcd_client) if k.startswith(keys.effects_prefix)]
    assert left, "the test needs leftovers"

    result, report = doctor(etcd, prefix, "--repair")
    assert result.exit_code == 1
    assert set(problems(report)) == {"records-of-pruned-task"}
    assert not any(f["repaired"] for f in report["findings"])
    assert "file:///a" in report["findings"][0]["message"]

    result, report = doctor(etcd, prefix, "--repair-pruned")
    assert result.exit_code == 0 and all(f["repaired"] for f in report["findings"])
    assert not any(k.startswith(keys.effects_prefix) for k in snapshot(store, etcd_client))
    left = keys_naming(store, etcd_client, "big")
    assert left == tombstone_keys(store, etcd_client, "big") and len(left) == 2, left
    assert doctor(etcd, prefix)[0].exit_code == 0


def test_a_terminal_task_outside_the_prune_index_is_scheduled_by_repair(
    make_store: Any, clock: ManualClock, etcd: EtcdProcess, prefix: str, etcd_client: Any
) -> None:
    store = make_store()
    finish(store, "old")
    (due,) = snapshot_due(store)
    etcd_client.delete(due)  # as if it finished before retention existed

    result, report = doctor(etcd, prefix, "--repair", "--retention", f"{RETENTION}s")
    assert problems(report) == ["terminal-task-not-in-prune-index"]
    assert result.exit_code == 0 and report["findings"][0]["repaired"]
    clock.advance(PAST)
    assert store.pruner is not None
    assert store.pruner.run_pass().pruned == 1


def test_an_effect_missing_from_its_task_index_is_reported_and_indexed_by_repair(
    make_store: Any, etcd: EtcdProcess, prefix: str, etcd_client: Any
) -> None:
    store = make_store()
    create(store, "t1")
    eid = effect(store, claim(store, "t1"), "s", EffectState.COMMITTED)
    index = store.ctx.keys.task_effect("t1", eid)
    etcd_client.delete(index)  # as if recorded before the per-task index existed

    result, report = doctor(etcd, prefix, "--repair")

    assert problems(report) == ["task-effect-index-missing"]
    assert result.exit_code == 0 and report["findings"][0]["repaired"]
    assert index in snapshot(store, etcd_client)
