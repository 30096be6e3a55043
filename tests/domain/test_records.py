"""coordinator.domain.records: frozen records and their JSON codec (round trips, metadata)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import types
from enum import Enum
from typing import Any, Union, get_args, get_origin, get_type_hints

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.records import (
    AttemptRecord,
    ClaimRecord,
    EventRecord,
    ResultRecord,
    StagedResult,
    TaskRecord,
    as_stored,
    commit_id,
    decode,
    encode,
    with_changes,
)
from coordinator.domain.states import Op, TaskState

RECORDS = [TaskRecord, ClaimRecord, AttemptRecord, ResultRecord, StagedResult, EventRecord]
# The etcd-assigned fields: never stored, attached on decode from the key's metadata.
METADATA = {
    TaskRecord: {"state_version", "created_revision"},
    ClaimRecord: {"generation", "mod_revision"},
    AttemptRecord: {"mod_revision"},
}


def _strategy(hint: Any) -> st.SearchStrategy[Any]:
    """A strategy for one field type; an unknown type fails loudly (a new field needs a case)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return st.none() | _strategy(inner)
    if origin is tuple:
        return st.lists(st.text(max_size=12), max_size=4).map(tuple)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from(list(hint))
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(max_size=24),
        int: st.integers(-(2**63), 2**63 - 1),
        float: st.floats(allow_nan=False),
        bool: st.booleans(),
        bytes: st.binary(max_size=64),
    }
    return simple[hint]


def records(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Any instance of ``cls``, every field generated (metadata included)."""
    hints = get_type_hints(cls)
    return st.fixed_dictionaries(
        {f.name: _strategy(hints[f.name]) for f in dataclasses.fields(cls)}
    ).map(lambda kwargs: cls(**kwargs))


def _as_stored(record: Any) -> Any:
    """``record`` as read back: a task record whose input lives in its own key stores none."""
    return as_stored(record) if isinstance(record, TaskRecord) else record


def _metadata(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in METADATA.get(type(record), ())}


def test_metadata_fields_are_exactly_the_non_compared_ones() -> None:
    for cls in RECORDS:
        skipped = {f.name for f in dataclasses.fields(cls) if not f.compare}
        assert skipped == METADATA.get(cls, set()), cls


@given(st.one_of(*(records(cls) for cls in RECORDS)))
def test_encode_decode_round_trips(record: Any) -> None:
    data = encode(record)
    back = decode(type(record), data, **_metadata(record))
    assert back == _as_stored(record)
    assert _metadata(back) == _metadata(record)
    assert encode(back) == data


@given(st.one_of(*(records(cls) for cls in RECORDS)))
def test_encoding_is_compact_sorted_json_without_metadata(record: Any) -> None:
    data = encode(record)
    raw = json.loads(data)
    if all(not isinstance(v, float) or math.isfinite(v) for v in raw.values()):
        assert data == orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    else:  # orjson would write null: the stdlib's Infinity, as the codec always wrote
        assert data == json.dumps(raw, separators=(",", ":"), sort_keys=True).encode()
    stored = {f.name for f in dataclasses.fields(record)} - METADATA.get(type(record), set())
    if not getattr(record, "input_in_key", True):
        stored.discard("input_in_key")  # a first-schema task record: written as before
    if not getattr(record, "attempt_in_record", True):  # a task record as before schema 3
        stored -= {"attempt_in_record", "attempt_ttl", "attempt_started_at"}
    assert set(raw) == stored
    for name in stored:
        value = getattr(_as_stored(record), name)
        if isinstance(value, Enum):
            assert raw[name] == value.name
        elif isinstance(value, bytes):
            assert base64.b64decode(raw[name]) == value


@given(records(TaskRecord))
def test_decode_without_metadata_leaves_it_zero(task: TaskRecord) -> None:
    back = decode(TaskRecord, encode(task))
    assert back.state_version == 0
    assert back == as_stored(task)  # state_version is not part of equality


def test_unknown_fields_are_ignored_and_missing_ones_default() -> None:
    data = b'{"task_id":"t1","queue":"q","input_digest":"d","state":"CLAIMED","from_v9":[1]}'
    assert decode(TaskRecord, data, state_version=7) == TaskRecord(
        task_id="t1", queue="q", input_digest="d", state=TaskState.CLAIMED
    )
    assert decode(TaskRecord, data, state_version=7).state_version == 7


def test_enums_by_name_bytes_as_base64_and_none_as_null() -> None:
    event = EventRecord(task_id="t1", op=Op.CLAIM, to_state=TaskState.CLAIMED, at=1.5)
    raw = json.loads(encode(event))
    assert (raw["op"], raw["to_state"], raw["from_state"]) == ("CLAIM", "CLAIMED", None)
    task = TaskRecord(
        task_id="t", queue="q", input_digest="d", state=TaskState.READY, input=b"\x00\xff"
    )
    assert json.loads(encode(task))["input"] == "AP8="
    assert decode(EventRecord, encode(event)).from_state is None


def test_commit_id_names_attempt_and_generation() -> None:
    assert commit_id("a1-abc", 42) == "a1-abc@42"
    result = ResultRecord("t1", 3, "a1-abc", 42, 1, "w1", "sha256:00", 0.0)
    assert result.commit_id == "a1-abc@42"


def test_records_are_frozen_and_with_changes_copies() -> None:
    task = TaskRecord(task_id="t1", queue="q", input_digest="d", state=TaskState.READY)
    changed = with_changes(task, state=TaskState.CLAIMED, attempt=1)
    assert (changed.state, changed.attempt, changed.task_id) == (TaskState.CLAIMED, 1, "t1")
    assert (task.state, task.attempt) == (TaskState.READY, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.state = TaskState.DONE  # type: ignore[misc]
    with pytest.raises(TypeError):
        with_changes(task, no_such_field=1)


def test_an_unknown_enum_name_is_refused() -> None:
    with pytest.raises(KeyError):
        decode(TaskRecord, b'{"task_id":"t","queue":"q","input_digest":"d","state":"LOST"}')
