"""Request ids: sent by the SDK per logical call, stored in the event the call's txn writes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator import request_ids
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import CallRetry, Claim, TransportError
from coordinator.sdk._rpc import Rpc
from tests.helpers import as_unary
from tests.sdk.support import QUEUE, served
from tests.store.support import events


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "down"


def test_one_id_per_logical_call_the_same_on_every_retry() -> None:
    sent: list[str] = []

    def method(request: Any, *, timeout: float, metadata: Any) -> Any:
        sent.append(dict(metadata)[request_ids.METADATA_KEY])
        raise _Unavailable()

    policy = CallRetry(attempts=3, initial_backoff=timedelta(milliseconds=1))
    rpc = Rpc("127.0.0.1:1", principal="w", retry=policy)
    try:
        for _ in range(2):
            with pytest.raises(TransportError):
                rpc.call(as_unary(method), None)
        with request_ids.bound("chosen-1"), pytest.raises(TransportError):
            rpc.call(as_unary(method), None)
    finally:
        rpc.close()
    assert len(sent) == 9
    first, second, chosen = sent[0:3], sent[3:6], sent[6:9]
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
    assert len(first[0]) == 32 and request_ids.is_valid(first[0])
    assert chosen == ["chosen-1"] * 3


def test_the_event_of_each_transition_carries_the_callers_request_id(
    etcd: EtcdProcess, etcd_client: Any, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as running, running.client("w1") as client:
        with request_ids.bound("create-7"):
            client.create_task("t1", input=b"x", queue=QUEUE)
        with request_ids.bound("claim-7"):
            claim = client.claim("t1", ttl=timedelta(seconds=5))
        assert isinstance(claim, Claim)
        with request_ids.bound("commit-7"):
            assert claim.commit(b"r").outcome.name == "COMMITTED"
        client.create_task("t2", input=b"y", queue=QUEUE)  # no id bound: the SDK makes one
        got = events(running.store, etcd_client, "t1")
        fresh = events(running.store, etcd_client, "t2")
    assert [(e.op, e.request_id) for e in got] == [
        (Op.CREATE, "create-7"),
        (Op.CLAIM, "claim-7"),
        (Op.COMMIT, "commit-7"),
    ]
    assert len(fresh) == 1 and len(fresh[0].request_id) == 32


def test_a_malformed_id_is_not_stored_and_old_events_still_decode() -> None:
    assert not request_ids.is_valid("has space") and not request_ids.is_valid("x" * 129)
    old = b'{"at":1.5,"op":"CLAIM","task_id":"t1","to_state":"CLAIMED"}'
    assert decode(EventRecord, old).request_id == ""
