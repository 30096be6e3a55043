"""Pruning tasks whose history does not fit in one gRPC message (4 MiB): a task with 12,000
attempts and thousands of events, and tasks holding the largest records the server accepts.
Each is read page by page at one revision, archived whole, and pruned with every key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.digests import digest_of
from coordinator.domain.records import EventRecord, TaskRecord, encode
from coordinator.domain.states import Op, TaskState
from coordinator.domain.validation import MAX_INPUT_BYTES, MAX_RESULT_BYTES
from coordinator.store import Store
from coordinator.store.etcd.ops import put
from coordinator.store.retention.history import entry_value
from tests.retention.sinks import WrappedSink
from tests.retention.test_pruner import PAST, keys_naming, tombstone_keys
from tests.store.support import claim, commit, create, past_attempts, write_in_txns

ATTEMPTS = 12_000
EVENTS = 3_000


def _past_history(store: Store, task: TaskRecord) -> None:
    """``ATTEMPTS`` released attempts (each with a checkpoint, as renewals leave them) and
    ``EVENTS`` events written straight into etcd, as that many cycles would have: far more than
    4 MiB, under keys that sort before the task's real ones."""
    keys, task_id = store.ctx.keys, task.task_id
    past_attempts(store, task, ATTEMPTS, attempt_id=lambda n: f"a0-{n:06d}", checkpoint=b"c" * 200)
    events = [
        EventRecord(
            task_id=task_id,
            op=Op.RELEASE,
            from_state=TaskState.CLAIMED,
            to_state=TaskState.READY,
            at=float(n),
            by="w",
            detail="released: " + "d" * 100,
        )
        for n in range(EVENTS)
    ]
    # Event keys are numbered by the task's state version; these sort before the real ones.
    write_in_txns(
        store,
        [put(f"{keys.events_prefix(task_id)}0{n:08d}", encode(e)) for n, e in enumerate(events)],
    )


def test_a_task_with_12000_attempts_is_archived_whole_and_pruned(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store()
    create(store, "long")
    task = store.tasks.get("long")
    _past_history(store, task)
    committed = commit(store, claim(store, "long"), input_digest=task.input_digest)
    assert committed.verdict.outcome.name == "COMMITTED"
    keys = store.ctx.keys
    sections = [keys.attempts_prefix("long"), keys.events_prefix("long"), keys.results_of("long")]
    kv = store.ctx.kv
    held = {keys.task("long")} | {
        item.key for p in sections for item in kv.range_page(p, kv.prefix_end(p), keys_only=True)[0]
    }
    # The task, its past attempts (the committed one lives in the task record: schema 3), its
    # events and its result.
    assert len(held) == 1 + ATTEMPTS + EVENTS + 3 + 1
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned) == (1, 1)
    assert keys_naming(store, etcd_client, "long") == tombstone_keys(store, etcd_client, "long")
    (obj,) = list(sink.read())
    assert len(obj["attempts"]) == ATTEMPTS + 1
    assert obj["attempts"][-1]["in_task_record"] is True  # the committed one, from the record
    assert len(obj["events"]) == EVENTS + 3  # create, claim, commit
    archived = {
        e["key"]
        for s in ("attempts", "events", "results")
        for e in obj[s]
        if not e.get("in_task_record")
    }
    archived.add(obj["task"]["key"])
    assert archived == held  # every record, each once


class CountingSink(WrappedSink):
    """The test's local sink, counting its writes."""

    def __init__(self, inner: LocalSink) -> None:
        super().__init__(inner)
        self.writes = 0

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        self.writes += 1
        return self.inner.write(objects)


def test_tasks_with_the_largest_records_are_read_one_by_one_and_archived_in_bounded_writes(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    counting = CountingSink(sink)
    store = make_store(archive=counting)
    ids = [f"big{n:02d}" for n in range(11)]  # one batched read: about 20 MiB, past 4 MiB
    for task_id in ids:
        create(store, task_id, data=bytes([n % 251 for n in range(MAX_INPUT_BYTES)]))
        fence = claim(store, task_id)
        staged = b"s" * MAX_RESULT_BYTES
        store.acceptance.stage_result(
            fence, principal="w1", result_digest=digest_of(staged), result=staged, result_ref=""
        )
        assert commit(store, fence, result=b"r" * MAX_RESULT_BYTES).verdict.outcome.name == (
            "COMMITTED"
        )
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned) == (11, 11)
    # About 1.7 MiB of records each (the input raw in its own key), 8 MiB held at most: more
    # than one archive write.
    assert counting.writes >= 2
    objects = {o["task_id"]: o for o in sink.read()}
    assert sorted(objects) == ids
    for task_id in ids:
        assert keys_naming(store, etcd_client, task_id) == tombstone_keys(
            store, etcd_client, task_id
        )
        obj = objects[task_id]
        assert len(obj["results"]) == len(obj["staged"]) == 1
        assert len(obj["results"][0]["value"]["result"]) > MAX_RESULT_BYTES  # base64 of it
        assert entry_value(obj["input"]) == bytes([n % 251 for n in range(MAX_INPUT_BYTES)])
