"""No request reaches INTERNAL: every RPC of every service, with arbitrary field values.

For each method in the .proto descriptors, hypothesis builds requests whose Timestamp, Duration,
enum (unknown numbers included), bytes, string, number and bool fields hold arbitrary values
(bounded sizes, biased to the edges: protobuf's ranges, 2^62, NaN, "..", the live claim's own
ids), nested messages and repeated fields included. Each goes through a real gRPC channel to a
real server with bearer tokens (the worker holding the claim for worker calls, an admin for the
rest). The answer must be a typed status, never INTERNAL or UNKNOWN; a refused call must leave
this test's keyspace exactly as it was; and a request holding a Timestamp or Duration that
breaks protobuf's own rules is never answered OK (issue 24 found {1 s, -5 ns} written).

The store runs on a frozen ManualClock with its background loops off and every lease at 600 s,
so nothing but the calls themselves writes while the test runs: a change seen around a refused
call is that call's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.clock import ManualClock
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.stream_limits import StreamLimits
from coordinator.domain.validation import (
    DURATION_MAX_SECONDS,
    MAX_NANOS,
    TIMESTAMP_MAX_SECONDS,
    TIMESTAMP_MIN_SECONDS,
)
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.server import build_server
from coordinator.server.app import SERVICE_NAMES
from coordinator.server.interceptors.auth import ROLE_TABLE, TokenAuth
from coordinator.server.tokens import TokenFile
from coordinator.store import EtcdKV, Store
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2
from tests import helpers
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS
from tests.helpers import Probe

INPUT = b"the input"
TYPED = frozenset(grpc.StatusCode) - {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
EXAMPLES = 60
STREAM_EXAMPLES = 15
NO_SCAN = 3600.0
_TIMES = ("google.protobuf.Timestamp", "google.protobuf.Duration")
LONG_LEASES = ClaimLimits(min_ttl=600, max_ttl=600)
"""No lease expires while the test runs (etcd would delete the claim key under it)."""

# --- what a field may hold -------------------------------------------------------------------

_INT_EDGES = [0, 1, -1, 2, 600, 2**31 - 1, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63)]
_SECONDS = st.one_of(
    st.sampled_from(
        [
            *_INT_EDGES,
            TIMESTAMP_MIN_SECONDS,
            TIMESTAMP_MIN_SECONDS - 1,
            TIMESTAMP_MAX_SECONDS,
            TIMESTAMP_MAX_SECONDS + 1,
            DURATION_MAX_SECONDS,
            DURATION_MAX_SECONDS + 1,
            -DURATION_MAX_SECONDS - 1,
            1_700_000_000,
            1_700_000_000 + 40 * 86400,
        ]
    ),
    st.integers(-(2**63), 2**63 - 1),
)
_NANOS = st.one_of(
    st.sampled_from([0, 1, -1, MAX_NANOS, MAX_NANOS + 1, -MAX_NANOS - 1, 2 * 10**9]),
    st.integers(-(2**31), 2**31 - 1),
)
_WORDS = [
    "",
    "t-1",
    "t-2",
    "default",
    "garbage",
    ".",
    "..",
    "a/b",
    "a/../b",
    "worker-a",
    "admin-1",
    "E",
    "1",
    "0.1.0",
    "99.0.0",
    "t-1/eff-" + "0" * 64,
    "eff-" + "0" * 64,
    "s3://bucket/key",
    digest_of(INPUT),
    digest_of(b""),
    "sha256:xyz",
    "x" * 1025,
    "t" * 129,
    "a\nb",
    "\x00",
    "é~",
]
# A good value per field name, drawn about as often as an arbitrary one: a request gets past
# its first checks only when most of its fields are good, and the deep paths are where an
# unchecked value would hurt.
_GOOD: dict[str, Any] = {
    "task_id": "t-1",
    "queue": "default",
    "scheduler_epoch": 1,
    "ttl_seconds": 600,
    "expected_state_version": 0,
    "input_digest": digest_of(INPUT),
    "payload_digest": digest_of(b"payload"),
    "node_id": "notify",
    "effect_slot": "email",
    "error_code": "E",
    "reason": "because",
    "revision": 1,
    "job_id": "job-1",
    "host": "host-1",
    "pid": 42,
    "start_ticks": 7,
    "argv": ["run"],
    "max_tasks": 2,
    "wait_seconds": 0.1,
    "page_size": 2,
}
_TEXT = st.one_of(st.sampled_from(_WORDS), st.text(max_size=60))
_BYTES = st.one_of(st.sampled_from([b"", INPUT, b"\xff" * 3]), st.binary(max_size=64))
_DOUBLES = st.one_of(
    st.sampled_from([0.0, 0.1, -1.0, math.nan, math.inf, -math.inf, 1e308, 5e-324]),
    st.floats(),
)
_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}


def _integers(cpp_type: int) -> st.SearchStrategy[int]:
    low, high = _RANGES[cpp_type]
    edges = [n for n in _INT_EDGES if low <= n <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        return _BYTES if field.type == FieldDescriptor.TYPE_BYTES else _TEXT
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _integers(FieldDescriptor.CPPTYPE_INT32))
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_DOUBLE:
        return _DOUBLES
    if cpp == FieldDescriptor.CPPTYPE_FLOAT:
        return st.floats(width=32)
    return _integers(cpp)


def _message(descriptor: Descriptor, live: dict[str, Any], depth: int = 0) -> Any:
    """Messages of ``descriptor`` with each field unset, good or arbitrary; ``live`` holds the
    good values only the running server has (the claim's Fence by type, an effect id by field
    name), so calls get past the fence."""
    name = descriptor.full_name
    if name in _TIMES:
        cls = message_factory.GetMessageClass(descriptor)
        return st.builds(cls, seconds=_SECONDS, nanos=_NANOS)
    arbitrary = st.fixed_dictionaries(
        {},
        optional={f.name: _field(f, live, depth) for f in descriptor.fields},
    ).map(lambda values: _build(descriptor, values))
    if name in live:
        return st.one_of(st.just(live[name]), arbitrary)
    return arbitrary


def _field(field: FieldDescriptor, live: dict[str, Any], depth: int) -> Any:
    if field.message_type is not None:
        if depth >= 2:
            return st.nothing()
        one = _message(field.message_type, live, depth + 1)
    else:
        one = _scalar(field)
    values = st.lists(one, max_size=3) if field.is_repeated else one
    good = live.get(field.name, _GOOD.get(field.name))
    return values if good is None else st.one_of(st.just(good), values)


def _build(descriptor: Descriptor, values: dict[str, Any]) -> Message:
    message = message_factory.GetMessageClass(descriptor)()
    for name, value in values.items():
        field = descriptor.fields_by_name[name]
        target = getattr(message, name)
        if field.is_repeated and field.message_type is not None:
            for item in value:
                target.add().CopyFrom(item)
        elif field.is_repeated:
            target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def _breaks_protobuf(message: Message) -> bool:
    """Whether a Timestamp or Duration set anywhere in ``message`` breaks protobuf's own rules
    (its JSON form, which protobuf builds only for a well-formed value, fails)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in value if field.is_repeated else [value]:
            if field.message_type.full_name in _TIMES:
                try:
                    item.ToJsonString()
                except ValueError:
                    return True
            elif _breaks_protobuf(item):
                return True
    return False


# --- the server ------------------------------------------------------------------------------


def _methods() -> list[MethodDescriptor]:
    pool = descriptor_pool.Default()
    return [m for s in SERVICE_NAMES for m in pool.FindServiceByName(s).methods]


METHODS = _methods()


@pytest.fixture
def store(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Store]:
    """A store whose only writers are the test's calls: frozen clock, no background loops."""
    kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
    store = Store.open(
        kv,
        keys=Keyspace(prefix),
        limits=LONG_LEASES,
        clock=ManualClock(),
        scan_interval=NO_SCAN,
        metrics=metrics,
    )
    store.start(reclaim=False)
    try:
        yield store
    finally:
        store.close()
        kv.close()


@pytest.fixture
def ring(tmp_path: Path) -> TokenRing:
    """A worker's and an admin's bearer tokens."""
    ring = TokenRing(tmp_path / "tokens.json")
    ring.issue("worker-a", ["worker"])
    ring.issue("admin-1", ["admin"])
    return ring


@pytest.fixture
def server(store: Store, ring: TokenRing) -> Iterator[str]:
    """A server demanding ``ring``'s tokens; long polls wait at most 0.2 s."""
    auth = TokenAuth(TokenFile(ring.path, reload_interval=60.0))
    srv, port = build_server(
        store,
        listen="127.0.0.1:0",
        max_workers=8,
        auth=auth,
        streams=StreamLimits(max_claim_wait=0.2),
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        srv.stop(grace=None).wait()


def _caller(method: MethodDescriptor) -> str:
    """The claim's holder where a worker may call, else the admin."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    return "worker-a" if "worker" in {r.value for r in ROLE_TABLE[path]} else "admin-1"


def _live_fence(channel: grpc.Channel, ring: TokenRing) -> types_pb2.Fence:
    """Task t-1 created by the admin and claimed by worker-a: the fence arbitrary calls reuse."""
    admin = ring.metadata("admin-1")
    create = channel.unary_unary(
        "/coordinator.v1.TaskService/CreateTask",
        tasks_pb2.CreateTaskRequest.SerializeToString,
        tasks_pb2.CreateTaskResponse.FromString,
    )
    create(tasks_pb2.CreateTaskRequest(task_id="t-1", input=INPUT), metadata=admin)
    claim = channel.unary_unary(
        "/coordinator.v1.WorkerService/Claim",
        worker_pb2.ClaimRequest.SerializeToString,
        worker_pb2.ClaimResponse.FromString,
    )
    answer: worker_pb2.ClaimResponse = claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=600),
        metadata=ring.metadata("worker-a"),
    )
    assert answer.outcome == types_pb2.OUTCOME_CLAIMED, answer.message
    return answer.fence


def _live_effect(channel: grpc.Channel, ring: TokenRing, fence: types_pb2.Fence) -> str:
    """An effect the live claim prepared: its id is a good ``effect_id``."""
    prepare = channel.unary_unary(
        "/coordinator.v1.WorkerService/PrepareEffect",
        worker_pb2.PrepareEffectRequest.SerializeToString,
        worker_pb2.PrepareEffectResponse.FromString,
    )
    request = worker_pb2.PrepareEffectRequest(
        fence=fence, node_id="notify", effect_slot="email", payload_digest=_GOOD["payload_digest"]
    )
    effect_id: str = prepare(request, metadata=ring.metadata("worker-a")).effect_id
    assert effect_id
    return effect_id


def _send(
    channel: grpc.Channel, method: MethodDescriptor, request: Message, metadata: Any
) -> tuple[grpc.StatusCode, str]:
    """The status the call ends with; a stream is cut after its first message."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    response = message_factory.GetMessageClass(method.output_type)
    if not method.server_streaming:
        unary = channel.unary_unary(path, type(request).SerializeToString, response.FromString)
        try:
            unary(request, metadata=metadata, timeout=15)
        except grpc.RpcError as exc:
            return exc.code(), str(exc.details())
        return grpc.StatusCode.OK, ""
    stream = channel.unary_stream(path, type(request).SerializeToString, response.FromString)
    call = stream(request, metadata=metadata, timeout=0.5)
    try:
        next(iter(call))
    except StopIteration:
        pass
    except grpc.RpcError as exc:
        return exc.code(), str(exc.details())
    finally:
        helpers.cancel(call)
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_no_request_reaches_internal(
    method: MethodDescriptor,
    server: str,
    ring: TokenRing,
    keyspace: Probe,
) -> None:
    with grpc.insecure_channel(server, options=GRPC_OPTIONS) as channel:
        fence = _live_fence(channel, ring)
        live: dict[str, Any] = {
            "coordinator.v1.Fence": fence,
            "effect_id": _live_effect(channel, ring, fence),
        }
        metadata = ring.metadata(_caller(method))
        examples = STREAM_EXAMPLES if method.server_streaming else EXAMPLES

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(request=_message(method.input_type, live))
        def answers_typed(request: Message) -> None:
            before = keyspace()
            code, details = _send(channel, method, request, metadata)
            assert code in TYPED, f"{method.name} answered {code.name}: {details}"
            if _breaks_protobuf(request):
                assert code is not grpc.StatusCode.OK, "a broken Timestamp or Duration was taken"
            if code is not grpc.StatusCode.OK and code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                assert keyspace() == before, f"refused {code.name} yet wrote: {details}"

        answers_typed()
