"""A task's input in a key of its own (schema 2; coordinator/store/task_inputs.py).

A keyspace at schema 1 keeps inputs inside task records; once an admin raises the schema, a
replica writes new tasks' inputs to ``{p}/inputs/{id}`` (after the settle; the suite's is 0,
tests/conftest.py) and the task's moves stop rewriting them. Records of both layouts are read
by every path that hands an input out."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from coordinator.domain.states import Outcome, TaskState
from coordinator.domain.versions import INPUT_KEY_SCHEMA, SCHEMA_VERSION, VersionRecord
from coordinator.errors import FailedPrecondition
from coordinator.store import Store
from coordinator.store.control.versions import Standing, VersionStore
from coordinator.store.indexes import ready
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create, raw, writes_between

BIG = bytes(range(256)) * 256  # 64 KiB


def _stored(etcd_client: Any, store: Store, task_id: str) -> dict[str, Any]:
    value, _ = etcd_client.get(store.ctx.keys.task(task_id))
    stored: dict[str, Any] = json.loads(value)
    return stored


def _input_key(etcd_client: Any, store: Store, task_id: str) -> bytes | None:
    value, _ = etcd_client.get(store.ctx.keys.input(task_id))
    return value if value is None else bytes(value)


def _puts(store: Store, start: int, end: int) -> list[tuple[str, int]]:
    """(key under the prefix, value size) of every put in revisions ``start`` to ``end``."""
    prefix = store.ctx.keys.prefix + "/"
    return [
        (e.key.removeprefix(prefix), len(e.value))
        for e in writes_between(store, start, end)
        if not e.deleted
    ]


def _cycle(store: Store, etcd_client: Any, task_id: str) -> list[tuple[str, int]]:
    """Claim and commit ``task_id``: the puts of both txns, with the input handed out checked."""
    start = raw(etcd_client, store.ctx.keys.task(task_id)).mod_revision + 1
    won = store.claims.claim(task_id, principal="w1", epoch=store.admin.epoch(), ttl=30)
    assert won.verdict.outcome is Outcome.CLAIMED and won.fence is not None
    assert won.task is not None and won.task.input == BIG
    assert commit(store, won.fence).verdict.outcome is Outcome.COMMITTED
    return _puts(store, start, raw(etcd_client, store.ctx.keys.task(task_id)).mod_revision)


@pytest.fixture
def at_schema_1(make_store: StoreFactory, etcd_client: Any, prefix: str) -> Store:
    """A store on a keyspace created at schema 1 (before this code's schema existed)."""
    etcd_client.put(f"{prefix}/meta/versions", VersionRecord(schema_version=1).encode())
    return make_store()


def test_a_raised_schema_moves_new_inputs_to_their_key_and_the_cycle_stops_rewriting_them(
    at_schema_1: Store, etcd_client: Any
) -> None:
    store = at_schema_1
    create(store, "old", data=BIG)
    assert base64.b64decode(_stored(etcd_client, store, "old")["input"]) == BIG
    assert _input_key(etcd_client, store, "old") is None
    # Schema 1: every move of the task puts its input again, inside the record.
    assert [n for key, n in _cycle(store, etcd_client, "old") if key == "tasks/old"] == [
        pytest.approx(len(base64.b64encode(BIG)), abs=4096)
    ] * 2

    raised = VersionStore(store.ctx).set_minimums(schema_version=INPUT_KEY_SCHEMA)
    assert raised.record.schema_version == INPUT_KEY_SCHEMA
    eventually(lambda: store.ctx.writes_schema(INPUT_KEY_SCHEMA), message="never wrote it")
    create(store, "new", data=BIG)
    stored = _stored(etcd_client, store, "new")
    assert (stored["input_in_key"], stored["input"]) == (True, "")
    assert _input_key(etcd_client, store, "new") == BIG
    # Schema 2: the claim and the commit put a record of a few hundred bytes, no input.
    puts = _cycle(store, etcd_client, "new")
    assert [key for key, _ in puts if key.startswith("inputs/")] == []
    assert max(n for _, n in puts) < 4096


def test_both_layouts_are_read_wherever_an_input_is_handed_out(
    at_schema_1: Store, make_store: StoreFactory, etcd_client: Any
) -> None:
    create(at_schema_1, "old", data=b"old input")
    VersionStore(at_schema_1.ctx).set_minimums(schema_version=INPUT_KEY_SCHEMA)
    store = make_store()  # a replica that reads schema 2 from the start
    create(store, "new", data=b"new input")
    assert _input_key(etcd_client, store, "old") is None
    assert _input_key(etcd_client, store, "new") == b"new input"

    assert [store.tasks.get(t).input for t in ("new", "old")] == [b"new input", b"old input"]
    listed, _ = store.tasks.list(include_input=True)
    assert [(t.task_id, t.input) for t in listed] == [("new", b"new input"), ("old", b"old input")]
    unlisted, _ = store.tasks.list()
    assert [t.input for t in unlisted] == [b"", b""]
    claimed = [claim(store, t, epoch=store.admin.epoch()) for t in ("new", "old")]
    views = [store.acceptance._held.peek(f) for f in claimed]
    # What a claim remembers for its commit is the record as stored: no second copy.
    assert [v.task.input if v else None for v in views] == [b"", b"old input"]
    cancelled = store.tasks.cancel("new", by="pm", reason="done with it")
    assert (cancelled.state, store.tasks.with_input(cancelled).input) == (
        TaskState.CANCELLED,
        b"new input",
    )

    # A new input moves a record of the first schema to the key.
    updated = store.tasks.update_input(
        "old", data=b"newer", input_digest="", expected_revision=1, by="pm"
    )
    assert (updated.input_in_key, updated.input, updated.revision) == (True, b"newer", 2)
    assert _stored(etcd_client, store, "old")["input"] == ""
    assert _input_key(etcd_client, store, "old") == b"newer"


def test_a_schema_is_raised_only_up_to_what_the_coordinator_knows_and_never_lowered(
    store: Store,
) -> None:
    versions = VersionStore(store.ctx)
    with pytest.raises(FailedPrecondition, match="knows keyspace schemas up to"):
        versions.set_minimums(schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(FailedPrecondition, match="a schema is never lowered"):
        versions.set_minimums(schema_version=1)
    assert versions.read().schema_version == SCHEMA_VERSION  # nothing written by either


def test_a_replica_writes_a_raised_schemas_layout_only_after_the_settle() -> None:
    now = [0.0]
    records = {"schema": 1}

    def read() -> VersionRecord:
        return VersionRecord(schema_version=records["schema"])

    standing = Standing(read, ttl=2.0, settle=4.0, clock=lambda: now[0])
    assert standing.writes_schema(INPUT_KEY_SCHEMA) is False
    records["schema"] = INPUT_KEY_SCHEMA
    now[0] = 1.0  # the cache still holds schema 1
    assert standing.writes_schema(INPUT_KEY_SCHEMA) is False
    now[0] = 2.5  # the next reading sees schema 2: the settle starts here
    assert standing.current()[0] == VersionRecord(schema_version=INPUT_KEY_SCHEMA)
    assert standing.writes_schema(INPUT_KEY_SCHEMA) is False
    now[0] = 6.4
    assert standing.writes_schema(INPUT_KEY_SCHEMA) is False
    now[0] = 6.6
    assert standing.writes_schema(INPUT_KEY_SCHEMA) is True
    assert Standing(lambda: (_ for _ in ()).throw(OSError("etcd away"))).writes_schema(2) is False


def test_a_task_whose_input_key_was_deleted_by_hand_is_never_handed_out_empty(
    store: Store, etcd_client: Any
) -> None:
    create(store, "lost", data=b"the real input")
    etcd_client.delete(store.ctx.keys.input("lost"))
    epoch = store.admin.epoch()

    refused = store.claims.claim("lost", principal="w1", epoch=epoch, ttl=30)
    assert refused.verdict.outcome is Outcome.NOT_CLAIMABLE and refused.fence is None
    assert f"input key {store.ctx.keys.input('lost')} is missing" in refused.verdict.message
    none = store.claims.claim_next("default", principal="w1", epoch=epoch, ttl=30)
    assert none.verdict.outcome is Outcome.NO_READY_TASK
    assert store.tasks.get("lost").state is TaskState.READY  # nothing written

    # A new input moves it on, and the next claim hands that input out.
    store.tasks.update_input(
        "lost", data=b"typed again", input_digest="", expected_revision=1, by="pm"
    )
    won = store.claims.claim_next("default", principal="w1", epoch=epoch, ttl=30)
    assert won.verdict.outcome is Outcome.CLAIMED and won.task is not None
    assert (won.task.task_id, won.task.input) == ("lost", b"typed again")


def test_a_ready_key_claim_next_could_not_claim_is_passed_by_for_a_while_not_forgotten(
    store: Store, etcd_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal etcd's index never followed (here an input key deleted and then put back by
    hand; a txn that kept losing, an epoch key gone) used to drop the ready key from this
    replica's copy for good: the task was never offered here again, nor counted in its
    queue's figures, while every other replica still counted it."""
    monkeypatch.setattr(ready, "BENCH_SECONDS", 0.2)
    create(store, "t", data=b"the input", queue="q")
    epoch = store.admin.epoch()
    etcd_client.delete(store.ctx.keys.input("t"))
    none = store.claims.claim_next("q", principal="w1", epoch=epoch, ttl=30)
    assert none.verdict.outcome is Outcome.NO_READY_TASK
    assert (store.ready.size("q"), store.ready.heads()["q"].count) == (1, 1)  # still counted

    etcd_client.put(store.ctx.keys.input("t"), b"the input")  # mended by hand: no index write

    def claimed() -> Any:
        won = store.claims.claim_next("q", principal="w1", epoch=epoch, ttl=30)
        return won.task if won.verdict.outcome is Outcome.CLAIMED else None

    task = eventually(claimed, timeout=10, message="the task was never offered again")
    assert (task.task_id, task.input) == ("t", b"the input")
