"""The worker SDK: claim a task, keep its lease alive in the background, commit behind its fence.

    from datetime import timedelta
    from coordinator.sdk import ClaimRefused, WorkerClient

    with WorkerClient("127.0.0.1:50051", principal="worker-1") as client:  # `coordinator up`
        claim = client.claim_next("emails", ttl=timedelta(seconds=10))
        if not isinstance(claim, ClaimRefused):
            with claim:                  # keepalive at TTL/3; released on exit if unfinished
                claim.check()            # ClaimLost if fenced or too close to expiry
                outcome = claim.commit(claim.input.upper())
                print(outcome.outcome.name, outcome.reason.name)

The same SDK for asyncio (``grpc.aio``) is ``coordinator.sdk.aio``.

Everything importable from here is public; modules starting with ``_`` are not. Each name is
imported when first used (PEP 562): a program, or a CLI verb, that needs only the transport and
the result types does not pay for the pools, managed jobs and effects (``_EXPORTS``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.domain.decisions import Fence
    from coordinator.domain.effects import EffectState
    from coordinator.domain.jobs import JobRecord, JobState, RediscoverAction
    from coordinator.domain.states import (
        AttemptEnd,
        DeadLetterReason,
        FenceReason,
        Outcome,
        TaskState,
    )
    from coordinator.sdk._core.calls import PRINCIPAL_METADATA, CallRetry
    from coordinator.sdk._core.effects import (
        Downstream,
        DownstreamRefused,
        DownstreamResult,
        DownstreamUncertain,
        EffectOutcome,
        EffectStatus,
        LookupUnsupported,
    )
    from coordinator.sdk._duration import Duration
    from coordinator.sdk.admin import AdminCalls
    from coordinator.sdk.aio.effects import ThreadedDownstream
    from coordinator.sdk.auth import BearerToken, tls_credentials
    from coordinator.sdk.cancellation import Cancellation, CancelReason
    from coordinator.sdk.claim import Claim, LostCallback
    from coordinator.sdk.client import WorkerClient
    from coordinator.sdk.effects import EffectInfo, HttpDownstream
    from coordinator.sdk.managed import JobResult, ManagedProcess
    from coordinator.sdk.pool import Ending, PollBackoff, PoolReport, WorkerPool, stop_on_signals
    from coordinator.sdk.readiness import Readiness, ReadyFile
    from coordinator.sdk.rediscover import ListedJob, Rediscovered
    from coordinator.sdk.tasks import AttemptInfo, ResultInfo, TaskInfo, TaskRetryPolicy
    from coordinator.sdk.types import (
        ClaimLost,
        ClaimRefused,
        CommitOutcome,
        FailOutcome,
        LossSource,
        LostReason,
        OutcomeUnknown,
        ReleaseOutcome,
        StageOutcome,
        ToolAuthorization,
        TransportError,
    )

_EXPORTS: dict[str, str] = {
    "Fence": "coordinator.domain.decisions",
    "EffectState": "coordinator.domain.effects",
    "JobRecord": "coordinator.domain.jobs",
    "JobState": "coordinator.domain.jobs",
    "RediscoverAction": "coordinator.domain.jobs",
    "AttemptEnd": "coordinator.domain.states",
    "DeadLetterReason": "coordinator.domain.states",
    "FenceReason": "coordinator.domain.states",
    "Outcome": "coordinator.domain.states",
    "TaskState": "coordinator.domain.states",
    "Duration": "coordinator.sdk._duration",
    "PRINCIPAL_METADATA": "coordinator.sdk._core.calls",
    "CallRetry": "coordinator.sdk._core.calls",
    "AdminCalls": "coordinator.sdk.admin",
    "BearerToken": "coordinator.sdk.auth",
    "tls_credentials": "coordinator.sdk.auth",
    "Cancellation": "coordinator.sdk.cancellation",
    "CancelReason": "coordinator.sdk.cancellation",
    "Claim": "coordinator.sdk.claim",
    "LostCallback": "coordinator.sdk.claim",
    "WorkerClient": "coordinator.sdk.client",
    "Downstream": "coordinator.sdk._core.effects",
    "DownstreamRefused": "coordinator.sdk._core.effects",
    "DownstreamResult": "coordinator.sdk._core.effects",
    "DownstreamUncertain": "coordinator.sdk._core.effects",
    "EffectInfo": "coordinator.sdk.effects",
    "EffectOutcome": "coordinator.sdk._core.effects",
    "EffectStatus": "coordinator.sdk._core.effects",
    "HttpDownstream": "coordinator.sdk.effects",
    "LookupUnsupported": "coordinator.sdk._core.effects",
    "JobResult": "coordinator.sdk.managed",
    "ManagedProcess": "coordinator.sdk.managed",
    "Ending": "coordinator.sdk.pool",
    "PollBackoff": "coordinator.sdk.pool",
    "PoolReport": "coordinator.sdk.pool",
    "WorkerPool": "coordinator.sdk.pool",
    "stop_on_signals": "coordinator.sdk.pool",
    "Readiness": "coordinator.sdk.readiness",
    "ReadyFile": "coordinator.sdk.readiness",
    "ListedJob": "coordinator.sdk.rediscover",
    "Rediscovered": "coordinator.sdk.rediscover",
    "AttemptInfo": "coordinator.sdk.tasks",
    "ClaimLost": "coordinator.sdk.types",
    "ClaimRefused": "coordinator.sdk.types",
    "CommitOutcome": "coordinator.sdk.types",
    "FailOutcome": "coordinator.sdk.types",
    "LossSource": "coordinator.sdk.types",
    "LostReason": "coordinator.sdk.types",
    "OutcomeUnknown": "coordinator.sdk.types",
    "ReleaseOutcome": "coordinator.sdk.types",
    "ResultInfo": "coordinator.sdk.tasks",
    "StageOutcome": "coordinator.sdk.types",
    "TaskInfo": "coordinator.sdk.tasks",
    "TaskRetryPolicy": "coordinator.sdk.tasks",
    "ToolAuthorization": "coordinator.sdk.types",
    "TransportError": "coordinator.sdk.types",
    "ThreadedDownstream": "coordinator.sdk.aio.effects",
}
"""Every public name and the module that defines it."""

__all__ = [
    "PRINCIPAL_METADATA",
    "AdminCalls",
    "AttemptEnd",
    "AttemptInfo",
    "BearerToken",
    "CallRetry",
    "CancelReason",
    "Cancellation",
    "Claim",
    "ClaimLost",
    "ClaimRefused",
    "CommitOutcome",
    "DeadLetterReason",
    "Downstream",
    "DownstreamRefused",
    "DownstreamResult",
    "DownstreamUncertain",
    "Duration",
    "EffectInfo",
    "EffectOutcome",
    "EffectState",
    "EffectStatus",
    "Ending",
    "FailOutcome",
    "Fence",
    "FenceReason",
    "HttpDownstream",
    "JobRecord",
    "JobResult",
    "JobState",
    "ListedJob",
    "LookupUnsupported",
    "LossSource",
    "LostCallback",
    "LostReason",
    "ManagedProcess",
    "Outcome",
    "OutcomeUnknown",
    "PollBackoff",
    "PoolReport",
    "Readiness",
    "ReadyFile",
    "RediscoverAction",
    "Rediscovered",
    "ReleaseOutcome",
    "ResultInfo",
    "StageOutcome",
    "TaskInfo",
    "TaskRetryPolicy",
    "TaskState",
    "ThreadedDownstream",
    "ToolAuthorization",
    "TransportError",
    "WorkerClient",
    "WorkerPool",
    "stop_on_signals",
    "tls_credentials",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then cached here)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
