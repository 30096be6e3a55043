"""The worker SDK for asyncio: the sync SDK's semantics on ``grpc.aio``.

    import asyncio
    from datetime import timedelta
    from coordinator.sdk import ClaimRefused
    from coordinator.sdk.aio import AsyncWorkerClient

    async def main() -> None:
        async with AsyncWorkerClient("127.0.0.1:50051", principal="worker-1") as client:
            claim = await client.claim_next("emails", ttl=timedelta(seconds=10))
            if not isinstance(claim, ClaimRefused):
                async with claim:            # keepalive task at TTL/3; released if unfinished
                    claim.check()            # ClaimLost if fenced or too close to expiry
                    outcome = await claim.commit(b"done")
                    print(outcome.outcome.name)

    asyncio.run(main())

Results, refusals and exceptions are the sync SDK's types (import them from
``coordinator.sdk``); a client and its claims belong to the event loop they were made on.
``AsyncWorkerPool`` (sdk/aio/pool.py) runs an async handler over queues as the thread pool
does. Managed jobs (``Claim.run``) are not offered here: they are process-based, use the sync
SDK.
"""

from coordinator.sdk.aio.claim import AsyncClaim
from coordinator.sdk.aio.client import AsyncWorkerClient
from coordinator.sdk.aio.effects import AsyncDownstream, ThreadedDownstream
from coordinator.sdk.aio.pool import AsyncHandler, AsyncWorkerPool, stop_on_signals

__all__ = [
    "AsyncClaim",
    "AsyncDownstream",
    "AsyncHandler",
    "AsyncWorkerClient",
    "AsyncWorkerPool",
    "ThreadedDownstream",
    "stop_on_signals",
]
