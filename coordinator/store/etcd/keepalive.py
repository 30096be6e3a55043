"""Many leases kept alive over one etcd LeaseKeepAlive stream, read with grpc.aio.

A batch of renewals (store/attempts/renewals.py) refreshes every lease of the batch on one stream:
etcd answers each request in turn, so the cost is one message each way per lease. The sync gRPC API
hands each streamed message between its own threads (a request iterator drained by one, every
answer a condition wake-up of the reader), measured at 90 to 170 us of coordinator CPU per lease;
grpc.aio reads the same stream on an event loop at about 60 us (bench phase ``held``). So the
stream runs here, on a loop thread of its own, over an aio channel to the member the sync
client is using; its errors are grpc errors as the sync calls' are, translated by the caller
(store/etcd/kv.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import grpc
from etcd3 import etcdrpc


class LeaseKeepalives:
    """Keepalive streams on an asyncio loop thread (started on first use, stopped by close)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    def refresh(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        lease_ids: Sequence[int],
        *,
        timeout: float,
        metadata: Any,
        call_credentials: grpc.CallCredentials | None,
    ) -> dict[int, int]:
        """Keep ``lease_ids`` alive on the member at ``target``; each one's TTL as etcd
        answered it (0: gone; a lease etcd did not answer for is missing). Raises grpc.RpcError,
        or TimeoutError if the loop itself did not answer in time."""
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(
            self._refresh(target, credentials, lease_ids, timeout, metadata, call_credentials),
            loop,
        )
        try:
            return future.result(timeout + 1)
        except TimeoutError:
            future.cancel()
            raise

    async def _refresh(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        lease_ids: Sequence[int],
        timeout: float,
        metadata: Any,
        call_credentials: grpc.CallCredentials | None,
    ) -> dict[int, int]:
        stub = etcdrpc.LeaseStub(self._channel(target, credentials))
        requests = [etcdrpc.LeaseKeepAliveRequest(ID=lease_id) for lease_id in lease_ids]
        call = stub.LeaseKeepAlive(
            iter(requests), timeout=timeout, metadata=metadata, credentials=call_credentials
        )
        ttls: dict[int, int] = {}
        try:
            async for response in call:
                ttls[int(response.ID)] = int(response.TTL)
                if len(ttls) == len(lease_ids):
                    break
        finally:
            call.cancel()
        return ttls

    def _channel(self, target: str, credentials: grpc.ChannelCredentials | None) -> Any:
        channel = self._channels.get(target)
        if channel is None:
            options = [("grpc.enable_http_proxy", 0)]
            channel = (
                grpc.aio.secure_channel(target, credentials, options=options)
                if credentials is not None
                else grpc.aio.insecure_channel(target, options=options)
            )
            self._channels[target] = channel
        return channel

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="etcd-keepalive", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Close the channels and stop the loop thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return

        async def close_all() -> None:  # on the loop, which alone touches the channels
            channels, self._channels = list(self._channels.values()), {}
            for channel in channels:
                await channel.close(None)

        asyncio.run_coroutine_threadsafe(close_all(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
