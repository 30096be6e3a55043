"""Waiting on an ``asyncio.Event`` with a bound, as the sync SDK's ``Flag.wait`` does."""

from __future__ import annotations

import asyncio


async def wait_for(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass (None: no bound); whether it is set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()
