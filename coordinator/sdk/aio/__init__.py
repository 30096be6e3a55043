"""The worker SDK for asyncio: the sync SDK's semantics on ``grpc.aio``.

    import asyncio
    from datetime import timedelta
    from coordinator.sdk import ClaimRefused
    from coordinator.sdk.aio import AsyncWorkerClient

    async def main() -> None:
        async with AsyncWorkerClient("localhost:7070", principal="worker-1") as client:
            job = await client.claim_next("emails", ttl=timedelta(seconds=10))
            if not isinstance(job, ClaimRefused):
                async with job:            # keepalive task at TTL/3; released if unfinished
                    job.check()            # JobLost if fenced or too close to expiry
                    outcome = await job.commit(b"done")
                    print(outcome.outcome.name)

    asyncio.run(main())

Results, refusals and exceptions are the sync SDK's types (import them from
``coordinator.sdk``); a client and its jobs belong to the event loop they were made on.
Managed jobs (``Job.run``) are not offered here: they are process-based, use the sync SDK.
"""

from coordinator.sdk.aio.client import AsyncWorkerClient
from coordinator.sdk.aio.effects import AsyncDownstream, ThreadedDownstream
from coordinator.sdk.aio.job import AsyncJob

__all__ = ["AsyncDownstream", "AsyncJob", "AsyncWorkerClient", "ThreadedDownstream"]
