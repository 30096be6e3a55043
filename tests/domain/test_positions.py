"""Event positions: one per event, totally ordered, and the resume rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.positions import EventPosition, resume_point
from coordinator.errors import InvalidArgument

positions = st.builds(
    EventPosition,
    st.integers(min_value=1, max_value=10**9),
    st.text(alphabet="abc-._", min_size=1, max_size=5),
    st.integers(min_value=0, max_value=10**9),
)


def test_events_of_one_revision_are_ordered_by_task_then_state_version() -> None:
    a = EventPosition(7, "a", 9)
    b = EventPosition(7, "b", 3)
    b_later = EventPosition(7, "b", 4)
    assert sorted([b_later, b, a]) == [a, b, b_later]
    assert a < EventPosition(8, "a", 0)


@given(positions)
def test_a_revisions_boundaries_enclose_every_event_of_it(position: EventPosition) -> None:
    assert EventPosition.start_of(position.revision) < position
    assert position < EventPosition.end_of(position.revision)
    assert EventPosition.end_of(position.revision - 1) == EventPosition.start_of(position.revision)
    assert position.is_event
    assert not EventPosition.start_of(position.revision).is_event


def test_from_revision_resumes_at_the_start_of_that_revision() -> None:
    assert resume_point(from_revision=5, after=None) == EventPosition.start_of(5)
    assert resume_point(from_revision=0, after=None) == EventPosition.start_of(1)


def test_after_resumes_strictly_after_that_event() -> None:
    after = EventPosition(5, "t", 3)
    assert resume_point(from_revision=0, after=after) is after


@given(positions)
def test_every_position_a_follower_can_be_told_to_resume_after_is_accepted(
    position: EventPosition,
) -> None:
    # A follower ended behind is told its cursor: the position it was asked to start after (an
    # event, or the start of from_revision), an event it passed, or the end of a stretch it
    # read from the keys (store/lifecycle/events.py). Each must be taken back as after.
    told = (
        position,
        EventPosition.start_of(position.revision),
        EventPosition.end_of(position.revision),
    )
    for cursor in told:
        assert resume_point(from_revision=0, after=cursor) == cursor


@pytest.mark.parametrize(
    ("from_revision", "after", "message"),
    [
        (-1, None, "from_revision must be >= 0"),
        (3, EventPosition(5, "t", 3), "either from_revision or after"),
        (0, EventPosition(0, "t", 3), "after must be the position of an event"),
        (0, EventPosition(5, "", 3), "after must be the position of an event"),
        (0, EventPosition(5, "", 0), "after must be the position of an event"),  # revision only
        (0, EventPosition(0, "", -1), "after must be the position of an event"),
        (0, EventPosition(5, "t", -1), "after must be the position of an event"),
    ],
)
def test_bad_resume_points_are_refused(
    from_revision: int, after: EventPosition | None, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        resume_point(from_revision=from_revision, after=after)
