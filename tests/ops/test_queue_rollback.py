"""A rollback of one queue's pool, over gRPC with tokens and the operator CLI: ``claims pause
--queue``, ``drain --queue`` (waiting for that queue only), ``claims resume --queue``; the other
queues claim on throughout."""

from __future__ import annotations

import grpc
from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.cli.drain import resume_hint
from coordinator.domain.digests import digest_of
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


def _said(result: Result) -> list[str]:
    """What the verb printed (the in-process server's log lines share stdout here)."""
    return [line for line in result.output.splitlines() if not line.startswith("20")]


def _cli(target: str, token: str, *args: str) -> Result:
    env = {"COORDINATOR_TARGET": target, "COORDINATOR_TOKEN": token, "COORDINATOR_INSECURE": ""}
    return CliRunner().invoke(main, list(args), env=env, terminal_width=200)


def test_pause_drain_and_resume_one_queue_while_the_other_claims_on(
    secured: str, ring: TokenRing, channel: grpc.Channel
) -> None:
    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    pool, pm = ring.metadata("worker-a"), ring.metadata("pm-1")
    admin_token = ring.tokens["admin-1"]
    for task_id, queue in (("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")):
        tasks.CreateTask(
            tasks_pb2.CreateTaskRequest(task_id=task_id, queue=queue, input=b"in"), metadata=pm
        )

    def claim_next(queue: str) -> worker_pb2.ClaimResponse:
        request = worker_pb2.ClaimNextRequest(queue=queue, scheduler_epoch=1, ttl_seconds=60)
        return worker.ClaimNext(request, metadata=pool)

    held_a, held_b = claim_next("a"), claim_next("b")
    assert (held_a.outcome, held_b.outcome) == (types_pb2.OUTCOME_CLAIMED,) * 2
    running_a = held_a.fence.task_id
    ready_a = "a-2" if running_a == "a-1" else "a-1"

    paused = _cli(secured, admin_token, "claims", "pause", "--queue", "a", "--reason", "v2 bug")
    assert (paused.exit_code, _said(paused)) == (0, ["claims of queue a paused (v2 bug)"])
    shown = _cli(secured, admin_token, "epoch", "show")
    assert _said(shown) == ["epoch 1", "claims accepted", "paused queues: a"]
    by_id = worker.Claim(
        worker_pb2.ClaimRequest(task_id=ready_a, scheduler_epoch=1, ttl_seconds=60), metadata=pool
    )
    assert (by_id.outcome, claim_next("a").outcome, claim_next("b").outcome) == (
        types_pb2.OUTCOME_CLAIMS_PAUSED,
        types_pb2.OUTCOME_CLAIMS_PAUSED,
        types_pb2.OUTCOME_CLAIMED,
    )

    # a's claim still runs: its drain times out naming it, and b's claims are not listed.
    stuck = _cli(secured, admin_token, "drain", "--queue", "a", "--timeout", "0.3")
    assert stuck.exit_code == 1, stuck.output
    assert "claims of queue a were already paused: that pause is kept" in stuck.output
    assert "not drained after 0s: active leases 1" in stuck.output
    assert f"still claimed: {running_a} by worker-a" in stuck.output
    assert "b-1" not in stuck.output and "b-2" not in stuck.output

    # a's claim ends; b's two claims still run, and a drains all the same.
    committed = worker.Commit(
        worker_pb2.CommitRequest(
            fence=held_a.fence,
            input_digest=digest_of(b"in"),
            result_digest=digest_of(b"out"),
            result=b"out",
        ),
        metadata=pool,
    )
    assert committed.outcome == types_pb2.OUTCOME_COMMITTED
    drained = _cli(secured, admin_token, "drain", "--queue", "a", "--timeout", "10")
    assert drained.exit_code == 0, drained.output
    assert "drained at epoch 1: safe to switch queue a" in drained.output
    assert " ".join(drained.output.split()).endswith(resume_hint("a"))  # rich wraps at 80
    of_a = admin.DrainStatus(admin_pb2.DrainStatusRequest(queue="a"), metadata=pm)
    whole = admin.DrainStatus(admin_pb2.DrainStatusRequest(), metadata=pm)
    assert (of_a.queue, of_a.queue_paused, of_a.active_leases, of_a.drained) == ("a", True, 0, True)
    assert (whole.claims_paused, whole.active_leases, whole.drained) == (False, 2, False)

    resumed = _cli(secured, admin_token, "claims", "resume", "--queue", "a")
    assert (resumed.exit_code, _said(resumed)) == (0, ["claims of queue a resumed"])
    assert claim_next("a").outcome == types_pb2.OUTCOME_CLAIMED


def test_a_bad_queue_name_is_refused_and_nothing_is_paused(
    secured: str, ring: TokenRing, channel: grpc.Channel
) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    bad = _cli(secured, ring.tokens["admin-1"], "claims", "pause", "--queue", "a/b")
    assert bad.exit_code == 1
    assert "INVALID_ARGUMENT" in bad.output and "queue must be 1-64 characters" in bad.output
    shown = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("pm-1"))
    assert (shown.claims_paused, list(shown.paused_queues)) == (False, [])
    denied = _cli(secured, ring.tokens["worker-a"], "claims", "pause", "--queue", "a")
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.output


def test_draining_a_queue_no_task_has_is_refused_as_a_misspelling(
    secured: str, ring: TokenRing, channel: grpc.Channel
) -> None:
    """`drain --queue emial` said "drained: safe to switch queue emial" and exited 0 while the
    real queue kept claiming."""
    tasks_pb2_grpc.TaskServiceStub(channel).CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="e-1", queue="email", input=b"in"),
        metadata=ring.metadata("pm-1"),
    )
    admin_token = ring.tokens["admin-1"]
    typo = _cli(secured, admin_token, "drain", "--queue", "emial", "--timeout", "1")
    assert typo.exit_code == 2
    assert (
        "no tasks in queue 'emial'; queues with ready or claimed tasks now: email: a misspelt "
        "--queue? Pass --allow-empty to pause and drain it anyway"
    ) in " ".join(typo.output.split())
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    shown = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("pm-1"))
    assert list(shown.paused_queues) == []  # nothing paused
    ahead = _cli(secured, admin_token, "drain", "--queue", "later", "--allow-empty")
    assert ahead.exit_code == 0, ahead.output
    assert "drained at epoch 1: safe to switch queue later" in ahead.output
