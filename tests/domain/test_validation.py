"""coordinator.domain.validation: request fields shared by every entry point."""

from __future__ import annotations

from collections.abc import Callable

import pytest

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
