"""``python -m bench.model_server MODEL ETCD``: one server model of bench.server_models.

Every model answers the same unary method, ``/bench.Model/Cycle``, with the same work: a read
txn of one key, about 120 us of pure Python (a small record through JSON twelve times, the order
of the coordinator's own decisions per call), then a txn that puts the key if it is unchanged.
Only how the call reaches that work differs:

- ``threads``: grpc's sync server (a thread per call) and the sync etcd client, as the
  coordinator serves today;
- ``loop``: grpc.aio's server and an aio etcd channel on one event loop, the work inline;
- ``loop-pool``: grpc.aio's server handing the sync handler of ``threads`` to a thread pool.

Prints the bound port, then serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent import futures
from typing import Any

import grpc
from etcd3 import etcdrpc

MODELS = ("threads", "loop", "loop-pool")
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


def _sync_cycle(etcd: str) -> Any:
    kv = etcdrpc.KVStub(grpc.insecure_channel(etcd))

    def cycle(request: bytes, context: grpc.ServicerContext) -> bytes:
        key = b"/bench-model/" + request
        revision = _revision(kv.Txn(_read(key)))
        value = work(request)
        kv.Txn(_write(key, value, revision))
        return value[:16]

    return cycle


def _serve_threads(etcd: str) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(_THREADS),
        maximum_concurrent_rpcs=_THREADS,
        options=_OPTIONS,
    )
    server.add_generic_rpc_handlers([_handlers(_sync_cycle(etcd))])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    server.wait_for_termination()


async def _serve_loop(etcd: str, *, pool: bool) -> None:
    if pool:
        behavior = _sync_cycle(etcd)
        server = grpc.aio.server(
            migration_thread_pool=futures.ThreadPoolExecutor(_THREADS), options=_OPTIONS
        )
    else:
        kv = etcdrpc.KVStub(grpc.aio.insecure_channel(etcd))

        async def behavior(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            key = b"/bench-model/" + request
            revision = _revision(await kv.Txn(_read(key)))
            value = work(request)
            await kv.Txn(_write(key, value, revision))
            return value[:16]

        server = grpc.aio.server(options=_OPTIONS)
    server.add_generic_rpc_handlers([_handlers(behavior)])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str]) -> int:
    """Serve ``argv[0]`` (a model) against etcd at ``argv[1]``."""
    if len(argv) != 2 or argv[0] not in MODELS:
        print(f"usage: python -m bench.model_server {{{','.join(MODELS)}}} ETCD", file=sys.stderr)
        return 2
    model, etcd = argv
    if model == "threads":
        _serve_threads(etcd)
    else:
        asyncio.run(_serve_loop(etcd, pool=model == "loop-pool"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
