"""The sweep of ended attempts: a live task's old staged results and finished job records get a
lifetime of their own (``ended_attempt_retention``), instead of staying until the task is pruned.

A task that is released, expires, fails and is retried or goes to review keeps living, and each
ended attempt may leave a staged result (up to 512 KiB, never canonical: only the live claim's
holder commits) and managed job records. A task retried for months would pile them up. The move
that ends an attempt without ending the task writes ``{p}/attempt-sweep/{due}/{task}/{attempt}``
(store/retention_index.py); the pruner's pass reads that index up to now, in pages - O(due) - and
for each due attempt:

- archives its staged result and its job records that ended (EXITED, KILLED, LOST) as one
  object of kind ``ended_attempt`` (the archive keeps everything the coordinator removes), and
  only once the sink confirmed
- removes them, each behind a compare that it is as read (a record written since is kept), with
  the index key. A RUNNING job record is kept: a restarted worker needs it to kill or reattach
  the process; its task's prune takes it.

A due key whose task is gone (pruned meanwhile: its records went with it) or whose attempt left
nothing is just deleted. Every request goes through the pruner's pacer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import structlog

from coordinator.archive import ArchiveSink
from coordinator.domain.jobs import TERMINAL_JOB_STATES, JobRecord
from coordinator.domain.records import decode
from coordinator.domain.retention import micros
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV, RequestOp, delete, get, get_prefix, mod_revision_is
from coordinator.store.retention.history import ARCHIVE_FORMAT, entry

log = structlog.get_logger(__name__)

KIND = "ended_attempt"
"""The ``kind`` of a sweep's archive object (a pruned task's object has none)."""
# Due keys per page (a page is archived in one sink write).
_PAGE = 32
# A task's job records read per page; removing one takes two deletes (record, worker index).
_JOBS_PAGE = 50
_MAX_OPS = 128


@dataclass
class _Swept:
    """What one due attempt leaves to archive and remove."""

    due: KV
    task_id: str
    attempt_id: str
    revision: int
    staged: KV | None = None
    jobs: list[tuple[KV, JobRecord]] = field(default_factory=list)

    def archive_object(self, *, archived_at: float) -> dict[str, Any]:
        return {
            "format": ARCHIVE_FORMAT,
            "kind": KIND,
            "task_id": self.task_id,
            "attempt_id": self.attempt_id,
            "archived_at": archived_at,
            "etcd_revision": self.revision,
            "staged": [entry(self.staged)] if self.staged is not None else [],
            "jobs": [entry(kv) for kv, _ in self.jobs],
        }

    @property
    def records(self) -> int:
        return len(self.jobs) + (self.staged is not None)


class AttemptSweep:
    """Archive-then-remove of the records of ended attempts that are due (one pass)."""

    def __init__(self, ctx: StoreContext, sink: ArchiveSink, stop: threading.Event) -> None:
        self._ctx = ctx
        self._sink = sink
        self._stop = stop

    def run(self, now: float) -> int:
        """Sweep every attempt due by ``now``; the number of records removed. Stops at a sink
        that does not confirm (nothing of that page is removed)."""
        keys, kv = self._ctx.keys, self._ctx.kv
        start = keys.attempt_sweep_prefix
        end = f"{keys.attempt_sweep_prefix}{micros(now) + 1:020d}"
        removed = 0
        while not self._stop.is_set():
            page, _ = kv.range_page(start, end, limit=_PAGE)
            swept = [s for due in page if (s := self._read(due)) is not None]
            if swept and not self._archive([s for s in swept if s.records]):
                break
            removed += sum(self._remove(s) for s in swept)
            if len(page) < _PAGE:
                break
            start = page[-1].key + "\0"
        self._ctx.metrics.swept_records.inc(removed)
        return removed

    def _read(self, due: KV) -> _Swept | None:
        """The due attempt's records (None once the key is settled without them)."""
        ctx, keys = self._ctx, self._ctx.keys
        task_id, attempt_id = due.key.rsplit("/", 2)[1:]
        snap = ctx.kv.read(
            get(keys.task(task_id)),
            get(keys.staging(task_id, attempt_id)),
            get_prefix(keys.jobs_prefix(task_id), limit=_JOBS_PAGE),
        )
        swept = _Swept(due, task_id, attempt_id, snap.revision, staged=snap.range_one(1))
        if snap.range_one(0) is None:  # pruned meanwhile: its records went with it
            ctx.kv.txn([mod_revision_is(due.key, due.mod_revision)], [delete(due.key)])
            return None
        jobs, more = snap.range_kvs(2), snap.range_more(2)
        end = ctx.kv.prefix_end(keys.jobs_prefix(task_id))
        while True:
            for kv in jobs:
                job = decode(JobRecord, kv.value)
                if job.attempt_id == attempt_id and job.state in TERMINAL_JOB_STATES:
                    swept.jobs.append((kv, job))
            if not more:
                return swept
            after = jobs[-1].key + "\0"
            jobs, _ = ctx.kv.range_page(after, end, limit=_JOBS_PAGE, revision=snap.revision)
            more = len(jobs) == _JOBS_PAGE

    def _archive(self, swept: list[_Swept]) -> bool:
        """One sink write for the page; False (counted, logged) if it did not confirm."""
        if not swept:
            return True
        at = self._ctx.clock.now()
        try:
            self._sink.write([s.archive_object(archived_at=at) for s in swept])
        except Exception as exc:
            self._ctx.metrics.archive_failures.inc()
            log.error(
                "archive write failed; no ended attempt's records removed",
                sink=self._sink.url,
                attempts=len(swept),
                error=f"{type(exc).__name__}: {exc}",
            )
            return False
        return True

    def _remove(self, swept: _Swept) -> int:
        """Delete the archived records, each only as read, then the due key; the count."""
        keys, kv = self._ctx.keys, self._ctx.kv
        pairs: list[tuple[KV, list[RequestOp]]] = []
        if swept.staged is not None:
            pairs.append((swept.staged, [delete(swept.staged.key)]))
        for job_kv, job in swept.jobs:
            index = keys.worker_job(job.worker_id, job.job_id)
            pairs.append((job_kv, [delete(job_kv.key), delete(index)]))
        removed = 0
        per_txn = _MAX_OPS // 3  # a compare and up to two deletes each
        for start in range(0, len(pairs), per_txn):
            page = pairs[start : start + per_txn]
            compares = [mod_revision_is(record.key, record.mod_revision) for record, _ in page]
            if kv.txn(compares, [op for _, ops in page for op in ops]).succeeded:
                removed += len(page)
            # else: one was written since (a late StageResult): kept, it goes with its task
        kv.txn([mod_revision_is(swept.due.key, swept.due.mod_revision)], [delete(swept.due.key)])
        return removed
