"""Fair renewals (issue 25 item 2): one principal's flood of RenewMany calls of made-up fences
cannot take another principal's claims past their TTL. Made-up fences are refused from the
claimed index (tests/store/test_renew_screen.py), and a principal runs at most
``max_calls_per_principal`` unary calls at once on a replica
(coordinator.server.interceptors.call_shares). A real server over a real etcd; callers name
themselves (insecure mode)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import grpc
import pytest

from bench.hostile_flood import made_up
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, ClaimRefused
from coordinator.store import Renewal, RenewAnswer
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.lifecycle.support import who
from tests.sdk.support import QUEUE, Served, served

TTL = timedelta(seconds=3)  # the SDK renews every second
SHARE = 8  # build_server's default max_calls_per_principal
FLOODERS = 40  # more than the replica's 32 unary threads, five times the share


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


class Flood:
    """``FLOODERS`` threads of principal "flooder" sending RenewMany of 1,000 made-up fences
    back to back from a process of their own (tests/server/flooder.py); ``result`` is what
    they got back once stopped."""

    def __init__(self, target: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.server.flooder", target, str(FLOODERS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.result: dict[str, dict[str, int]] = {}

    def __enter__(self) -> Flood:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            out, _ = self._process.communicate("", timeout=30)  # stdin closes: it stops
        finally:
            self._process.kill()
            self._process.wait()
        self.result = json.loads(out)


def _hold(coordinator: Served, count: int, stack: ExitStack) -> list[Claim]:
    with coordinator.client("producer") as producer:
        for n in range(count):
            producer.create_task(f"t{n:03d}", input=b"x", queue=QUEUE)
    holder = stack.enter_context(coordinator.client("holder"))
    claims = []
    for _ in range(count):
        claim = holder.claim_next(QUEUE, ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        claims.append(stack.enter_context(claim))
    return claims


@pytest.mark.slow
def test_a_flood_of_made_up_fences_loses_no_legitimate_claim(coordinator: Served) -> None:
    with ExitStack() as stack:
        claims = _hold(coordinator, 200, stack)
        with Flood(coordinator.target) as flood:
            start = [c.renewals for c in claims]
            # Every claim renewed three more times (three TTLs) while the flood ran, or one lost.
            eventually(
                lambda: (
                    any(c.is_lost() for c in claims)
                    or all(c.renewals >= s + 3 for c, s in zip(claims, start, strict=True))
                ),
                timeout=60,
                message="legitimate renewals fell behind the flood",
            )
        assert [c.task_id for c in claims if c.is_lost()] == []
    # The flood was real: answered (every made-up fence FENCED) and refused past its bounds.
    codes, outcomes = flood.result["codes"], flood.result["outcomes"]
    assert codes["OK"] > 0 and codes["RESOURCE_EXHAUSTED"] > 0
    assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}
    assert set(outcomes) == {str(types_pb2.OUTCOME_FENCED)}


def test_a_principal_past_its_share_is_refused_while_others_are_served(
    coordinator: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SHARE`` calls of one principal held in the handler: its next call is refused
    RESOURCE_EXHAUSTED naming the setting, before it runs; another principal is answered."""
    renewals = coordinator.store.renewals
    real = renewals.renew_many
    release, held = threading.Event(), threading.Semaphore(0)

    def slow(items: list[Renewal], *, principal: str) -> list[RenewAnswer]:
        if principal == "slow":
            held.release()
            release.wait(30)
        return real(items, principal=principal)

    monkeypatch.setattr(renewals, "renew_many", slow)
    channel = grpc.insecure_channel(coordinator.target, options=GRPC_OPTIONS)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    request = worker_pb2.RenewManyRequest(renewals=made_up(0).renewals[:10])  # within the rate
    refused_before = _refused(coordinator)
    with ThreadPoolExecutor(SHARE) as pool:
        calls: list[Future[Any]] = [
            pool.submit(stub.RenewMany, request, metadata=who("slow"), timeout=30)
            for _ in range(SHARE)
        ]
        for _ in range(SHARE):
            assert held.acquire(timeout=10)  # every one of them in the handler
        with pytest.raises(grpc.RpcError) as info:
            stub.RenewMany(request, metadata=who("slow"), timeout=10)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_calls_per_principal" in (info.value.details() or "")
        other = stub.RenewMany(request, metadata=who("other"), timeout=10)
        assert {r.renewal.outcome for r in other.results} == {types_pb2.OUTCOME_FENCED}
        release.set()
        assert all(len(call.result(timeout=30).results) == 10 for call in calls)
    # Its share is free again.
    assert len(stub.RenewMany(request, metadata=who("slow"), timeout=10).results) == 10
    assert _refused(coordinator) == refused_before + 1
    channel.close()


def _refused(coordinator: Served) -> float:
    registry = coordinator.store.ctx.metrics.registry
    sample = registry.get_sample_value(
        "coordinator_calls_refused_total", {"reason": "principal_share"}
    )
    return sample or 0.0
