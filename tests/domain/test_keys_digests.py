"""coordinator.domain.keys (the etcd key layout and its sort orders) and .digests."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.digests import check_digest, digest_of, is_digest
from coordinator.domain.keys import MAX_PRIORITY, Keyspace, task_id_from_ready_key
from coordinator.errors import InvalidArgument

K = Keyspace("/c")
TASK_IDS = st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True)
SEQS = st.integers(0, 10**20 - 1)
PRIORITIES = st.integers(0, MAX_PRIORITY)


def test_the_key_layout() -> None:
    assert Keyspace().prefix == "/coordinator"
    assert (K.epoch, K.claims_paused) == ("/c/epoch", "/c/control/claims_paused")
    assert (K.task("t1"), K.tasks_prefix) == ("/c/tasks/t1", "/c/tasks/")
    assert K.ready("q", 999, 5, "t1") == "/c/ready/q/000/00000000000000000005/t1"
    assert K.ready("q", 0, 5, "t1") == "/c/ready/q/999/00000000000000000005/t1"
    assert (K.ready_prefix("q"), K.ready_prefix()) == ("/c/ready/q/", "/c/ready/")
    assert (K.claim("t1"), K.claims_prefix) == ("/c/claims/t1", "/c/claims/")
    assert (K.claimed("t1"), K.claimed_prefix) == ("/c/claimed/t1", "/c/claimed/")
    assert (K.attempt("t1", "a1"), K.attempts_prefix("t1")) == (
        "/c/attempts/t1/a1",
        "/c/attempts/t1/",
    )
    assert (K.staging("t1", "a1"), K.staging_prefix) == ("/c/staging/t1/a1", "/c/staging/")
    assert K.result("t1", 3) == "/c/results/t1/0000000003"
    assert K.results_prefix == "/c/results/"
    assert K.event("t1", 42) == "/c/events/t1/00000000000000000042"
    assert (K.events_prefix("t1"), K.events_prefix()) == ("/c/events/t1/", "/c/events/")


@given(TASK_IDS, st.text(alphabet="abc", min_size=1, max_size=3), PRIORITIES, SEQS)
def test_every_key_of_a_task_lies_under_exactly_one_range(
    task_id: str, attempt_id: str, priority: int, seq: int
) -> None:
    ranges = [
        K.tasks_prefix,
        K.ready_prefix(),
        K.claims_prefix,
        K.claimed_prefix,
        K.attempts_prefix(task_id),
        K.staging_prefix,
        K.results_prefix,
        K.events_prefix(task_id),
    ]
    keys = [
        K.task(task_id),
        K.ready("q", priority, seq, task_id),
        K.claim(task_id),
        K.claimed(task_id),
        K.attempt(task_id, attempt_id),
        K.staging(task_id, attempt_id),
        K.result(task_id, 1),
        K.event(task_id, seq),
    ]
    for key, own in zip(keys, ranges, strict=True):
        assert [r for r in ranges if key.startswith(r)] == [own], key
        assert K.epoch != key and not key.startswith(K.claims_paused)


@given(st.lists(st.tuples(PRIORITIES, SEQS, TASK_IDS), min_size=2, max_size=20))
def test_ready_keys_sort_by_priority_descending_then_fifo(
    entries: list[tuple[int, int, str]],
) -> None:
    by_key = sorted(entries, key=lambda e: K.ready("q", *e))
    by_rule = sorted(entries, key=lambda e: (-e[0], e[1], e[2]))
    assert by_key == by_rule


@given(st.lists(SEQS, min_size=2, max_size=20, unique=True))
def test_event_keys_sort_in_transition_order(versions: list[int]) -> None:
    assert sorted(versions, key=lambda v: K.event("t1", v)) == sorted(versions)


@given(st.sampled_from(["a", "ab", "a.b"]), PRIORITIES, SEQS, TASK_IDS)
def test_a_ready_key_belongs_to_its_queue_only(
    queue: str, priority: int, seq: int, task_id: str
) -> None:
    key = K.ready(queue, priority, seq, task_id)
    assert [q for q in ("a", "ab", "a.b") if key.startswith(K.ready_prefix(q))] == [queue]
    assert task_id_from_ready_key(key) == task_id


# --- digests ----------------------------------------------------------------------------------

EMPTY = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_digest_of_a_known_vector() -> None:
    assert digest_of(b"") == EMPTY
    assert digest_of(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


@given(st.binary(max_size=256))
def test_every_digest_of_data_is_well_formed(data: bytes) -> None:
    digest = digest_of(data)
    assert is_digest(digest)
    assert check_digest("f", digest, data=data) == digest
    assert check_digest("f", "", data=data) == digest


@pytest.mark.parametrize(
    "value",
    [
        "",
        "sha256:",
        EMPTY.upper(),
        "SHA256:" + EMPTY[7:],
        "sha512:" + EMPTY[7:],
        EMPTY[:-1],
        EMPTY + "0",
        " " + EMPTY,
    ],
)
def test_malformed_digests_are_refused(value: str) -> None:
    assert not is_digest(value)
    with pytest.raises(InvalidArgument, match=r"^result_digest must be 'sha256:'"):
        check_digest("result_digest", value)


def test_a_digest_with_a_trailing_newline_is_refused() -> None:
    assert not is_digest(EMPTY + "\n")
    with pytest.raises(InvalidArgument):
        check_digest("result_digest", EMPTY + "\n")


def test_check_digest_against_data() -> None:
    with pytest.raises(InvalidArgument, match="is not the sha256 of the bytes sent"):
        check_digest("input_digest", digest_of(b"x"), data=b"y")
    # Empty bytes are bytes too: their digest is EMPTY, not whatever was claimed.
    with pytest.raises(InvalidArgument, match="is not the sha256 of the bytes sent"):
        check_digest("input_digest", digest_of(b"x"), data=b"")
    # No data at all: only the form is checked.
    assert check_digest("input_digest", digest_of(b"x")) == digest_of(b"x")
    assert check_digest("input_digest", "", data=b"") == EMPTY
    with pytest.raises(InvalidArgument):
        check_digest("input_digest", "")
