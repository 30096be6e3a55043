"""A held claim's acceptance points (sdk/_core/points.py) without a server: the method each
picks, the request it sends behind the fence, and what its answer does to the claim."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from coordinator.sdk._core.points import AcceptingClaim, Point
from coordinator.v1 import types_pb2, worker_pb2

# Stands for a WorkerService stub: each point's ``method`` picks one of these names off it.
STUB = SimpleNamespace(
    **{name: name for name in ("Commit", "StageResult", "AuthorizeTool", "Release", "Fail")}
)


class _Claim(AcceptingClaim):
    def _signal(self, *, lost: bool) -> None:
        pass


def _claim() -> _Claim:
    fence = types_pb2.Fence(task_id="t1", attempt_id="a1", claim_generation=3, scheduler_epoch=7)
    answer = worker_pb2.ClaimResponse(
        outcome=types_pb2.OUTCOME_CLAIMED, fence=fence, attempt=1, ttl_seconds=9, input_digest="d"
    )
    return _Claim(answer, sent_at=0.0, on_lost=None, safety_margin=None, clock=lambda: 0.0)


def test_a_commit_and_next_claims_under_the_claims_epoch_and_committed_ends_the_claim() -> None:
    claim = _claim()
    point = claim._commit_point(b"r", "", None, (), next_of=("q", timedelta(seconds=9), 2))
    assert point.method(STUB) == "Commit"
    assert (point.request.fence.claim_generation, point.request.input_digest) == (3, "d")
    assert (point.request.next.queue, point.request.next.scheduler_epoch) == ("q", 7)
    assert point.request.next.max_tasks == 2
    outcome = point.answer(worker_pb2.CommitResponse(outcome=types_pb2.OUTCOME_COMMITTED))
    assert outcome.committed and claim.committed and not claim.is_lost()


def test_a_commit_alone_claims_nothing_and_a_fenced_answer_loses_the_claim() -> None:
    claim = _claim()
    point = claim._commit_point(b"r", "", None, ())
    assert not point.request.HasField("next")
    point.answer(worker_pb2.CommitResponse(outcome=types_pb2.OUTCOME_FENCED))
    assert claim.is_lost() and not claim.committed


def test_each_point_picks_its_method_and_fences_its_request() -> None:
    claim = _claim()
    points: list[Point[Any]] = [
        claim._stage_point(b"r", "", None),
        claim._authorize_point("tool", "act"),
        claim._release_point("why"),
        claim._fail_point("Boom", True, None, "bad", b""),
    ]
    assert [p.method(STUB) for p in points] == ["StageResult", "AuthorizeTool", "Release", "Fail"]
    assert {p.request.fence.claim_generation for p in points} == {3}
    released = points[2].answer(worker_pb2.ReleaseResponse(outcome=types_pb2.OUTCOME_OK))
    assert released.released and not claim.is_lost()
