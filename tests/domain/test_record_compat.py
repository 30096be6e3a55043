"""The record codec reads what the previous version (stdlib json) wrote, and that version's
decoder reads what this one writes: a rolling upgrade runs both on one keyspace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.records import TaskRecord, as_stored, decode, encode, with_changes
from coordinator.domain.states import TaskState
from tests.domain.previous_codec import previous_decode
from tests.domain.record_samples import SAMPLES
from tests.domain.test_records import RECORDS, records

GOLDEN = (Path(__file__).parent / "records_v0.jsonl").read_bytes().splitlines()


def test_the_golden_file_holds_one_record_per_sample() -> None:
    assert len(GOLDEN) == len(SAMPLES)


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_reads_what_the_previous_version_wrote(index: int) -> None:
    sample = SAMPLES[index]
    assert decode(type(sample), GOLDEN[index]) == sample


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_the_previous_version_reads_what_this_one_writes(index: int) -> None:
    sample = SAMPLES[index]
    data = encode(sample)
    assert previous_decode(type(sample), data) == sample
    # The same JSON values as before, whatever the bytes (UTF-8 text, 1e16 for 1e+16).
    assert json.loads(data) == json.loads(GOLDEN[index])


def test_ascii_records_are_written_byte_for_byte_as_before() -> None:
    same = [
        i for i, g in enumerate(GOLDEN) if b"\\u" not in g and b"e+" not in g and b"e-" not in g
    ]
    assert same  # most records: every plain one of the samples
    for index in same:
        assert encode(SAMPLES[index]) == GOLDEN[index]


@given(st.one_of(*(records(cls) for cls in RECORDS)))
def test_the_previous_decoder_reads_any_record_of_the_first_schema(record: Any) -> None:
    # A record of schema 2 or 3 (its input in a key of its own, its attempt in the record) is
    # never read by the previous version: a keyspace holds one only after its schema was
    # raised, which refuses that version.
    if isinstance(record, TaskRecord):
        record = as_stored(with_changes(record, input_in_key=False, attempt_in_record=False))
    assert previous_decode(type(record), encode(record)) == record


@pytest.mark.parametrize(
    ("field", "value"),
    [("ready_at", float("inf")), ("not_before", float("-inf")), ("priority", 2**70)],
)
def test_values_orjson_refuses_are_written_as_the_stdlib_did(field: str, value: Any) -> None:
    task = TaskRecord(
        task_id="t", queue="q", input_digest="d", state=TaskState.READY, **{field: value}
    )
    data = encode(task)
    assert json.loads(data)[field] == value
    assert decode(TaskRecord, data) == task
    assert previous_decode(TaskRecord, data) == task


def test_a_nan_survives_the_round_trip() -> None:
    task = TaskRecord(
        task_id="t", queue="q", input_digest="d", state=TaskState.READY, deadline=float("nan")
    )
    back = decode(TaskRecord, encode(task))
    assert back.deadline != back.deadline
    assert b'"deadline":NaN' in encode(task)
