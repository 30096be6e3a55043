"""etcd's own history of a run: every transition event, read by a watch from revision 1.

The chaos cluster runs with auto-compaction off (chaos/cluster.py), so a watch on
``{p}/events/`` from the first revision replays every event put of the run, each with the
revision of the transaction that wrote it and the request id of the call that caused it
(EventRecord.request_id). The checker settles indefinite operations against it.

Against a deployed coordinator (``--target``) the runner cannot reach etcd; it reads the same
events through ``TaskService.WatchEvents`` (filtered to the run's own queue) instead, which
serves them from etcd with the same revisions and request ids (``from_watch_events``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from chaos.history import Write
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op
from coordinator.store.watch import PrefixWatch, WatchEvent
from coordinator.v1 import tasks_pb2, types_pb2


def parse(key: str, value: bytes, revision: int) -> Write:
    """One event key's put as a Write (a claim's generation is the revision of its txn)."""
    record = decode(EventRecord, value)
    generation = record.claim_generation
    if record.op is Op.CLAIM and generation == 0:
        generation = revision
    return Write(
        task=record.task_id,
        revision=revision,
        op=record.op.value,
        to_state=record.to_state.name,
        request_id=record.request_id,
        attempt_id=record.attempt_id,
        generation=generation,
        at=record.at,
    )


def collect(client: Any, prefix: str, *, timeout: float = 30.0) -> list[Write]:
    """Every event put under ``{prefix}/events/`` since revision 1, in revision order.

    Events are written once and never deleted, so the watch is complete once it has delivered
    as many puts as there are event keys now; a compacted history, or a watch that has not
    delivered them all within ``timeout``, raises RuntimeError.
    """
    events_prefix = f"{prefix}/events/"
    expected = sum(1 for _ in client.get_prefix(events_prefix, keys_only=True))
    writes: list[Write] = []
    lock, complete, compacted = threading.Lock(), threading.Event(), threading.Event()

    def on_events(events: list[WatchEvent]) -> None:
        with lock:
            writes.extend(parse(e.key, e.value, e.mod_revision) for e in events if not e.deleted)
            if len(writes) >= expected:
                complete.set()

    def on_compacted() -> None:
        compacted.set()
        complete.set()

    if not expected:
        return writes
    watch = PrefixWatch(
        client, events_prefix, start_revision=1, on_events=on_events, on_compacted=on_compacted
    ).start()
    try:
        complete.wait(timeout)
    finally:
        watch.close()
    with lock:
        got = sorted(writes, key=lambda w: w.revision)
    if compacted.is_set():
        raise RuntimeError("etcd compacted the history: run the cluster with compaction off")
    if len(got) < expected:
        raise RuntimeError(f"the watch delivered {len(got)} of {expected} events in {timeout}s")
    return got


def from_watch_events(events: Iterable[tasks_pb2.TaskEvent]) -> list[Write]:
    """The events WatchEvents streamed, as Writes in revision order."""
    writes = [
        Write(
            task=e.task_id,
            revision=e.revision,
            op=e.op,
            to_state=types_pb2.TaskState.Name(e.to_state).removeprefix("TASK_STATE_"),
            request_id=e.request_id,
            attempt_id=e.attempt_id,
            generation=e.claim_generation or (e.revision if e.op == Op.CLAIM.value else 0),
            at=e.at.ToNanoseconds() / 1e9,
        )
        for e in events
    ]
    return sorted(writes, key=lambda w: w.revision)
