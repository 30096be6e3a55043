"""The interceptor pipeline: each method's handler is built once, and a call's own metadata
still reaches every stage's behavior (through a real gRPC channel)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from coordinator.server.interceptors.handlers import Handler, metadata_value, unary_handler
from coordinator.server.interceptors.pipeline import Pipeline
from tests.conftest import GRPC_OPTIONS

_SERVICE = "test.Echo"


class _Tagging:
    """A stage that counts its builds and prefixes the answer with the call's ``x-tag``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.builds: Counter[str] = Counter()

    def build(self, method: str, handler: Handler) -> Handler:
        self.builds[method] += 1
        run = handler.unary_unary
        assert run is not None

        def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
            tag = metadata_value(context.invocation_metadata(), "x-tag") or "-"
            answer: bytes = run(request, context)
            return f"{self.name}:{tag}|".encode() + answer

        return unary_handler(handler, behavior)


@pytest.fixture
def served() -> Iterator[tuple[grpc.Channel, _Tagging, _Tagging]]:
    outer, inner = _Tagging("outer"), _Tagging("inner")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), interceptors=[Pipeline([outer, inner])]
    )
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"One": echo, "Two": echo}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            yield channel, outer, inner
    finally:
        server.stop(0)


def _call(channel: grpc.Channel, method: str, body: bytes, tag: str | None) -> Any:
    metadata = (("x-tag", tag),) if tag is not None else ()
    call = channel.unary_unary(f"/{_SERVICE}/{method}", None, None)
    return call(body, metadata=metadata, timeout=10)


def test_each_method_is_built_once_and_every_call_sees_its_own_metadata(
    served: tuple[grpc.Channel, _Tagging, _Tagging],
) -> None:
    channel, outer, inner = served
    answers = [_call(channel, "One", b"x", f"t{n}") for n in range(5)]
    answers.append(_call(channel, "Two", b"y", None))
    assert answers == [f"outer:t{n}|inner:t{n}|x".encode() for n in range(5)] + [
        b"outer:-|inner:-|y"
    ]
    assert outer.builds == inner.builds == Counter({f"/{_SERVICE}/One": 1, f"/{_SERVICE}/Two": 1})


def test_an_unknown_method_is_unimplemented_and_builds_nothing(
    served: tuple[grpc.Channel, _Tagging, _Tagging],
) -> None:
    channel, outer, _ = served
    with pytest.raises(grpc.RpcError) as raised:
        _call(channel, "Three", b"z", "t")
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not outer.builds
