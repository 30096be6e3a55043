"""Records built without their ``__init__`` call (``with_changes``, ``decode``): the same
objects as ``dataclasses.replace`` and ``cls(**kwargs)`` make, the same refusals."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.records import TaskRecord, decode, encode, with_changes
from coordinator.domain.states import TaskState
from tests.domain.test_records import RECORDS, records


@given(st.data())
def test_a_copy_with_changes_is_what_replace_makes(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(RECORDS))
    record, donor = data.draw(records(cls)), data.draw(records(cls))
    names = data.draw(st.sets(st.sampled_from([f.name for f in dataclasses.fields(cls)])))
    changes = {name: getattr(donor, name) for name in names}
    copy = with_changes(record, **changes)
    expected = dataclasses.replace(record, **changes)
    assert type(copy) is cls
    assert copy == expected
    # Metadata fields (compare=False) are not in ==: every field's value, one by one.
    assert vars(copy) == vars(expected)
    assert with_changes(record) is not record  # a copy, like replace's


def test_an_unknown_field_is_a_type_error_and_the_record_is_untouched() -> None:
    record = TaskRecord(task_id="t1", queue="q", input_digest="sha256:00", state=TaskState.READY)
    before = vars(record).copy()
    with pytest.raises(TypeError, match="has no field not_a_field"):
        with_changes(record, not_a_field=1)
    assert vars(record) == before


@dataclasses.dataclass(frozen=True)
class _Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True)
class _Cached:
    value: int

    @functools.cached_property
    def doubled(self) -> int:
        return self.value * 2


def test_a_class_whose_init_does_more_goes_through_replace() -> None:
    with pytest.raises(ValueError, match="negative"):
        with_changes(_Checked(1), value=-1)
    cached = _Cached(1)
    assert cached.doubled == 2
    assert with_changes(cached, value=5).doubled == 10  # not the copied cache


def test_every_record_takes_the_fast_copy() -> None:
    from coordinator.domain.records import _copyable

    fast: list[Any] = [cls for cls in RECORDS if _copyable(cls) is not None]
    assert fast == RECORDS


def test_decode_builds_what_init_builds_and_refuses_what_it_refuses() -> None:
    task = TaskRecord(task_id="t1", queue="q", input_digest="sha256:00", state=TaskState.READY)
    back = decode(TaskRecord, encode(task), state_version=7)
    assert vars(back) == vars(dataclasses.replace(task, state_version=7))
    with pytest.raises(TypeError, match="input_digest"):  # a required field missing
        decode(TaskRecord, b'{"task_id":"t1","queue":"q","state":"READY"}')
    with pytest.raises(TypeError, match="not_a_field"):  # metadata that is no field
        decode(TaskRecord, encode(task), not_a_field=1)
