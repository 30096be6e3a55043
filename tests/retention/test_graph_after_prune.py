"""ListDependencies of a task whose upstream was pruned: the upstream is shown with its final
state from its tombstone, marked pruned; the pruned task itself is NOT_FOUND naming its
archive."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.states import TaskState
from coordinator.errors import NotFound
from coordinator.store import TaskSpec
from tests.retention.test_pruner import PAST, finish


def test_a_pruned_upstream_keeps_its_final_state_in_the_graph(
    make_store: Any, clock: ManualClock
) -> None:
    store = make_store()
    finish(store, "up")
    store.tasks.create(TaskSpec(task_id="down", input=b"i", depends_on=("up",)), by="pm")
    clock.advance(PAST)
    assert store.pruner is not None and store.pruner.run_pass().pruned == 1  # "down" is READY

    found = store.dependencies.neighbours("down", page_size=10)
    (up,) = found.upstreams
    assert (up.task_id, up.state, found.pruned) == ("up", TaskState.DONE, frozenset({"up"}))
    with pytest.raises(NotFound, match="'up' finished DONE and was archived"):
        store.dependencies.neighbours("up", page_size=10)  # the pruned task itself
