"""``python -m bench.model_server MODEL ETCD``: one server model of bench.server_models.

Every model answers the same unary method, ``/bench.Model/Cycle``, with the same work: a read
txn of one key, about 120 us of pure Python (a small record through JSON twelve times, the order
of the coordinator's own decisions per call), then a txn that puts the key if it is unchanged.
Only how the call reaches that work differs:

- ``threads``: grpc's sync server (a thread per call) and the sync etcd client, as the
  coordinator serves today;
- ``threads-batched``: ``threads`` with the coordinator's own group commit
  (store/etcd/group_commit.py: concurrent txns share a round trip, leader and followers on
  gates), as the coordinator sends its txns today;
- ``loop``: grpc.aio's server and an aio etcd channel on one event loop, the work inline;
- ``loop-batched``: ``loop`` with the txns of the calls that meet in one turn of the loop sent as
  one etcd txn of nested txns (group commit without gates: the coordinator's batching, as the
  loop would do it; the model's callers never share a key, so no conflict check);
- ``loop-pool``: grpc.aio's server handing the sync handler of ``threads`` to a thread pool;
- ``threads-loop``: grpc's sync server as ``threads``, each handler handing the whole call's work
  (the read, the Python, the txn) to one event loop thread as a coroutine and waiting for it;
  the loop sends the etcd calls over an aio channel, its txns batched per turn as
  ``loop-batched``: the sync server kept, the store's work on a loop.

Prints the bound port, then serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from etcd3 import etcdrpc

from coordinator.store.etcd.group_commit import GroupCommit

MODELS = ("threads", "threads-batched", "loop", "loop-batched", "loop-pool", "threads-loop")
METHOD = "/bench.Model/Cycle"
_THREADS = 64
_OPTIONS = [("grpc.so_reuseport", 0)]


def work(key: bytes) -> bytes:
    """The pure part of a call."""
    record: dict[str, Any] = {
        "task_id": key.decode(),
        "queue": "q",
        "state": "CLAIMED",
        "attempt": 3,
        "owner_id": "worker",
        "input_digest": "sha256:" + "ab" * 32,
        "lease_id": 1234567,
        "scheduler_epoch": 1,
        "updated_at": time.time(),
    }
    for _ in range(12):
        record = json.loads(json.dumps(record))
    return json.dumps(record).encode()


def _read(key: bytes) -> Any:
    return etcdrpc.TxnRequest(
        success=[etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key))]
    )


def _write(key: bytes, value: bytes, revision: int) -> Any:
    unchanged = etcdrpc.Compare(
        key=key,
        result=etcdrpc.Compare.EQUAL,
        target=etcdrpc.Compare.MOD,
        mod_revision=revision,
    )
    return etcdrpc.TxnRequest(
        compare=[unchanged],
        success=[etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))],
    )


def _revision(response: Any) -> int:
    kvs = response.responses[0].response_range.kvs
    return int(kvs[0].mod_revision) if kvs else 0


def _handlers(behavior: Any) -> grpc.GenericRpcHandler[Any, Any]:
    method = grpc.unary_unary_rpc_method_handler(behavior)
    service, name = METHOD.strip("/").split("/")
    return grpc.method_handlers_generic_handler(service, {name: method})


def _sync_cycle(etcd: str, *, batched: bool = False) -> Any:
    kv = etcdrpc.KVStub(grpc.insecure_channel(etcd))
    txn = kv.Txn
    if batched:
        txn = GroupCommit(kv.Txn).txn

    def cycle(request: bytes, context: grpc.ServicerContext) -> bytes:
        key = b"/bench-model/" + request
        revision = _revision(txn(_read(key)))
        value = work(request)
        txn(_write(key, value, revision))
        return value[:16]

    return cycle


def _serve_threads(etcd: str, *, batched: bool) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(_THREADS),
        maximum_concurrent_rpcs=_THREADS,
        options=_OPTIONS,
    )
    server.add_generic_rpc_handlers([_handlers(_sync_cycle(etcd, batched=batched))])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    server.wait_for_termination()


class _TurnBatcher:
    """The txns asked for during one turn of the loop, sent together as one etcd txn; at most
    ``max_in_flight`` batches on the wire (as the coordinator's group commit), so under load
    what queues while they travel goes in the next one."""

    def __init__(self, kv: Any, max_in_flight: int = 2) -> None:
        self._kv = kv
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._due = False
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def txn(self, request: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._ask()
        return await future

    def _ask(self) -> None:
        if not self._due and self._in_flight < self._max_in_flight:
            self._due = True  # sent once this turn's callbacks ran
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._due = False
        if not self._pending or self._in_flight >= self._max_in_flight:
            return
        batch, self._pending = self._pending, []
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._round_trip(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round_trip(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                request, future = batch[0]
                future.set_result(await self._kv.Txn(request))
                return
            nested = [etcdrpc.RequestOp(request_txn=request) for request, _ in batch]
            response = await self._kv.Txn(etcdrpc.TxnRequest(success=nested))
            for (_, future), op in zip(batch, response.responses, strict=True):
                future.set_result(op.response_txn)
        finally:
            self._in_flight -= 1
            if self._pending:
                self._ask()


async def _serve_loop(etcd: str, *, pool: bool, batched: bool) -> None:
    if pool:
        behavior = _sync_cycle(etcd)
        server = grpc.aio.server(
            migration_thread_pool=futures.ThreadPoolExecutor(_THREADS), options=_OPTIONS
        )
    else:
        kv = etcdrpc.KVStub(grpc.aio.insecure_channel(etcd))
        txn = _TurnBatcher(kv).txn if batched else kv.Txn

        async def behavior(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            key = b"/bench-model/" + request
            revision = _revision(await txn(_read(key)))
            value = work(request)
            await txn(_write(key, value, revision))
            return value[:16]

        server = grpc.aio.server(options=_OPTIONS)
    server.add_generic_rpc_handlers([_handlers(behavior)])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()


def _serve_threads_loop(etcd: str) -> None:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="store-loop", daemon=True).start()

    async def make() -> Any:
        kv = etcdrpc.KVStub(grpc.aio.insecure_channel(etcd))
        return _TurnBatcher(kv).txn

    txn = asyncio.run_coroutine_threadsafe(make(), loop).result()

    async def op(request: bytes) -> bytes:
        key = b"/bench-model/" + request
        revision = _revision(await txn(_read(key)))
        value = work(request)
        await txn(_write(key, value, revision))
        return value[:16]

    def cycle(request: bytes, context: grpc.ServicerContext) -> bytes:
        return asyncio.run_coroutine_threadsafe(op(request), loop).result()

    server = grpc.server(
        futures.ThreadPoolExecutor(_THREADS),
        maximum_concurrent_rpcs=_THREADS,
        options=_OPTIONS,
    )
    server.add_generic_rpc_handlers([_handlers(cycle)])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    server.wait_for_termination()


def main(argv: list[str]) -> int:
    """Serve ``argv[0]`` (a model) against etcd at ``argv[1]``."""
    if len(argv) != 2 or argv[0] not in MODELS:
        print(f"usage: python -m bench.model_server {{{','.join(MODELS)}}} ETCD", file=sys.stderr)
        return 2
    model, etcd = argv
    if model in ("threads", "threads-batched"):
        _serve_threads(etcd, batched=model == "threads-batched")
    elif model == "threads-loop":
        _serve_threads_loop(etcd)
    else:
        asyncio.run(_serve_loop(etcd, pool=model == "loop-pool", batched=model == "loop-batched"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
