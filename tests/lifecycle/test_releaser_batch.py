"""The releaser handles queued DONE upstreams together: one count of dependents for the batch,
then the usual work only for upstreams that have any."""

from __future__ import annotations

from typing import Any

from coordinator.domain.states import TaskState
from coordinator.store import Store
from tests.lifecycle.support import create, finish


def test_a_batch_counts_dependents_once_and_handles_only_upstreams_that_have_some(
    store: Store,
) -> None:
    store.releaser.close()  # no watch: the batch is driven by hand
    for upstream in ("a", "b", "lonely"):
        create(store, upstream)
    create(store, "after-a", depends_on=("a",))
    create(store, "after-both", depends_on=("a", "b"))
    for upstream in ("a", "b", "lonely"):
        finish(store, upstream)
    assert store.tasks.get("after-a").state is TaskState.WAITING
    handled: list[str] = []
    reads: list[int] = []
    handle, read = store.releaser.handle, store.ctx.kv.read

    def counting_handle(item: str) -> None:
        handled.append(item)
        handle(item)

    def counting_read(*ops: Any) -> Any:
        reads.append(len(ops))
        return read(*ops)

    store.releaser.handle = counting_handle  # type: ignore[method-assign]
    store.ctx.kv.read = counting_read  # type: ignore[method-assign]
    try:
        store.releaser.handle_many(["a", "b", "lonely"])
    finally:
        del store.releaser.handle, store.ctx.kv.read
    assert reads[0] == 3  # the three dependents counts, in one round trip
    assert handled == ["a", "b"]  # "lonely" has no dependent: nothing more to read or do
    assert store.tasks.get("after-a").state is TaskState.READY
    assert store.tasks.get("after-both").state is TaskState.READY
