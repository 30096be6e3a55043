"""coordinator.domain.bulk_retry: which dead letters a bulk RetryTasks picks."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.bulk_retry import DeadLetterFilter
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


def _task(state: TaskState, queue: str, code: str, updated_at: float) -> TaskRecord:
    return TaskRecord(
        task_id="t",
        queue=queue,
        input_digest="d",
        state=state,
        last_error_code=code,
        updated_at=updated_at,
    )


@given(
    state=st.sampled_from(list(TaskState)),
    queue=st.sampled_from(["orders", "emails"]),
    code=st.sampled_from(["", "KeyError", "Timeout"]),
    updated_at=st.floats(0, 2000),
    wanted_code=st.sampled_from(["", "KeyError"]),
    since=st.sampled_from([0.0, 1000.0]),
)
def test_a_filter_picks_exactly_the_failed_tasks_of_its_queue_code_and_time(
    state: TaskState,
    queue: str,
    code: str,
    updated_at: float,
    wanted_code: str,
    since: float,
) -> None:
    picked = DeadLetterFilter("orders", error_code=wanted_code, failed_since=since)
    expected = (
        state is TaskState.FAILED
        and queue == "orders"
        and (wanted_code in ("", code))
        and updated_at >= since
    )
    assert picked.matches(_task(state, queue, code, updated_at)) is expected
