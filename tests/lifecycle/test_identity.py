"""Identity: one canonical identity per work item; children name their root and parent; the
lineage filters of ListTasks."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.domain.lineage import canonical_thread_key, identity_keys, thread_key
from coordinator.domain.states import TaskState
from coordinator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from coordinator.store import Store
from tests.lifecycle.support import create, snapshot


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("csv-export", "csv-export"),
        ("  CSV-Export  ", "csv-export"),
        ("csv-export#2", "csv-export"),
        ("CSV-Export#TASK-20260823-001-dev", "csv-export"),
        ("csv-export/retry-1", "csv-export"),
        ("csv-export/round-2/retry3", "csv-export"),
        ("team/csv-export/rev-4#7", "team/csv-export"),
        ("csv-export/", "csv-export"),
        ("retry-1", "retry-1"),  # a name, not a suffix: it has no slash before it
    ],
)
def test_thread_key_normalization(raw: str, canonical: str) -> None:
    assert canonical_thread_key(raw) == canonical
    assert thread_key(raw) == canonical


@pytest.mark.parametrize("raw", ["#2", "/retry-1", "  ", "a b", "ü-thread", "x" * 129])
def test_a_thread_key_with_nothing_valid_left_is_refused(raw: str) -> None:
    with pytest.raises(InvalidArgument, match="thread_key"):
        thread_key(raw)


def test_one_canonical_identity_per_work_item(store: Store, etcd_client: Any) -> None:
    root = create(store, "csv", thread="CSV-Export")
    retry = create(store, "csv-qa", root="csv", parent="csv", thread="csv-export#TASK-2-retry")
    # A lineage suffix names the same thread, not a second identity.
    assert root.thread_key == retry.thread_key == "csv-export"
    listed, _ = store.tasks.list(thread="csv-export")
    assert [t.task_id for t in listed] == ["csv", "csv-qa"]
    # The task id is the identity: a second create of it is refused and writes nothing.
    before = snapshot(store, etcd_client)
    with pytest.raises(AlreadyExists):
        create(store, "csv", thread="csv-export")
    assert snapshot(store, etcd_client) == before


def test_a_create_writes_exactly_the_identity_keys_of_the_domain_rule(
    store: Store, etcd_client: Any
) -> None:
    # The same rule (domain/lineage.py) tells the prune what to delete and the doctor what to
    # expect, so a key written here and missed there cannot happen.
    create(store, "root", thread="a/b")
    child = create(store, "dev", root="root", parent="root")
    index = store.ctx.keys.identity_prefix()
    written = sorted(k for k in snapshot(store, etcd_client) if k.startswith(index))
    expected = identity_keys(store.ctx.keys, store.tasks.get("root")) + identity_keys(
        store.ctx.keys, child
    )
    assert written == sorted(expected)
    assert len(written) == 5


def test_a_root_task_is_its_own_root(store: Store) -> None:
    task = create(store, "Root-1")
    assert (task.root_task_id, task.parent_task_id, task.thread_key) == ("Root-1", "", "root-1")
    named = create(store, "root-2", root="root-2")
    assert (named.root_task_id, named.parent_task_id) == ("root-2", "")


def test_children_name_their_root_and_parent(store: Store, etcd_client: Any) -> None:
    create(store, "root", thread="export")
    create(store, "dev", root="root", parent="root")
    qa = create(store, "qa", root="root", parent="dev")
    assert (qa.root_task_id, qa.parent_task_id, qa.thread_key) == ("root", "dev", "export")
    create(store, "other")
    before = snapshot(store, etcd_client)
    with pytest.raises(InvalidArgument, match="parent_task_id is missing"):
        create(store, "c1", root="root")
    with pytest.raises(InvalidArgument, match="root_task_id is missing"):
        create(store, "c2", parent="dev")
    with pytest.raises(NotFound, match="parent_task_id 'ghost'"):
        create(store, "c3", root="root", parent="ghost")
    with pytest.raises(NotFound, match="root_task_id 'ghost'"):
        create(store, "c4", root="ghost", parent="dev")
    with pytest.raises(FailedPrecondition, match="parent 'dev' belongs to root 'root'"):
        create(store, "c5", root="other", parent="dev")
    with pytest.raises(FailedPrecondition, match="'dev' is not a root"):
        create(store, "c6", root="dev", parent="qa")
    with pytest.raises(InvalidArgument, match="names the task itself"):
        create(store, "c7", root="root", parent="c7")
    assert snapshot(store, etcd_client) == before


def test_list_tasks_filters_by_lineage_queue_and_state_paginated(store: Store) -> None:
    create(store, "r1", thread="alpha")
    for n in range(7):
        create(store, f"r1-c{n}", root="r1", parent="r1", queue="q" if n % 2 else "default")
    create(store, "r1-g", root="r1", parent="r1-c0", thread="beta#2")
    create(store, "r2")
    create(store, "r2-c", root="r2", parent="r2", thread="alpha/retry-1")
    store.tasks.cancel("r1-c3", by="pm", reason="")

    def all_pages(**filters: Any) -> list[str]:
        found, token = [], ""
        while True:
            page, token = store.tasks.list(page_size=2, page_token=token, **filters)
            assert len(page) <= 2
            found += [t.task_id for t in page]
            if not token:
                return found

    children = [f"r1-c{n}" for n in range(7)]
    assert all_pages(root="r1") == ["r1", *children, "r1-g"]
    assert all_pages(parent="r1") == children
    assert all_pages(parent="r1-c0") == ["r1-g"]
    assert all_pages(thread="alpha") == ["r1", *children, "r2-c"]
    assert all_pages(thread="beta") == ["r1-g"]
    assert all_pages(root="r1", queue="q") == ["r1-c1", "r1-c3", "r1-c5"]
    assert all_pages(root="r1", queue="q", state=TaskState.READY) == ["r1-c1", "r1-c5"]
    assert all_pages(parent="r1", state=TaskState.CANCELLED) == ["r1-c3"]
    assert all_pages(root="r2", thread="alpha") == ["r2-c"]
    assert all_pages(root="nobody") == []
    assert len(all_pages()) == 11
