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

Everything importable from here is public; modules starting with ``_`` are not.
"""

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
from coordinator.sdk._rpc import PRINCIPAL_METADATA, RetryPolicy
from coordinator.sdk.auth import BearerToken, tls_credentials
from coordinator.sdk.cancellation import Cancellation, CancelReason
from coordinator.sdk.claim import Claim, LostCallback
from coordinator.sdk.client import WorkerClient
from coordinator.sdk.effects import (
    Downstream,
    DownstreamRefused,
    DownstreamResult,
    DownstreamUncertain,
    EffectInfo,
    EffectOutcome,
    EffectStatus,
    HttpDownstream,
    LookupUnsupported,
)
from coordinator.sdk.managed import JobResult, ManagedProcess
from coordinator.sdk.pool import Ending, PollBackoff, PoolReport, WorkerPool, stop_on_signals
from coordinator.sdk.readiness import Readiness, ReadyFile
from coordinator.sdk.rediscover import ListedJob, Rediscovered
from coordinator.sdk.types import (
    AttemptInfo,
    ClaimLost,
    ClaimRefused,
    CommitOutcome,
    FailOutcome,
    LossSource,
    LostReason,
    OutcomeUnknown,
    ReleaseOutcome,
    ResultInfo,
    StageOutcome,
    TaskInfo,
    TaskRetryPolicy,
    ToolAuthorization,
    TransportError,
)

__all__ = [
    "PRINCIPAL_METADATA",
    "AttemptEnd",
    "AttemptInfo",
    "BearerToken",
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
    "RetryPolicy",
    "StageOutcome",
    "TaskInfo",
    "TaskRetryPolicy",
    "TaskState",
    "ToolAuthorization",
    "TransportError",
    "WorkerClient",
    "WorkerPool",
    "stop_on_signals",
    "tls_credentials",
]
