"""How a pool ends a claim (sdk/_core/settling.py) and passes its slot on (sdk/_core/slots.py),
driven without a server: which claim calls each flow asks for given each answer, and which
ending it counts; the decisions both pools used to write twice."""

from __future__ import annotations

from collections.abc import Generator
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from structlog.testing import capture_logs

from coordinator.domain.decisions import Fence
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError, InvalidArgument, StoreUnavailable
from coordinator.sdk._core.flows import Flow
from coordinator.sdk._core.held import HeldClaim
from coordinator.sdk._core.pool import SHUTDOWN_ERROR, UNFINISHED, Ending
from coordinator.sdk._core.requests import commit_request, stage_request
from coordinator.sdk._core.settling import (
    RELEASED_UNFINISHED,
    RESULT_DISCARDED,
    ClaimCall,
    NextTask,
    Settled,
    cut_off_claim,
    settle,
)
from coordinator.sdk._core.slots import ALL_HELD, NOT_ALL_HELD, OUTLIVED, HandOver, Routes, Slots
from coordinator.sdk.types import LossSource, LostReason
from coordinator.v1 import types_pb2, worker_pb2

ResultT = TypeVar("ResultT")


class _Claim(HeldClaim):
    """A held claim whose calls are recorded and answered by the test: ``refuse`` makes each
    call in it raise, ``fenced`` makes them find the claim lost, ``won`` is what a
    commit_and_next claims."""

    def __init__(self, task_id: str = "t1") -> None:
        fence = types_pb2.Fence(task_id=task_id, attempt_id="a1", claim_generation=3)
        answer = worker_pb2.ClaimResponse(
            outcome=types_pb2.OUTCOME_CLAIMED, fence=fence, attempt=1, ttl_seconds=9
        )
        super().__init__(answer, sent_at=0.0, on_lost=None, safety_margin=None, clock=lambda: 0.0)
        self.calls: list[str] = []
        self.refuse: set[str] = set()
        self.invalid: set[str] = set()
        self.fenced: set[str] = set()
        self.won: list[_Claim] = []

    def _signal(self, *, lost: bool) -> None:
        pass

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.refuse:
            raise StoreUnavailable(f"{name} refused")
        if name in self.invalid:
            raise InvalidArgument("result is 600000 bytes, the limit is 524288")
        if name in self.fenced:
            self.mark_lost(Outcome.FENCED, FenceReason.SUPERSEDED, "", LossSource.COMMIT)

    def commit(self, result: bytes) -> None:
        self._call(f"commit {result.decode()}")
        if not self.is_lost():
            self._finish("committed")

    def commit_and_next(self, result: bytes, **next_of: Any) -> tuple[None, list[_Claim]]:
        self._call(f"commit {result.decode()} and next of {next_of['queue']}")
        self._finish("committed")
        return None, self.won

    def fail(
        self, error: BaseException | str, *, retryable: bool, message: str, shutdown: bool
    ) -> None:
        said = f"fail {error} retryable={retryable} {message}".strip()
        self._call(f"{said} (shutdown)" if shutdown else said)

    def release(self, reason: str) -> None:
        self._call(f"release {reason}")

    def close(self) -> None:
        self._call("close")


def _run(claim: _Claim, steps: Generator[ClaimCall, Any, ResultT]) -> ResultT:
    """Drive ``steps`` as a pool does (without its closing the claim afterwards)."""
    flow = Flow(steps)
    while (step := flow.step) is not None:
        with flow.catching(CoordinatorError):
            flow.answer(step.call(claim))
    return flow.result


def _next(queue: str = "q", stopping: bool = False) -> NextTask:
    return NextTask(queue, timedelta(seconds=9), lambda reason: None, lambda: stopping)


def test_a_result_is_committed() -> None:
    claim = _Claim()
    assert _run(claim, settle(claim, b"r", None, None)) == Settled(Ending.COMMITTED)
    assert claim.calls == ["commit r"]


def test_with_commit_then_next_the_commit_claims_the_slots_next_task() -> None:
    claim, following = _Claim(), _Claim("t2")
    claim.won = [following]
    assert _run(claim, settle(claim, b"r", None, _next())) == Settled(Ending.COMMITTED, following)
    assert claim.calls == ["commit r and next of q"]


def test_a_stopping_pool_commits_without_claiming_the_next_task() -> None:
    claim = _Claim()
    assert _run(claim, settle(claim, b"r", None, _next(stopping=True))) == Settled(Ending.COMMITTED)
    assert claim.calls == ["commit r"]


def test_a_commit_that_finds_the_claim_lost_ends_it_lost_and_says_the_result_was_discarded() -> (
    None
):
    claim = _Claim()
    claim.fenced.add("commit r")
    with capture_logs() as logs:
        assert _run(claim, settle(claim, b"r", None, None)) == Settled(Ending.LOST)
    [said] = [e for e in logs if e["event"] != "claim lost"]  # the loss is said as well
    assert (said["event"], said["log_level"], said["result_bytes"]) == (
        RESULT_DISCARDED, "warning", 1,
    )  # fmt: skip
    assert said["lost"].startswith("FENCED/SUPERSEDED (commit)"), said


def test_an_error_gives_the_task_back_retryable_after_stopping_the_renewals() -> None:
    claim = _Claim()
    assert _run(claim, settle(claim, None, ValueError("bad"), None)) == Settled(Ending.FAILED)
    assert claim.calls == ["close", "fail bad retryable=True"]


@pytest.mark.parametrize("result", ["text", 42, {"a": 1}], ids=["str", "int", "dict"])
def test_a_result_that_is_not_bytes_gives_the_task_back_as_a_type_error(result: object) -> None:
    # Once it raised from the digest on the pool's thread and held the slot for good.
    claim = _Claim()
    settled = _run(claim, settle(claim, result, None, None))  # type: ignore[arg-type]
    assert settled == Settled(Ending.FAILED)
    name = type(result).__name__
    assert claim.calls == [
        "close",
        f"fail the handler returned {name}: a handler returns bytes (committed) or None (the "
        "claim released) retryable=True",
    ]


def test_a_result_the_commit_refuses_gives_the_task_back_with_why_at_once() -> None:
    # Once left to its lease: every attempt ended EXPIRED, the refusal's reason nowhere.
    claim = _Claim()
    claim.invalid.add("commit huge")
    assert _run(claim, settle(claim, b"huge", None, None)) == Settled(Ending.FAILED)
    assert claim.calls == [
        "commit huge",
        "close",
        "fail result is 600000 bytes, the limit is 524288 retryable=True",
    ]


def test_a_commit_or_stage_of_text_says_to_encode_it() -> None:
    fence = Fence("t1", "a1", 3, 1, 0)
    with pytest.raises(TypeError, match=r"^a result is bytes, not int$"):
        stage_request(fence, 7, result_ref="", result_digest=None)  # type: ignore[arg-type]
    text, ok = "text", bytearray(b"ok")
    with pytest.raises(TypeError, match=r"^a result is bytes, not str: encode it first"):
        commit_request(fence, "", text, result_ref="", result_digest=None, evidence=())  # type: ignore[arg-type]
    sent = commit_request(fence, "", ok, result_ref="", result_digest=None, evidence=())  # type: ignore[arg-type]
    assert sent.result == ok


def test_no_result_releases_the_claim_and_says_so() -> None:
    claim = _Claim()
    with capture_logs() as logs:
        assert _run(claim, settle(claim, None, None, None)) == Settled(Ending.RELEASED)
    assert claim.calls == [f"release {UNFINISHED}"]
    assert [(e["event"], e["task_id"]) for e in logs] == [(RELEASED_UNFINISHED, "t1")]


def test_a_lost_claim_is_neither_committed_nor_given_back() -> None:
    claim = _Claim()
    claim.mark_lost(Outcome.FENCED, FenceReason.SUPERSEDED, "", LossSource.RENEW)
    with capture_logs() as logs:
        assert _run(claim, settle(claim, b"r", None, None)) == Settled(Ending.LOST)
    assert claim.calls == []
    assert [e["event"] for e in logs] == [RESULT_DISCARDED]  # marked lost before: said then
    claim = _Claim()  # a handler that ended with nothing to keep: no result discarded
    claim.mark_lost(Outcome.FENCED, FenceReason.SUPERSEDED, "", LossSource.RENEW)
    with capture_logs() as logs:
        assert _run(claim, settle(claim, None, ValueError("x"), None)) == Settled(Ending.LOST)
    assert logs == []


def test_a_commit_the_coordinator_could_not_take_leaves_the_claim_to_its_lease() -> None:
    claim = _Claim()
    claim.refuse.add("commit r")
    assert _run(claim, settle(claim, b"r", None, None)) == Settled(Ending.UNSETTLED)


def test_the_cut_off_gives_the_claim_back_as_a_shutdown() -> None:
    claim = _Claim()
    assert _run(claim, cut_off_claim(claim, "grace ran out")) is Ending.CUT_OFF
    assert claim.calls == [
        "close",
        f"fail {SHUTDOWN_ERROR} retryable=True grace ran out (shutdown)",
    ]


def test_a_cut_off_that_cannot_reach_the_coordinator_is_unsettled() -> None:
    claim = _Claim()
    claim.refuse.add(f"fail {SHUTDOWN_ERROR} retryable=True why (shutdown)")
    assert _run(claim, cut_off_claim(claim, "why")) is Ending.UNSETTLED


# --- the slots --------------------------------------------------------------------------------


class _Lost:
    """A claim as the outlived check reads it."""

    def __init__(self, task_id: str, lost: bool) -> None:
        self.task_id, self.lost = task_id, lost

    def is_lost(self) -> bool:
        return self.lost


class _Running:
    def __init__(self, name: str, claim: Any = None) -> None:
        self.name = name
        self.claim = claim
        self.abandoned = False
        self.losses: list[str] = []

    def lost(self, reason: LostReason) -> None:
        self.losses.append(reason.task_id)


def _slots(free: int, claim_batch: int) -> tuple[Slots[_Running], list[str]]:
    woken: list[str] = []
    return Slots(free, claim_batch, lambda: woken.append("wake")), woken


def test_a_claim_loop_takes_up_to_claim_batch_free_slots_and_gets_back_what_it_did_not_fill() -> (
    None
):
    slots, woken = _slots(5, 3)
    assert slots.take(stopping=False) == 3
    assert slots.take(stopping=False) == 2
    assert slots.full(stopping=False) and not slots.full(stopping=True)
    slots.polled(3, [object()])  # won one task of three
    slots.polled(2, "NO_READY_TASK")
    assert (slots.free, woken) == (4, ["wake", "wake"])
    assert slots.take(stopping=True) == 0


def test_a_settled_claim_hands_its_slot_to_the_claim_its_commit_won_while_the_pool_runs() -> None:
    slots, woken = _slots(2, 1)
    first, second, third = _Running("1"), _Running("2"), _Running("3")
    assert slots.start(first, stopping=False) and slots.start(second, stopping=False)
    assert slots.hand_over(first, Ending.COMMITTED, third, stopping=False) is HandOver.KEPT
    assert slots.hand_over(second, Ending.COMMITTED, _Running("4"), stopping=True) is HandOver.FREED
    assert slots.hand_over(third, Ending.RELEASED, None, stopping=False) is HandOver.FREED
    assert (slots.held(), slots.free, woken) == (0, 4, ["wake", "wake"])
    assert slots.tally.report().endings == {Ending.COMMITTED: 2, Ending.RELEASED: 1}


def test_the_cut_off_takes_over_the_claims_still_running() -> None:
    slots, _ = _slots(1, 1)
    running = _Running("1")
    assert slots.start(running, stopping=False)
    assert not slots.start(_Running("late"), stopping=True)
    assert slots.abandon() == [running] and running.abandoned
    assert slots.hand_over(running, Ending.COMMITTED, None, stopping=True) is HandOver.TAKEN
    assert (slots.held(), slots.tally.report().endings) == (0, {})


def test_a_loss_reaches_the_claim_that_was_lost_only() -> None:
    routes: Routes[_Running, _Claim] = Routes()
    runnings = routes.won([_Claim("t1"), _Claim("t2")], lambda claim: _Running(claim.task_id))
    routes.lost(LostReason(Outcome.FENCED, FenceReason.SUPERSEDED, "", LossSource.RENEW, "t2"))
    routes.lost(LostReason(Outcome.FENCED, FenceReason.SUPERSEDED, "", LossSource.RENEW, "t9"))
    assert [r.losses for r in runnings] == [[], ["t2"]]


def test_handlers_that_outlive_their_lost_claims_are_said_once_and_all_slots_so_held_unready() -> (
    None
):
    """A handler that ignores its cancellation held its slot for good, the pool ready and
    silent: two such in a pool of two claimed nothing more, and nobody was told."""
    slots, _ = _slots(2, 1)
    hung, alive = _Running("1", _Lost("hung", True)), _Running("2", _Lost("alive", False))
    assert slots.start(hung, stopping=False) and slots.start(alive, stopping=False)
    with capture_logs() as logs:
        assert slots.outlived(100.0, after=30) is None  # lost now: the grace starts
        assert slots.outlived(129.0, after=30) is None
        assert slots.outlived(130.0, after=30) is None  # one of two slots: said, still ready
        assert slots.outlived(131.0, after=30) is None  # said once
        alive.claim.lost = True
        assert slots.outlived(131.0, after=30) is None
        assert slots.outlived(161.0, after=30) is True  # every slot held: unready
        assert slots.outlived(162.0, after=30) is None
        assert slots.hand_over(alive, Ending.LOST, None, stopping=False) is HandOver.FREED
        assert slots.outlived(163.0, after=30) is False  # a slot free again: ready
    said = [(e["event"], e.get("task_id")) for e in logs]
    assert said == [
        (OUTLIVED, "hung"),
        (OUTLIVED, "alive"),
        (ALL_HELD, None),
        (NOT_ALL_HELD, None),
    ]
