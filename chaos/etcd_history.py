"""etcd's own history of a run: every transition event and every effect write, read by a
watch from revision 1.

The chaos cluster runs with auto-compaction off (chaos/cluster.py), so a watch on
``{p}/events/`` from the first revision replays every event put of the run, each with the
revision of the transaction that wrote it and the request id of the call that caused it
(EventRecord.request_id). The checker settles indefinite operations against it. Likewise a
watch on ``{p}/effects/`` from the first revision replays every write of an effect record, each
with the request id of the call that wrote it (EffectRecord.request_id: ``collect_effects``).

Against a deployed coordinator (``--target``) the runner cannot reach etcd; it reads the same
events through ``TaskService.WatchEvents`` (filtered to the run's own queue) instead, which
serves them from etcd with the same revisions and request ids (``from_watch_events``); no RPC
serves the effect keys' history, so there indefinite effect calls stay unsettled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from chaos.history import EffectWrite, EtcdWrite
from coordinator.domain.effects import EffectRecord
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.retry import UNDELIVERED_COUNTED
from coordinator.domain.states import Op, TaskState
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent
from coordinator.store.lifecycle.event_hub import position_of_key
from coordinator.v1 import tasks_pb2

T = TypeVar("T")


def parse(key: str, value: bytes, revision: int) -> EtcdWrite:
    """One event key's put as a EtcdWrite (a claim's generation is the revision of its txn)."""
    record = decode(EventRecord, value)
    generation = record.claim_generation
    if record.op is Op.CLAIM and generation == 0:
        generation = revision
    return EtcdWrite(
        task=record.task_id,
        revision=revision,
        op=record.op,
        to_state=record.to_state,
        request_id=record.request_id,
        attempt_id=record.attempt_id,
        generation=generation,
        at=record.at,
        prev_state_version=position_of_key(key, revision).prev_state_version,
        given_back=given_back(record.op, record.detail),
    )


def given_back(op: Op, detail: str) -> bool:
    """Whether an event gave back an undelivered claim (counted or not)."""
    return op is Op.GIVE_BACK or detail.endswith(UNDELIVERED_COUNTED)


def collect(client: Any, prefix: str, *, timeout: float = 30.0) -> list[EtcdWrite]:
    """Every event put under ``{prefix}/events/`` since revision 1, in log order (revision,
    then task, then prev_state_version: coordinator/domain/positions.py)."""
    writes = _replay(
        client, f"{prefix}/events/", lambda e: parse(e.key, e.value, e.mod_revision), timeout
    )
    return sorted(writes, key=lambda w: w.position)


def parse_effect(value: bytes, revision: int) -> EffectWrite:
    """One effect key's put as an EffectWrite."""
    record = decode(EffectRecord, value)
    return EffectWrite(
        effect_id=record.effect_id,
        task=record.task_id,
        revision=revision,
        state=record.state,
        request_id=record.request_id,
    )


def collect_effects(client: Any, prefix: str, *, timeout: float = 30.0) -> list[EffectWrite]:
    """Every put of an effect key under ``{prefix}/effects/`` since revision 1, in revision
    order (an effect key is written once per prepare, record, resolve or approval, each time
    with the request id of the call: EffectRecord.request_id)."""
    return _replay(
        client, f"{prefix}/effects/", lambda e: parse_effect(e.value, e.mod_revision), timeout
    )


def _replay(
    client: Any, prefix: str, parse_one: Callable[[WatchEvent], T], timeout: float
) -> list[T]:
    """Every put under ``prefix`` since revision 1, parsed, in revision order.

    The watch is complete once it has delivered the newest mod_revision among the keys there
    now (events are never rewritten, effect keys are: either way the newest write is the last
    one the replay must reach); a compacted history, or a watch that has not got there within
    ``timeout``, raises RuntimeError.
    """
    newest = max((m.mod_revision for _, m in client.get_prefix(prefix, keys_only=True)), default=0)
    found: list[tuple[int, T]] = []
    reached = [0]  # the highest revision delivered
    lock, complete, compacted = threading.Lock(), threading.Event(), threading.Event()

    def on_events(events: list[WatchEvent]) -> None:
        with lock:
            found.extend((e.mod_revision, parse_one(e)) for e in events if not e.deleted)
            reached[0] = max([reached[0], *(e.mod_revision for e in events)])
            if reached[0] >= newest:
                complete.set()

    def on_compacted() -> None:
        compacted.set()
        complete.set()

    if not newest:
        return []
    watch = PrefixWatch(
        client, prefix, start_revision=1, on_events=on_events, on_compacted=on_compacted
    ).start()
    try:
        complete.wait(timeout)
    finally:
        watch.close()
    if compacted.is_set():
        raise RuntimeError("etcd compacted the history: run the cluster with compaction off")
    with lock:
        if reached[0] < newest:
            raise RuntimeError(
                f"the watch of {prefix} reached revision {reached[0]} of {newest} in {timeout}s"
            )
        return [item for _, item in sorted(found, key=lambda pair: pair[0])]


def from_watch_event(e: tasks_pb2.TaskEvent) -> EtcdWrite:
    """One event WatchEvents streamed, as a EtcdWrite."""
    op = Op(e.op)
    return EtcdWrite(
        task=e.task_id,
        revision=e.revision,
        op=op,
        to_state=TaskState(e.to_state),
        request_id=e.request_id,
        attempt_id=e.attempt_id,
        generation=e.claim_generation or (e.revision if op is Op.CLAIM else 0),
        at=e.at.ToNanoseconds() / 1e9,
        prev_state_version=e.prev_state_version,
        given_back=given_back(op, e.detail),
    )


def from_watch_events(events: Iterable[tasks_pb2.TaskEvent]) -> list[EtcdWrite]:
    """The events WatchEvents streamed, as Writes in log order (revision, then task, then
    prev_state_version: several events share a revision)."""
    return sorted((from_watch_event(e) for e in events), key=lambda w: w.position)
