"""WorkerService's requests parsed in one place (coordinator/server/wire/worker_requests.py):
pure, so each rule is checked here without a server; tests/server/test_bad_input.py checks the
same refusals over gRPC, with nothing written."""

from __future__ import annotations

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.effects import EffectState
from coordinator.errors import InvalidArgument
from coordinator.fence_wire import fence_to_proto
from coordinator.server.wire import worker_requests as requests
from coordinator.v1 import types_pb2, worker_pb2

FENCE = Fence(
    task_id="t1",
    attempt_id="a1",
    claim_generation=2,
    scheduler_epoch=1,
    cancel_generation=0,
)
INPUT = "sha256:" + "0" * 64
EFFECT = "eff-" + "0" * 64


def test_a_claim_is_parsed_into_one_typed_value() -> None:
    request = worker_pb2.ClaimRequest(
        task_id="t1", expected_state_version=3, scheduler_epoch=1, ttl_seconds=30
    )
    assert requests.parse_claim(request) == requests.ClaimArgs(
        task_id="t1", expected_state_version=3, epoch=1, ttl=30
    )


def test_the_first_wrong_field_is_named() -> None:
    with pytest.raises(InvalidArgument, match=r"^task_id is required"):
        requests.parse_claim(worker_pb2.ClaimRequest(ttl_seconds=-1))
    with pytest.raises(InvalidArgument, match=r"^scheduler_epoch is required"):
        requests.parse_claim(worker_pb2.ClaimRequest(task_id="t1", ttl_seconds=-1))


def test_a_commits_next_claim_never_waits_and_its_errors_say_next() -> None:
    fence = fence_to_proto(FENCE)
    waiting = worker_pb2.CommitRequest(
        fence=fence, input_digest=INPUT, next=worker_pb2.ClaimNextRequest(wait_seconds=1.0)
    )
    with pytest.raises(InvalidArgument, match=r"^next\.wait_seconds must be 0"):
        requests.parse_commit(waiting)
    no_epoch = worker_pb2.CommitRequest(
        fence=fence, input_digest=INPUT, next=worker_pb2.ClaimNextRequest()
    )
    with pytest.raises(InvalidArgument, match=r"^next\.scheduler_epoch is required"):
        requests.parse_commit(no_epoch)


def test_a_commit_without_next_asks_for_none() -> None:
    request = worker_pb2.CommitRequest(fence=fence_to_proto(FENCE), input_digest=INPUT, result=b"r")
    args = requests.parse_commit(request)
    assert (args.fence, args.result, args.next) == (FENCE, b"r", None)


def test_an_acceptance_point_without_its_fence_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^fence is required"):
        requests.parse_release(worker_pb2.ReleaseRequest(reason="done"))


def test_record_effect_names_the_effect_before_its_state() -> None:
    fence = fence_to_proto(FENCE)
    with pytest.raises(InvalidArgument, match="effect_id"):
        requests.parse_record_effect(worker_pb2.RecordEffectRequest(fence=fence))
    request = worker_pb2.RecordEffectRequest(
        fence=fence, effect_id=EFFECT, state=types_pb2.EFFECT_STATE_COMMITTED
    )
    args = requests.parse_record_effect(request)
    assert (args.effect_id, args.state) == (EFFECT, EffectState.COMMITTED)


def test_the_two_effect_listings_keep_their_tokens_apart() -> None:
    open_page = requests.parse_list_open_effects(worker_pb2.ListOpenEffectsRequest())
    all_page = requests.parse_list_effects(worker_pb2.ListEffectsRequest(task_id="t1"))
    assert (open_page.task_id, open_page.rpc) == ("", "ListOpenEffects")
    assert (all_page.task_id, all_page.rpc) == ("t1", "ListEffects")
