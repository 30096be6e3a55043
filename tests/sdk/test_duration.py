"""Durations across the public SDK: seconds (int or float) or a timedelta, one conversion
(sdk/_duration.py) at every entry point, checked on every public signature."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import coordinator.sdk
import coordinator.sdk.aio
from coordinator.domain.states import TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    CallRetry,
    Cancellation,
    CancelReason,
    Claim,
    PollBackoff,
    TaskRetryPolicy,
)
from coordinator.sdk._duration import as_timedelta
from coordinator.sdk._flag import Flag
from tests.sdk.support import QUEUE, served_with_task

# Parameters that are points in time or counts, not spans (not_before is a datetime).
NOT_DURATIONS = frozenset({"not_before"})


def test_seconds_and_timedeltas_convert_the_same() -> None:
    assert as_timedelta(1.5, "t") == timedelta(seconds=1.5)
    assert as_timedelta(30, "t") == timedelta(seconds=30)
    given = timedelta(minutes=2)
    assert as_timedelta(given, "t") is given


@pytest.mark.parametrize("bad", [True, "5", math.nan, math.inf, None])
def test_anything_else_is_refused_naming_the_parameter(bad: Any) -> None:
    with pytest.raises(TypeError) as refused:
        as_timedelta(bad, "ttl")
    assert str(refused.value) == f"ttl: give seconds (int or float) or a timedelta, got {bad!r}"


def test_option_dataclasses_take_seconds_and_store_timedeltas() -> None:
    assert CallRetry(timeout=5, budget=0.5) == CallRetry(
        timeout=timedelta(seconds=5), budget=timedelta(milliseconds=500)
    )
    assert CallRetry().timeout == timedelta(seconds=10)  # the defaults are unchanged
    policy = TaskRetryPolicy(initial_backoff=2, max_backoff=60)
    wire = policy.to_proto()
    assert (wire.initial_backoff.seconds, wire.max_backoff.seconds) == (2, 60)
    assert TaskRetryPolicy().initial_backoff is None  # unset stays unset
    assert PollBackoff(initial=0.05, maximum=1).maximum == timedelta(seconds=1)
    with pytest.raises(TypeError, match=r"^CallRetry\.budget: give seconds"):
        CallRetry(budget="15")  # type: ignore[arg-type]


def test_wait_for_cancelled_takes_seconds() -> None:
    cancel = Cancellation(Flag())
    assert cancel.wait_for_cancelled(0.01) is False
    assert cancel.wait_for_cancelled(timedelta(milliseconds=10)) is False
    cancel.cancel(CancelReason.LOST, "fenced")
    assert cancel.wait_for_cancelled(1.0) is True


def test_a_claim_takes_seconds_wherever_it_takes_a_duration(etcd: EtcdProcess, prefix: str) -> None:
    with served_with_task(etcd.endpoint, prefix) as running, running.client("w") as client:
        claim = client.claim_next(QUEUE, ttl=30, safety_margin=2.5, wait=0.5)
        assert isinstance(claim, Claim)
        with claim:
            assert (claim.ttl, claim.safety_margin) == (
                timedelta(seconds=30),
                timedelta(seconds=2.5),
            )
            claim.check(margin=1)
            assert claim.wait_lost(0.01) is False
            failed = claim.fail("Flaky", delay=60)
        assert failed.state is TaskState.DELAYED and failed.next_eligible_at is not None
        # 60 went as 60 seconds (not ignored, not 60 ms): the task waits about a minute.
        assert failed.next_eligible_at - datetime.now(UTC) > timedelta(seconds=30)


def _public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every public function and public method of the public classes of the SDK."""
    for module in (coordinator.sdk, coordinator.sdk.aio):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value):
                # Inherited methods too (Claim's check and progress live in its base class).
                ours = [k for k in value.__mro__ if k.__module__.startswith("coordinator.")]
                for attr, member in {
                    a: m for k in reversed(ours) for a, m in vars(k).items()
                }.items():
                    if (not attr.startswith("_") or attr == "__init__") and callable(member):
                        yield f"{value.__qualname__}.{attr}", member
            elif inspect.isfunction(value):
                yield name, value


def test_no_public_signature_takes_a_timedelta_without_taking_seconds() -> None:
    # Annotations are strings here (postponed evaluation): a span is spelled ``Duration``, or
    # ``DurationField[...]`` in an options dataclass; a bare ``timedelta`` takes no seconds.
    checked, narrow = 0, []
    for name, function in _public_callables():
        for param in inspect.signature(function).parameters.values():
            hint = str(param.annotation)
            if param.name in NOT_DURATIONS or param.annotation is inspect.Parameter.empty:
                continue
            checked += 1
            if "timedelta" in hint and not hint.startswith("DurationField["):
                narrow.append(f"{name}({param.name}: {hint})")
    assert checked > 100  # the walk reached the signatures
    assert narrow == []
