"""Reading the canonical result of a task revision (``{p}/results/{task}/{revision}``).

Only the commit txn writes a result key, at most once per revision (store/attempts/acceptance.py);
this module only reads it back, for the reviewer who has to see what they accept.
"""

from __future__ import annotations

from coordinator.domain.records import ResultRecord, decode
from coordinator.errors import NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get, get_prefix

LISTED_REVISIONS = 10
"""Revisions with a result that a NOT_FOUND message names at most (a task's revisions have no
bound: every rejection and input change adds one)."""


class ResultStore:
    """Reads canonical results."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def get(self, task_id: str, revision: int = 0) -> ResultRecord:
        """The canonical result of ``revision`` (0: the task's current revision).

        NotFound for an unknown task, or when that revision has no committed result; the
        message then names the revisions that have one.
        """
        ctx, keys = self._ctx, self._ctx.keys
        if revision:
            # The task and the result at one revision of etcd: a result is never read for a
            # task that does not exist.
            snap = ctx.kv.read(get(keys.task(task_id)), get(keys.result(task_id, revision)))
            task_kv, result_kv = snap.range_one(0), snap.range_one(1)
        else:
            task_kv = ctx.kv.get(keys.task(task_id))
            result_kv = None
        if task_kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        if not revision:
            revision = task_from_kv(task_kv).revision
            result_kv = ctx.kv.get(keys.result(task_id, revision))
        if result_kv is None:
            state = task_from_kv(task_kv).state.name
            raise NotFound(
                f"task {task_id!r} has no committed result for revision {revision} "
                f"({self._revisions_with_results(task_id)}); the task is {state}"
            )
        return decode(ResultRecord, result_kv.value)

    def _revisions_with_results(self, task_id: str) -> str:
        """``revisions with one: 3, 1`` (the latest LISTED_REVISIONS first), or that there is
        none."""
        ctx = self._ctx
        snap = ctx.kv.read(
            get_prefix(
                ctx.keys.results_of(task_id),
                keys_only=True,
                limit=LISTED_REVISIONS + 1,
                last_first=True,
            )
        )
        kvs = snap.range_kvs(0)
        revisions = [str(int(kv.key.rsplit("/", 1)[1])) for kv in kvs[:LISTED_REVISIONS]]
        if not revisions:
            return "no revision has one yet"
        more = ", ..." if len(kvs) > LISTED_REVISIONS else ""
        return f"revisions with one, latest first: {', '.join(revisions)}{more}"
