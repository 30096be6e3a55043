"""The fence screen: which fences the claimed index may refuse without a read."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.fence_screen import Screen, screen

revisions = st.integers(min_value=1, max_value=10_000)
maybe = st.none() | revisions


def test_a_generation_the_index_has_not_seen_is_unseen() -> None:
    assert screen(11, seen_through=10, written=None, ended=None) is Screen.UNSEEN
    assert screen(11, seen_through=10, written=11, ended=None) is Screen.UNSEEN


def test_no_key_and_no_recent_end_is_no_claim() -> None:
    assert screen(5, seen_through=10, written=None, ended=None) is Screen.NO_CLAIM


def test_a_key_last_written_before_the_generation_is_no_claim() -> None:
    # The claim txn writes the key at its generation: a key older than it was not written by it.
    assert screen(7, seen_through=10, written=6, ended=None) is Screen.NO_CLAIM


def test_a_key_written_at_or_after_the_generation_is_read() -> None:
    assert screen(7, seen_through=10, written=7, ended=None) is Screen.READ
    assert screen(7, seen_through=10, written=9, ended=None) is Screen.READ


def test_a_recent_end_at_or_after_the_generation_is_read_for_its_exact_reason() -> None:
    assert screen(7, seen_through=10, written=None, ended=8) is Screen.READ
    assert screen(7, seen_through=10, written=None, ended=6) is Screen.NO_CLAIM


@given(generation=revisions, seen=revisions, written=maybe, ended=maybe)
def test_a_claim_that_may_be_live_is_never_refused(
    generation: int, seen: int, written: int | None, ended: int | None
) -> None:
    """Live means the key was written at the generation and the index saw it: never NO_CLAIM."""
    if generation <= seen and written is not None and written >= generation:
        assert screen(generation, seen_through=seen, written=written, ended=ended) is Screen.READ
