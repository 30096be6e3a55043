"""Long-lived calls are bounded: per principal, per replica and in age, and they never take the
threads unary calls need (coordinator.server.streams). A real server over a real etcd; callers
name themselves (insecure mode), so one test can be many principals.
"""

from __future__ import annotations

import itertools
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator import lifeline
from coordinator.domain.digests import digest_of
from coordinator.domain.stream_limits import StreamLimits
from coordinator.server import build_server
from coordinator.server.interceptors.auth import Authenticator
from coordinator.store import Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.conftest import GRPC_OPTIONS
from tests.helpers import cancel, eventually, next_of
from tests.lifecycle.support import create, who

FOLLOW = tasks_pb2.WatchEventsRequest(follow=True)
PM = who("pm-1", "pm")
WORKER = who("worker-r", "worker")
Serve = Callable[..., grpc.Channel]


@pytest.fixture
def serve(store: Store) -> Iterator[Serve]:
    """Start a server with the given stream limits; returns a channel to it. The open-streams
    gauge is the process's: teardown waits until this test's streams left it."""
    baseline = _open_gauge(store)
    stack: list[tuple[grpc.Server, grpc.Channel]] = []

    def start(
        limits: StreamLimits, *, max_workers: int = 8, auth: Authenticator | None = None
    ) -> grpc.Channel:
        server, port = build_server(
            store,
            listen="127.0.0.1:0",
            max_workers=max_workers,
            streams=limits,
            health_interval=0.2,
            auth=auth,
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
        stack.append((server, channel))
        return channel

    yield start
    for server, channel in reversed(stack):
        channel.close()
        server.stop(grace=None).wait()
    eventually(lambda: _open_gauge(store) == baseline, message="streams still counted after stop")


def _open_gauge(store: Store) -> float:
    return store.ctx.metrics.registry.get_sample_value("coordinator_streams_open") or 0.0


@dataclass
class Opened:
    """Streams one principal tried to open: those admitted, and the refusals' (code, text)."""

    admitted: list[grpc.CallIterator[tasks_pb2.TaskEvent]] = field(default_factory=list)
    refused: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)


def _open(tasks: tasks_pb2_grpc.TaskServiceStub, principal: str, count: int) -> Opened:
    """Open ``count`` follow streams as ``principal``; one is admitted once it delivers the log's
    first event (the test created a task, so there is one)."""
    opened = Opened()
    for _ in range(count):
        call = tasks.WatchEvents(FOLLOW, metadata=who(principal))
        try:
            next_of(call)
        except grpc.RpcError as exc:
            opened.refused.append((exc.code(), exc.details() or ""))
        else:
            opened.admitted.append(call)
    return opened


class Probe:
    """Health checks and Renews of a real claim, back to back, each with a 1 s deadline, on a
    thread of its own until stopped; records every call that did not answer."""

    def __init__(self, channel: grpc.Channel, fence: types_pb2.Fence) -> None:
        self._health = health_pb2_grpc.HealthStub(channel)
        self._worker = worker_pb2_grpc.WorkerServiceStub(channel)
        self._fence = fence
        self._stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        for step in itertools.count():
            if self._stop.is_set():
                return
            # A starved pool blocks a call for good; 5 s only keeps a busy CI machine's slow
            # answer (1 s failed once at a load of 15 on 2 cores) from reading as starvation.
            try:
                health = self._health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                renew = self._worker.Renew(
                    worker_pb2.RenewRequest(fence=self._fence, progress=str(step)),
                    metadata=WORKER,
                    timeout=5,
                )
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code().name}: {exc.details()}")
                continue
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert renew.outcome == types_pb2.OUTCOME_OK, renew.message
            self.answered += 1


def _claim(channel: grpc.Channel) -> types_pb2.Fence:
    """Create task "t-1" (its event is the first every stream delivers) and claim it."""
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    data = b"{}"
    tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="t-1", input=data, input_digest=digest_of(data)),
        metadata=PM,
    )
    epoch = admin_pb2_grpc.AdminServiceStub(channel).GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker_pb2_grpc.WorkerServiceStub(channel).Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=WORKER,
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim.fence


PER_PRINCIPAL = "max_streams_per_principal"
SERVER_FULL = "its limit (max_streams)"


def test_streams_past_their_caps_are_refused_and_unary_calls_keep_answering(
    serve: Serve, store: Store
) -> None:
    # 8 threads for unary calls + 24 for streams = 32, the pool the issue was reported on; 400
    # streams are tried, far past it.
    channel = serve(StreamLimits(max_streams=24, max_per_principal=6), max_workers=8)
    fence = _claim(channel)
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    before = _open_gauge(store)
    with Probe(channel, fence) as probe:
        greedy = _open(tasks, "greedy", 200)
        # 20 others, 10 streams each: the first finds its guaranteed 6 in the quarter greedy
        # could not borrow, then the replica is full.
        others = {f"other-{n}": _open(tasks, f"other-{n}", 10) for n in range(20)}
        eventually(lambda: probe.answered >= 5, message="no probe answered with streams open")
        answered_while_full = probe.answered

        # greedy borrowed every idle slot but the last quarter (24 - 6).
        assert (len(greedy.admitted), len(greedy.refused)) == (18, 182)
        assert (len(others["other-0"].admitted), len(others["other-0"].refused)) == (6, 4)
        for n in range(1, 20):
            assert (len(others[f"other-{n}"].admitted), len(others[f"other-{n}"].refused)) == (
                0,
                10,
            )
        refusals = greedy.refused + [r for o in others.values() for r in o.refused]
        assert {code for code, _ in refusals} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        by_cap = [text for _, text in refusals if PER_PRINCIPAL in text]
        by_server = [text for _, text in refusals if SERVER_FULL in text]
        assert (len(by_cap), len(by_server)) == (182 + 4, 19 * 10)
        assert greedy.refused[0][1].startswith(
            "principal 'greedy' already holds its share of 6 open streams or more"
        )
        assert _open_gauge(store) - before == 24

        # Closing streams frees their slots: greedy may open 18 again, and not a 19th.
        for opened in (greedy, *others.values()):
            for call in opened.admitted:
                cancel(call)
        eventually(lambda: _open_gauge(store) == before, message="closed streams kept their slots")
        again = _open(tasks, "greedy", 19)
        assert (len(again.admitted), len(again.refused)) == (18, 1)
        eventually(lambda: probe.answered > answered_while_full)
        for call in again.admitted:
            cancel(call)
    assert probe.failures == []


def test_calls_past_the_servers_concurrency_limit_are_refused_resource_exhausted(
    serve: Serve, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 threads for unary calls + 2 for streams: grpc's maximum_concurrent_rpcs is 4.
    channel = serve(StreamLimits(max_streams=2, max_per_principal=8), max_workers=2)
    create(store, "t-1")
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    check = health_pb2.HealthCheckRequest()
    serving = health_pb2.HealthCheckResponse.SERVING
    # Streams alone never reach the limit: past their own bound they are refused by it, and
    # the unary threads stay free (what docs/operations.md promises).
    streams = _open(tasks, "reader", 3)
    assert len(streams.admitted) == 2
    assert [code for code, _ in streams.refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert SERVER_FULL in streams.refused[0][1]
    assert health.Check(check, timeout=5).status == serving
    # Two unary calls held in their handlers take the two unary threads: the replica is full.
    inside, release = threading.Semaphore(0), threading.Event()
    real_get = store.tasks.get

    def held_get(task_id: str) -> Any:
        inside.release()
        release.wait(30)
        return real_get(task_id)

    monkeypatch.setattr(store.tasks, "get", held_get)
    get = tasks_pb2.GetTaskRequest(task_id="t-1")
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(tasks.GetTask, get, metadata=PM, timeout=30) for _ in range(2)]
        try:
            for _ in held:
                assert inside.acquire(timeout=10), "a held call never reached its handler"
            for call in (lambda: health.Check(check, timeout=5), lambda: tasks.GetTask(get)):
                with pytest.raises(grpc.RpcError) as info:
                    call()  # refused at once, typed: not queued past its deadline
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert info.value.details() == "Concurrent RPC limit exceeded!"
        finally:
            release.set()
        assert [f.result().task.task_id for f in held] == ["t-1", "t-1"]
    assert health.Check(check, timeout=5).status == serving  # capacity is back
    for stream in streams.admitted:
        cancel(stream)


def test_a_stream_past_its_max_age_ends_unavailable_naming_the_setting(
    serve: Serve, store: Store
) -> None:
    channel = serve(StreamLimits(max_age=1.0))
    create(store, "t-1")
    before = _open_gauge(store)
    call = tasks_pb2_grpc.TaskServiceStub(channel).WatchEvents(FOLLOW, metadata=PM, timeout=30)
    assert next_of(call).task_id == "t-1"
    with pytest.raises(grpc.RpcError) as info:
        next_of(call)  # nothing more happens: the server ends the stream at its age
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # what clients retry
    assert info.value.details() == (
        "stream reached its maximum age (1 s, max_stream_age); resume from your last position"
    )
    eventually(lambda: _open_gauge(store) == before, message="the ended stream kept its slot")


def test_events_follow_resumes_after_max_age_without_repeating_an_event(
    serve: Serve, store: Store
) -> None:
    channel = serve(StreamLimits(max_age=1.0))
    target = channel._channel.target().decode()  # type: ignore[attr-defined]
    create(store, "first")
    command = "from coordinator.cli import main; main()"
    process = subprocess.Popen(
        [sys.executable, "-c", command, "events", "--follow", "--target", target, "--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lifeline.kill_with_parent(process.pid)  # dies with this test run
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None and process.stderr is not None
    for stream, lines in ((process.stdout, out), (process.stderr, err)):
        threading.Thread(
            target=lambda s=stream, q=lines: [q.put(x) for x in s], daemon=True
        ).start()
    try:
        first = out.get(timeout=20)
        assert " first -->READY op=create " in first
        broke = err.get(timeout=20)
        assert broke.startswith("# stream broke (stream reached its maximum age (1 s")
        assert broke.rstrip().endswith(f"resuming after {int(first.split()[0])}/first/0")
        create(store, "second")
        assert " second -->READY op=create " in out.get(timeout=20)
        assert out.empty()  # "first" was not printed again
        assert process.poll() is None  # still following
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_stream_that_never_checks_is_cut_after_its_age_with_the_age_status(
    serve: Serve, store: Store
) -> None:
    # gRPC's health Watch never asks whether to go on: the sweep cuts it, with the status it
    # would have ended with (what clients retry), not a bare CANCELLED.
    channel = serve(StreamLimits(max_age=1.0, sweep_interval=0.1, stuck_grace=0.2))
    before = _open_gauge(store)
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next_of(call).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        for _ in call:  # a status every health interval, until the cancel
            pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (info.value.details() or "").startswith("stream reached its maximum age (1 s")
    ended = store.ctx.metrics.registry.get_sample_value
    assert ended("coordinator_streams_ended_total", {"reason": "max_age"}) == 1
    assert ended("coordinator_streams_ended_total", {"reason": "cancelled"}) == 1
    eventually(lambda: _open_gauge(store) == before, message="the cut stream kept its slot")


def test_unauthenticated_streams_share_one_principal_cap(serve: Serve, store: Store) -> None:
    channel = serve(StreamLimits(max_per_principal=2))
    health = health_pb2_grpc.HealthStub(channel)
    calls: list[Any] = []  # the calls are iterators and grpc.Call both
    try:
        for _ in range(2):
            calls.append(health.Watch(health_pb2.HealthCheckRequest(), timeout=30))
            assert next_of(calls[-1]).status == health_pb2.HealthCheckResponse.SERVING
        calls.append(health.Watch(health_pb2.HealthCheckRequest(), timeout=30))
        with pytest.raises(grpc.RpcError) as info:
            next_of(calls[-1])
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (info.value.details() or "").startswith(
            "unauthenticated callers (who share one count) already hold 2 open streams"
        )
        # A principal of its own still opens one.
        stream = tasks_pb2_grpc.TaskServiceStub(channel).WatchEvents(FOLLOW, metadata=PM)
        create(store, "t-1")
        assert next_of(stream).task_id == "t-1"
        cancel(stream)
    finally:
        for call in calls:
            cancel(call)
