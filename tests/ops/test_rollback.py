"""The seed's safe rollback, end to end over gRPC with tokens and the operator CLI: pause
claims, bump the epoch, every old-epoch call refused, drain (timing out while the old pool still
holds leases, then reaching zero after --revoke-leases), resume for the new pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.cli.drain import RESUME_HINT
from coordinator.domain.digests import digest_of
from coordinator.store import Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.auth.conftest import TokenRing
from tests.helpers import eventually
from tests.store.support import claim, create

EPOCH_CHANGED = (types_pb2.OUTCOME_FENCED, types_pb2.FENCE_REASON_EPOCH_CHANGED)
RESULT = b"old pool's result"


def _said(result: Result) -> list[str]:
    """What the verb printed (the in-process server's log lines share stdout here)."""
    return [line for line in result.output.splitlines() if not line.startswith("20")]


def _cli(target: str, token: str, *args: str) -> Result:
    env = {"COORDINATOR_TARGET": target, "COORDINATOR_TOKEN": token, "COORDINATOR_INSECURE": ""}
    return CliRunner().invoke(main, list(args), env=env, terminal_width=200)


def test_pause_bump_refuse_old_epoch_drain_and_resume(
    secured: str, ring: TokenRing, channel: grpc.Channel, keyspace: Callable[[], tuple[int, int]]
) -> None:
    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    old, new, pm = ring.metadata("worker-a"), ring.metadata("worker-b"), ring.metadata("pm-1")
    admin_token = ring.tokens["admin-1"]
    for task_id in ("t-1", "t-2", "t-3"):
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=task_id, input=b"in"), metadata=pm)

    # The old pool holds two tasks at epoch 1 and has staged a result for one.
    fences = {}
    for task_id in ("t-1", "t-2"):
        claim = worker.Claim(
            worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=1, ttl_seconds=60),
            metadata=old,
        )
        assert claim.outcome == types_pb2.OUTCOME_CLAIMED
        fences[task_id] = claim.fence
    staged = worker.StageResult(
        worker_pb2.StageResultRequest(
            fence=fences["t-1"], result_digest=digest_of(RESULT), result=RESULT
        ),
        metadata=old,
    )
    assert staged.outcome == types_pb2.OUTCOME_OK

    # 1. Stop new claims.
    paused = _cli(secured, admin_token, "claims", "pause", "--reason", "rollback")
    assert (paused.exit_code, _said(paused)) == (0, ["claims paused (rollback)"])
    refused = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-3", scheduler_epoch=1, ttl_seconds=60), metadata=new
    )
    assert refused.outcome == types_pb2.OUTCOME_CLAIMS_PAUSED

    # 2. Raise the epoch.
    bumped = _cli(secured, admin_token, "epoch", "bump", "--expected", "1")
    assert (bumped.exit_code, _said(bumped)) == (0, ["epoch bumped to 2"])
    shown = _cli(secured, admin_token, "epoch", "show")
    assert _said(shown) == ["epoch 2", "claims paused"]

    # 3. Every old-epoch call is refused, and none writes anything.
    before = keyspace()
    fence = fences["t-1"]
    outcomes: dict[str, Any] = {
        "renew": worker.Renew(worker_pb2.RenewRequest(fence=fence), metadata=old),
        "authorize": worker.AuthorizeTool(
            worker_pb2.AuthorizeToolRequest(fence=fence, tool="mail", action="send"),
            metadata=old,
        ),
        "commit": worker.Commit(
            worker_pb2.CommitRequest(
                fence=fence,
                input_digest=digest_of(b"in"),
                result_digest=digest_of(RESULT),
                result=RESULT,
            ),
            metadata=old,
        ),
    }
    assert {k: (v.outcome, v.reason) for k, v in outcomes.items()} == dict.fromkeys(
        outcomes, EPOCH_CHANGED
    )
    assert keyspace() == before

    # 4. Drain: the old pool's leases are still alive, so a short drain times out, listing them.
    stuck = _cli(secured, admin_token, "drain", "--timeout", "0.3", "--interval", "0.1")
    assert stuck.exit_code == 1, stuck.output
    assert "not drained after 0s: active leases 2, staged, uncommitted 1" in stuck.output
    assert "still claimed: t-1 by worker-a" in stuck.output
    assert "still claimed: t-2 by worker-a" in stuck.output

    # Ending the old claims now instead of waiting out their TTLs.
    revoked = _cli(secured, admin_token, "epoch", "bump", "--revoke-leases")
    assert (revoked.exit_code, _said(revoked)) == (0, ["epoch bumped to 3; revoked 2 lease(s)"])
    drained = _cli(secured, admin_token, "drain", "--timeout", "10", "--interval", "0.1")
    assert drained.exit_code == 0, drained.output
    assert "drained at epoch 3: safe to switch pools" in drained.output
    status = admin.DrainStatus(admin_pb2.DrainStatusRequest(), metadata=pm)
    assert (status.active_leases, status.staged_uncommitted, status.unknown_effects) == (0, 0, 0)
    assert status.drained and status.claims_paused

    # The reclaimer returns the revoked tasks to READY.
    def states() -> set[int]:
        return {
            tasks.GetTask(tasks_pb2.GetTaskRequest(task_id=t), metadata=pm).task.state
            for t in ("t-1", "t-2")
        }

    eventually(lambda: states() == {types_pb2.TASK_STATE_READY})

    # 5. Switch pools: resume. An old binary still at epoch 1 is refused; the new pool claims.
    resumed = _cli(secured, admin_token, "claims", "resume")
    assert (resumed.exit_code, _said(resumed)) == (0, ["claims resumed"])
    stale = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=60), metadata=old
    )
    assert (stale.outcome, stale.reason) == EPOCH_CHANGED
    fresh = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=3, ttl_seconds=60), metadata=new
    )
    assert fresh.outcome == types_pb2.OUTCOME_CLAIMED
    assert fresh.fence.claim_generation > fence.claim_generation
    late = worker.Commit(
        worker_pb2.CommitRequest(
            fence=fence,
            input_digest=digest_of(b"in"),
            result_digest=digest_of(RESULT),
            result=RESULT,
        ),
        metadata=old,
    )
    assert late.outcome == types_pb2.OUTCOME_FENCED


def test_rollback_verbs_need_the_admin_role_and_credentials(secured: str, ring: TokenRing) -> None:
    denied = _cli(secured, ring.tokens["worker-a"], "claims", "pause")
    assert denied.exit_code == 1
    assert "PERMISSION_DENIED" in denied.output and "allowed roles: admin" in denied.output
    unknown = _cli(secured, "not-a-token", "epoch", "show")
    assert unknown.exit_code == 1 and "UNAUTHENTICATED" in unknown.output
    shown = _cli(secured, ring.tokens["worker-a"], "epoch", "show")  # any role may read it
    assert shown.exit_code == 0 and _said(shown) == ["epoch 1", "claims accepted"]
    none = CliRunner().invoke(
        main,
        ["epoch", "show", "--target", secured],
        env={"COORDINATOR_TOKEN": "", "COORDINATOR_INSECURE": ""},
    )
    assert none.exit_code == 2 and "no credentials" in none.output


def test_revoke_leases_spares_claims_made_after_the_bump(store: Store) -> None:
    create(store, "old")
    create(store, "new")
    claim(store, "old", epoch=1)
    _, bumped_at = store.admin._bump(0)
    claim(store, "new", epoch=2)
    assert store.admin.revoke_leases(before_revision=bumped_at) == 1
    assert store.admin.drain_status().active_leases == 1
    assert store.admin.revoke_leases(before_revision=bumped_at) == 0


def test_drain_pauses_or_keeps_the_operators_pause_and_says_how_to_resume(
    secured: str, ring: TokenRing
) -> None:
    admin_token = ring.tokens["admin-1"]
    first = _cli(secured, admin_token, "drain", "--timeout", "5", "--interval", "0.1")
    assert first.exit_code == 0, first.output
    assert "already paused" not in first.output  # drain paused them itself
    assert first.output.rstrip().endswith(RESUME_HINT)
    again = _cli(secured, admin_token, "drain", "--timeout", "5", "--interval", "0.1")
    assert again.exit_code == 0, again.output
    assert "claims were already paused: their pause and its reason are kept" in again.output
    assert again.output.rstrip().endswith(RESUME_HINT)


def _pause_reason(store: Store, queue: str = "") -> bytes | None:
    """The reason stored with the global pause (or ``queue``'s); None when not paused."""
    keys = store.ctx.keys
    kept = store.ctx.kv.get(keys.queue_paused(queue) if queue else keys.claims_paused)
    return None if kept is None else kept.value


def test_drain_keeps_the_reason_the_operator_paused_with(
    secured: str, ring: TokenRing, store: Store
) -> None:
    admin_token = ring.tokens["admin-1"]
    paused = _cli(secured, admin_token, "claims", "pause", "--reason", "db migration")
    assert paused.exit_code == 0, paused.output
    drained = _cli(secured, admin_token, "drain", "--timeout", "5", "--interval", "0.1")
    assert drained.exit_code == 0, drained.output
    assert _pause_reason(store) == b"db migration"  # not drain's own "drain"
    assert "claims were already paused: their pause and its reason are kept" in drained.output
    assert drained.output.rstrip().endswith(RESUME_HINT)  # `coordinator claims resume`

    # One queue the same way: its pause and reason stay, and the hint names that queue.
    _cli(secured, admin_token, "claims", "resume")
    pause = ("claims", "pause", "--queue", "emails", "--reason", "bad template")
    assert _cli(secured, admin_token, *pause).exit_code == 0
    drain = ("drain", "--queue", "emails", "--timeout", "5", "--interval", "0.1")
    drained = _cli(secured, admin_token, *drain)
    assert drained.exit_code == 0, drained.output
    assert (_pause_reason(store), _pause_reason(store, "emails")) == (None, b"bad template")
    assert "claims of queue emails were already paused: that pause is kept" in drained.output
    assert drained.output.rstrip().endswith(
        "`coordinator claims resume --queue emails` lets workers claim them again"
    )
