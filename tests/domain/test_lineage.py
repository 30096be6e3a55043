"""The identity index rule (domain/lineage.py ``identity_keys``): the keys a task's create
writes, its prune deletes and the doctor expects are one list."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.keys import Keyspace
from coordinator.domain.lineage import identity_keys
from tests.domain.samples import TASK

KEYS = Keyspace("/p")


def test_a_child_has_root_thread_and_parent_keys_with_the_thread_escaped() -> None:
    child = replace(TASK, task_id="qa", root_task_id="root", parent_task_id="dev", thread_key="a/b")
    assert identity_keys(KEYS, child) == [
        "/p/index/root/root/qa",
        "/p/index/thread/a%2Fb/qa",
        "/p/index/parent/dev/qa",
    ]


def test_a_root_has_no_parent_key() -> None:
    root = replace(TASK, task_id="root", root_task_id="root", parent_task_id="", thread_key="x")
    assert identity_keys(KEYS, root) == ["/p/index/root/root/root", "/p/index/thread/x/root"]


def test_a_record_from_before_lineage_is_its_own_root_and_thread() -> None:
    old = replace(TASK, task_id="Old-1", root_task_id="", parent_task_id="", thread_key="")
    assert identity_keys(KEYS, old) == ["/p/index/root/Old-1/Old-1", "/p/index/thread/old-1/Old-1"]
