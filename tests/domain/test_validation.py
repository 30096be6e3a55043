"""coordinator.domain.validation: request fields shared by every entry point."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain import validation as v
from coordinator.domain.effects import check_name
from coordinator.domain.jobs import check_job_id
from coordinator.domain.lineage import thread_key
from coordinator.domain.roles import check_principal
from coordinator.errors import InvalidArgument


@pytest.mark.parametrize("good", ["t", "t-1", "a.b:c_d", "x" * 128])
def test_good_task_ids(good: str) -> None:
    assert v.task_id(good) == good


@pytest.mark.parametrize("bad", ["", "x" * 129, "a/b", "a b", "é", "a\nb"])
def test_bad_task_ids(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="parent_id"):
        v.task_id(bad, field="parent_id")


def test_queues_and_attempt_ids() -> None:
    assert v.queue("q.1_a-b") == "q.1_a-b"
    assert v.attempt_id("a1-0f3c") == "a1-0f3c"
    for bad in ("", "q:1", "q" * 65, "a/b"):
        with pytest.raises(InvalidArgument):
            v.queue(bad)
        with pytest.raises(InvalidArgument):
            v.attempt_id(bad)


def test_number_ranges() -> None:
    assert (v.positive("ttl", 1), v.non_negative("x", 0)) == (1, 0)
    assert (v.priority(0), v.priority(999)) == (0, 999)
    with pytest.raises(InvalidArgument, match="ttl must be > 0, got 0"):
        v.positive("ttl", 0)
    with pytest.raises(InvalidArgument, match="x must be >= 0, got -1"):
        v.non_negative("x", -1)
    for bad in (-1, 1000):
        with pytest.raises(InvalidArgument, match="priority must be between 0 and 999"):
            v.priority(bad)


def test_size_limits() -> None:
    assert v.max_bytes("input", b"x" * 4, 4) == b"x" * 4
    with pytest.raises(InvalidArgument, match="input is 5 bytes, the limit is 4"):
        v.max_bytes("input", b"x" * 5, 4)
    assert v.text("reason", "x" * v.MAX_TEXT_CHARS) == "x" * v.MAX_TEXT_CHARS
    with pytest.raises(InvalidArgument, match="reason is 3 characters, the limit is 2"):
        v.text("reason", "abc", limit=2)


@pytest.mark.parametrize("check", [v.task_id, v.queue, v.attempt_id], ids=lambda f: f.__name__)
def test_a_trailing_newline_is_refused(check: Callable[[str], str]) -> None:
    with pytest.raises(InvalidArgument):
        check("a\n")


# Every id that becomes a key segment or a path part: (the field its message names, check).
_ID_CHECKS: list[tuple[str, Callable[[str], str]]] = [
    ("task_id", v.task_id),
    ("queue", v.queue),
    ("node_id", lambda s: check_name("node_id", s)),
    ("thread_key", thread_key),
    ("job_id", check_job_id),
    ("principal", lambda s: check_principal("principal", s)),
]
_ID_NAMES = [field for field, _ in _ID_CHECKS]


@pytest.mark.parametrize(("field", "check"), _ID_CHECKS, ids=_ID_NAMES)
@pytest.mark.parametrize("dots", [".", ".."])
def test_dot_and_dotdot_ids_are_refused_naming_the_field(
    field: str, check: Callable[[str], str], dots: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field} must not be '.' or '..'"):
        check(dots)


@pytest.mark.parametrize(("field", "check"), _ID_CHECKS, ids=_ID_NAMES)
@pytest.mark.parametrize("dotted", ["...", ".a", "a.", "a..b", "v1.2"])
def test_dots_inside_an_id_are_fine(field: str, check: Callable[[str], str], dotted: str) -> None:
    del field
    assert check(dotted) == dotted


@pytest.mark.parametrize("value", ["a/../b", "../a", "a/.", "./a"])
def test_dot_parts_of_slashed_names_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="node_id must not be"):
        check_name("node_id", value)
    with pytest.raises(InvalidArgument, match="thread_key must not be"):
        thread_key(value)


# Seconds and nanos as the wire carries them (int64, int32), biased to the edges of protobuf's
# own ranges, where an off-by-one hides.
_EDGES = [0, 1, -1, v.MAX_NANOS, v.MAX_NANOS + 1, -v.MAX_NANOS, -v.MAX_NANOS - 1]
_SECONDS = st.one_of(
    st.sampled_from(
        [
            *_EDGES,
            v.TIMESTAMP_MIN_SECONDS,
            v.TIMESTAMP_MIN_SECONDS - 1,
            v.TIMESTAMP_MAX_SECONDS,
            v.TIMESTAMP_MAX_SECONDS + 1,
            v.DURATION_MAX_SECONDS,
            v.DURATION_MAX_SECONDS + 1,
            -v.DURATION_MAX_SECONDS,
            -v.DURATION_MAX_SECONDS - 1,
            2**62,
            -(2**62),
            2**63 - 1,
            -(2**63),
        ]
    ),
    st.integers(-(2**63), 2**63 - 1),
)
_NANOS = st.one_of(st.sampled_from([*_EDGES, 2 * 10**9]), st.integers(-(2**31), 2**31 - 1))


def _protobuf_accepts(message: Timestamp | Duration) -> bool:
    """protobuf's own verdict: its JSON form exists only for a well-formed value."""
    try:
        message.ToJsonString()
    except ValueError:
        return False
    return True


@given(seconds=_SECONDS, nanos=_NANOS)
def test_a_timestamp_is_refused_exactly_when_protobuf_refuses_it(seconds: int, nanos: int) -> None:
    message = Timestamp(seconds=seconds, nanos=nanos)
    if _protobuf_accepts(message):
        assert v.timestamp("at", seconds, nanos) == seconds + nanos / 1e9
    else:
        with pytest.raises(InvalidArgument, match=r"^at is not a valid Timestamp: "):
            v.timestamp("at", seconds, nanos)


@given(seconds=_SECONDS, nanos=_NANOS)
def test_a_duration_is_refused_exactly_when_protobuf_refuses_it(seconds: int, nanos: int) -> None:
    message = Duration(seconds=seconds, nanos=nanos)
    if _protobuf_accepts(message):
        assert v.duration("d", seconds, nanos) == seconds + nanos / 1e9
    else:
        with pytest.raises(InvalidArgument, match=r"^d is not a valid Duration: "):
            v.duration("d", seconds, nanos)


@pytest.mark.parametrize(
    ("seconds", "nanos", "message"),
    [
        (1, -5, r"nanos \(-5\) must have the sign of seconds \(1\)"),
        (-1, 5, r"nanos \(5\) must have the sign of seconds \(-1\)"),
        (0, 10**9, "nanos must be -999999999 to 999999999, got 1000000000"),
        (-(2**62), 0, "seconds must be -315576000000 to 315576000000, got -4611686018427387904"),
    ],
)
def test_a_broken_duration_names_what_is_wrong(seconds: int, nanos: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^requeue_delay is not a valid Duration: {message}"):
        v.duration("requeue_delay", seconds, nanos)
