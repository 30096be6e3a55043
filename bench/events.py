"""Memory per event reader: the coordinator's RSS while event streams misbehave.

Two readings on a freshly started coordinator (issue: WatchEvents amplified memory):

- a follow stream whose client never reads, while ``count // 2`` events are written: its
  server-side inbox is bounded, so RSS stays flat (the stream is ended behind, then cut);
- ``callers`` clients streaming the whole history of ``count`` events at once: history is read
  in bounded passes, so RSS grows by a bounded amount per caller, not by the log's size.

Events are written straight into the keyspace (an event key per task, as CreateTask writes it),
in batches, so that 100k take seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, Meter, rss_mib
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import EventRecord, encode
from coordinator.domain.states import Op, TaskState
from coordinator.sdk import PRINCIPAL_METADATA
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.ops import put
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc

_BATCH = 100
_READER = ((PRINCIPAL_METADATA, "bench-reader"),)


def write_events(kv: EtcdKV, keys: Keyspace, first: int, count: int) -> None:
    """``count`` creation events of tasks ``ev.{first}`` onwards."""
    now = time.time()
    for start in range(first, first + count, _BATCH):
        ops = [
            put(
                keys.event(f"ev.{i:07d}", 0),
                encode(EventRecord(f"ev.{i:07d}", Op.CREATE, TaskState.READY, now, by="bench")),
            )
            for i in range(start, min(start + _BATCH, first + count))
        ]
        kv.txn([], ops)


class PeakRss:
    """Samples a process's RSS every 50 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mib(self._pid))


def read_whole_log(
    stub: tasks_pb2_grpc.TaskServiceStub,
    metadata: tuple[tuple[str, str], ...],
    received: list[int],
    index: int,
    *,
    patience: float,
    timeout: float | None = None,
    refused: Callable[[str], None] = lambda code: None,
) -> None:
    """Replay the whole event log, counting its events into ``received[index]``. Past its
    replay slots (max_replays) a replay is refused RESOURCE_EXHAUSTED before it reads anything;
    the reader asks again every 0.2 s, as the SDK's retry does, for ``patience`` seconds. Every
    failed try's code goes to ``refused``; any other error, or a refusal past the patience, is
    raised (``received[index]`` then holds what that try read)."""
    until = time.monotonic() + patience
    while True:
        received[index] = 0
        try:
            for _ in stub.WatchEvents(
                tasks_pb2.WatchEventsRequest(), metadata=metadata, timeout=timeout
            ):
                received[index] += 1
            return
        except grpc.RpcError as exc:
            refused(exc.code().name)
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > until:
                raise
            time.sleep(0.2)


def run_daemons(target: Callable[[int], None], count: int) -> None:
    """``target(0)`` ... ``target(count - 1)`` on threads of their own, until all return.
    Daemons: a phase cut off at the bench's time bound must not hold its exit."""
    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_events(
    target: str, kv: EtcdKV, keys: Keyspace, meter: Meter, *, count: int, callers: int
) -> dict[str, Any]:
    """Both readings; the figures in MiB and seconds."""
    pid = meter.coordinator_pid
    channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
    stub = tasks_pb2_grpc.TaskServiceStub(channel)
    try:
        fresh = rss_mib(pid)
        stalled = stub.WatchEvents(tasks_pb2.WatchEventsRequest(follow=True), metadata=_READER)
        with PeakRss(pid) as during_writes:
            write_events(kv, keys, 0, count // 2)
            meter.settle(limit=30)
        stalled.cancel()  # type: ignore[no-untyped-call]
        write_events(kv, keys, count // 2, count - count // 2)
        meter.settle(limit=30)
        before_history = rss_mib(pid)
        received = [0] * callers

        def read_all(index: int) -> None:
            # One principal each: the server caps open streams per principal.
            who = ((PRINCIPAL_METADATA, f"bench-reader-{index}"),)
            read_whole_log(stub, who, received, index, patience=600.0, timeout=600.0)

        started = time.monotonic()
        with PeakRss(pid) as during_history:
            run_daemons(read_all, callers)
        history_s = time.monotonic() - started
    finally:
        channel.close()
    result = {
        "events": count,
        "history_callers": callers,
        "coordinator_rss_mib_fresh": round(fresh, 1),
        "rss_growth_mib_nonreading_follower": round(during_writes.peak - fresh, 1),
        "rss_growth_mib_history_callers": round(during_history.peak - before_history, 1),
        "history_s": round(history_s, 1),
        "history_events_each": sorted(set(received)),
    }
    follower, history = (
        result["rss_growth_mib_nonreading_follower"],
        result["rss_growth_mib_history_callers"],
    )
    say(f"events: {count}; non-reading follower +{follower} MiB, {callers} readers +{history} MiB")
    return result
