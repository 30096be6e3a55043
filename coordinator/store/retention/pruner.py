"""The pruner: archives terminal tasks past their retention, then removes them from etcd.

Every replica runs one, every ``interval`` seconds. A pass reads the prune index
(``{p}/prune-due/``, written in the txn that made each task terminal; store/retention_index.py)
up to now, in pages: O(due tasks), never a scan of the tasks. For each page it reads the
histories at one revision (store/retention/history.py), writes them to the archive sink, and only
once the sink confirmed prunes each task with its own CAS txn (store/retention/prune_ops.py). So:

- one replica's pass at a time (store/retention/prune_turn.py: the others skip theirs while
  it holds the turn); a task that moved since it was read is kept (its CAS fails), and two
  passes that overlap all the same (one stalled past its turn) archive a task once or twice,
  and exactly one of them prunes it;
- a sink that fails stops the pass before anything is deleted (and is counted and logged);
- a crash between the archive and the prune leaves the task (and its due key) in place: the next
  pass archives it again and prunes it - archived twice, never lost;
- a task with an uncertain effect, an open reconciliation or a WAITING dependent is not pruned:
  its due key moves later (at most an hour), so it is looked at again without being rescanned
  on every pass.

Every etcd request a pass makes (index pages, history reads, archive-then-prune txns, deferrals,
tombstone expiry, unfinished prunes) waits for a slot of one Pacer (store/etcd/pacer.py): at most
``rate`` requests per second per replica, so pruning never competes with claims for etcd however
much is due at once (a pruned task costs about one request: its prune txn plus its share of the
batched reads). The same pass finishes prunes too large for one txn (``{p}/prune-pending/``)
and removes tombstones past ``tombstone_retention`` (``{p}/tombstone-due/``, in due order,
paged), and sweeps the staged results and finished jobs of attempts that ended while their task
stays live, ``ended_attempt_retention`` after they ended (store/retention/attempt_sweep.py).
"""

from __future__ import annotations

import math
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import structlog

from coordinator.archive import ArchiveSink
from coordinator.domain.retention import micros
from coordinator.domain.states import TERMINAL_STATES
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import delete, get_prefix, mod_revision_is, put
from coordinator.store.etcd.pacer import Pacer
from coordinator.store.retention.attempt_sweep import AttemptSweep
from coordinator.store.retention.history import TaskHistory
from coordinator.store.retention.history_read import TASKS_PER_READ, read_histories, read_whole
from coordinator.store.retention.prune_ops import finish_pages, prune_txn
from coordinator.store.retention.prune_turn import PruneTurn
from coordinator.store.retention_index import due_value, finished_at_of

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL = 10.0
DEFAULT_RATE = 500.0
"""etcd requests per second the pruner of one replica makes, at most (about one per task):
twice what one replica finishes on 2 cores (about 250 tasks/s), so in the steady state it never
binds, and a backlog (an outage, a lowered retention, an upgrade) drains at a bounded pace."""
# History reads of a page in flight at once (each at most one 4 MiB message).
_READ_AHEAD = 4
# Due keys read per page; a page is archived in one sink write, unless its histories pass
# _ARCHIVE_BYTES: then in several, so a pass holds at most that much (plus one read's worth).
_PAGE = 64
_ARCHIVE_BYTES = 8 << 20
# Effect-index keys and job records read per page when finishing an unfinished prune.
_FINISH_EFFECTS, _FINISH_JOBS = 500, 50
# Tombstones removed per txn (two deletes each; etcd allows 128 operations per txn).
_TOMBSTONES_PER_TXN = 60
# A task that may not be pruned yet is looked at again after its retention, at most this long.
_MAX_DEFER = 3600.0
# The oldest-terminal gauge reads the head of the whole index (O(index) in etcd 3.4): this often.
_OLDEST_EVERY = 60.0


@dataclass
class PassReport:
    """What one pass did."""

    pruned: int = 0
    archived: int = 0
    deferred: int = 0
    not_pruned: int = 0  # archived, then moved or pruned by another replica before its txn
    finished: int = 0
    tombstones_expired: int = 0
    swept: int = 0
    archive_failed: bool = False

    @property
    def busy(self) -> bool:
        """Whether the pass did anything worth a log line."""
        return any(
            (self.pruned, self.archived, self.deferred, self.not_pruned, self.finished)
        ) or bool(self.tombstones_expired or self.swept or self.archive_failed)


def _ids(chunk: list[tuple[str, str]]) -> list[str]:
    """The distinct task ids of (due key, task id) pairs, in order."""
    return list(dict.fromkeys(task_id for _, task_id in chunk))


@dataclass
class _Batch:
    """The archive batch being gathered: due key and history of each task, and their bytes."""

    ready: list[tuple[str, TaskHistory]] = field(default_factory=list)
    held: int = 0

    def add(self, due_key: str, history: TaskHistory) -> None:
        self.ready.append((due_key, history))
        self.held += history.size()

    def take(self) -> list[tuple[str, TaskHistory]]:
        ready, self.ready, self.held = self.ready, [], 0
        return ready


class Pruner:
    """Archive-then-prune loop of one replica (safe on all replicas at once)."""

    name = "pruner"

    def __init__(
        self,
        ctx: StoreContext,
        sink: ArchiveSink,
        *,
        interval: float = DEFAULT_INTERVAL,
        rate: float = DEFAULT_RATE,
        pacer: Pacer | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._pacer = pacer or Pacer(rate, wait=self._stop.wait)
        # Every request of the pruner, reads included, goes through the pacer.
        self._ctx = replace(ctx, kv=ctx.kv.paced(self._pacer.take))
        self._sink = sink
        self._sweep = AttemptSweep(self._ctx, sink, self._stop)
        self._interval = interval
        self._turn = PruneTurn(self._ctx)
        self._thread: threading.Thread | None = None
        self._oldest_read_at = -math.inf

    def start(self) -> None:
        """Run a pass now, then every interval."""
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop (a pass in progress stops at its next task)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._ctx.admitted():  # refused by the version record: no deletes from here
                self._stop.wait(self._interval)
                continue
            try:
                report = self.pass_in_turn()
                if report is not None and report.busy:
                    log.info("prune pass", **vars(report))
            except Exception as exc:  # etcd outage: the next pass tries again
                log.warning("background work failed", loop=self.name, error=str(exc))
            self._stop.wait(self._interval)

    def pass_in_turn(self) -> PassReport | None:
        """A pass if this replica gets the turn (prune_turn.py), else None: another replica's
        pass is pruning what is due for every replica."""
        if not self._turn.take():
            return None
        try:
            return self.run_pass()
        finally:
            try:
                self._turn.give()
            except Exception as exc:  # its lease expires instead
                log.warning("could not give the prune turn back", error=str(exc))

    def run_pass(self) -> PassReport:
        """One pass: finish unfinished prunes, prune what is due, expire tombstones."""
        report = PassReport()
        report.finished = self._finish_pending()
        now = self._ctx.clock.now()
        keys, kv = self._ctx.keys, self._ctx.kv
        start, end = keys.prune_due_prefix, f"{keys.prune_due_prefix}{micros(now) + 1:020d}"
        while not self._stop.is_set():
            page, _ = kv.range_page(start, end, limit=_PAGE)
            if page:
                self._prune_page([(item.key, item.key.rsplit("/", 1)[1]) for item in page], report)
            # Between pages, not once a pass: a long pass (a backlog) must not keep tombstones
            # past their window, or the steady state grows with the pass.
            report.tombstones_expired += self._expire_tombstones(self._ctx.clock.now())
            if report.archive_failed or len(page) < _PAGE:
                break
            self._turn.keep()
            start = page[-1].key + "\0"
        if not report.archive_failed:
            report.swept = self._sweep.run(now)
        self._observe_oldest(now)
        return report

    def _prune_page(self, entries: list[tuple[str, str]], report: PassReport) -> None:
        random.shuffle(entries)  # replicas walking the same page meet less often
        batch = _Batch()
        chunks = [entries[i : i + TASKS_PER_READ] for i in range(0, len(entries), TASKS_PER_READ)]
        # A pass is bound by etcd's round trips, not by work: the page's reads go out together
        # (each whole in one message, or None: then read page by page as its turn comes).
        with ThreadPoolExecutor(_READ_AHEAD, "pruner-read") as pool:
            reads = [pool.submit(read_whole, self._ctx, _ids(chunk)) for chunk in chunks]
            for chunk, read in zip(chunks, reads, strict=True):
                if not self._prune_chunk(chunk, read.result(), batch, report):
                    return
        # One archive write (one fsync) per page: the sink's cost is per write, not per task.
        if batch.ready and not self._stop.is_set():
            self._archive_and_prune(batch.take(), report)

    def _prune_chunk(
        self,
        chunk: list[tuple[str, str]],
        read: list[TaskHistory] | None,
        batch: _Batch,
        report: PassReport,
    ) -> bool:
        """Sort one read's worth of due tasks into ``batch``, archiving and pruning it whenever
        it holds _ARCHIVE_BYTES; False once the sink failed (the pass stops)."""
        due_keys: dict[str, list[str]] = {}
        for due_key, task_id in chunk:
            due_keys.setdefault(task_id, []).append(due_key)
        # Large histories come one by one, read alone, so the batch bounds them.
        histories = read if read is not None else read_histories(self._ctx, list(due_keys))
        for history in histories:
            for due_key in due_keys.pop(history.task_id):
                if self._sort(due_key, history.task_id, history, report) is not None:
                    batch.add(due_key, history)
            if batch.held >= _ARCHIVE_BYTES and not self._stop.is_set():
                self._archive_and_prune(batch.take(), report)
                if report.archive_failed:
                    return False
        for task_id, keys in due_keys.items():  # not found: pruned meanwhile
            for due_key in keys:
                self._sort(due_key, task_id, None, report)
        return True

    def _sort(
        self, due_key: str, task_id: str, history: TaskHistory | None, report: PassReport
    ) -> TaskHistory | None:
        """``history`` if it may be pruned now; else its due key is dropped or moved later."""
        if history is None:  # pruned meanwhile (another replica): its key is dead
            self._ctx.kv.txn((), [delete(due_key)])
        elif history.task.state not in TERMINAL_STATES:
            # It left its terminal state (RetryTask sends a FAILED task back to READY): its
            # key is dead; the move that makes it terminal again writes a new one.
            task_key = self._ctx.keys.task(task_id)
            compare = mod_revision_is(task_key, history.task_kv.mod_revision)
            self._ctx.kv.txn([compare], [delete(due_key)])
        elif history.blocker():
            self._defer(history, due_key)
            report.deferred += 1
        else:
            return history
        return None

    def _archive_and_prune(self, ready: list[tuple[str, TaskHistory]], report: PassReport) -> None:
        """Archive ``ready``, then prune each (nothing if the sink did not confirm)."""
        archived_at = self._ctx.clock.now()
        objects = [h.archive_object(self._ctx.keys, archived_at=archived_at) for _, h in ready]
        try:
            location = self._sink.write(objects)
        except Exception as exc:
            self._ctx.metrics.archive_failures.inc()
            report.archive_failed = True
            log.error(
                "archive write failed; nothing pruned",
                sink=self._sink.url,
                tasks=len(ready),
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        self._ctx.metrics.archived_tasks.inc(len(ready))
        report.archived += len(ready)
        # The page's prune txns go together (one etcd request when none touches another's
        # keys): sent one at a time, etcd's latency capped the pruner at 75 tasks/s on a loaded
        # 2-core machine, and sent from 32 threads through group commit they were most of the
        # pruner's CPU under load (py-spy). Each still takes a pacer slot of its own.
        if self._stop.is_set():
            return
        now = self._ctx.clock.now()
        txns = [
            prune_txn(self._ctx, history, due_key, archive=location, now=now)
            for due_key, history in ready
        ]
        results = self._ctx.kv.txn_in_order([(txn.compares, txn.ops) for txn in txns])
        for (_, history), txn, result in zip(ready, txns, results, strict=True):
            if not result.succeeded:  # it moved, or another replica pruned it first
                report.not_pruned += 1
                continue
            report.pruned += 1
            self._ctx.metrics.pruned_tasks.inc()
            if txn.pending:
                self._finish(history.task_id)

    def _defer(self, history: TaskHistory, due_key: str) -> None:
        """Move a blocked task's due key later, so passes do not read it again and again."""
        ctx, task = self._ctx, history.task
        delay = min(max(ctx.retention.for_queue(task.queue), self._interval), _MAX_DEFER)
        later = ctx.keys.prune_due(micros(ctx.clock.now() + delay), task.task_id)
        ctx.kv.txn(
            [mod_revision_is(ctx.keys.task(task.task_id), history.task_kv.mod_revision)],
            [delete(due_key), put(later, due_value(task))],
        )
        self._ctx.metrics.prune_deferred.labels(reason=history.blocker()).inc()

    def _finish_pending(self) -> int:
        """Finish the prunes that needed more than one txn (a crash may have stopped them)."""
        keys, kv = self._ctx.keys, self._ctx.kv
        pending, _ = kv.range_page(
            keys.prune_pending_prefix, kv.prefix_end(keys.prune_pending_prefix), limit=_PAGE
        )
        for item in pending:
            self._finish(item.key.rsplit("/", 1)[1])
        return len(pending)

    def _finish(self, task_id: str) -> None:
        """Delete what is left of a pruned task's effects and jobs, a page at a time."""
        keys, kv = self._ctx.keys, self._ctx.kv
        while not self._stop.is_set():
            snap = kv.read(
                get_prefix(
                    keys.task_effects_prefix(task_id), keys_only=True, limit=_FINISH_EFFECTS
                ),
                get_prefix(keys.jobs_prefix(task_id), limit=_FINISH_JOBS),
            )
            effect_index = [item.key for item in snap.range_kvs(0)]
            last = not (snap.range_more(0) or snap.range_more(1))
            for page in finish_pages(
                self._ctx, task_id, effect_index, snap.range_kvs(1), last=last
            ):
                kv.txn((), page)
            if last:
                return

    def _expire_tombstones(self, now: float) -> int:
        """Remove tombstones past their lifetime, one txn per page."""
        keys, kv = self._ctx.keys, self._ctx.kv
        end = f"{keys.tombstone_due_prefix}{micros(now) + 1:020d}"
        expired = 0
        while not self._stop.is_set():
            page, _ = kv.range_page(keys.tombstone_due_prefix, end, limit=_TOMBSTONES_PER_TXN)
            if not page:
                break
            ops = [delete(item.key) for item in page]
            ops += [delete(keys.tombstone(item.key.rsplit("/", 1)[1])) for item in page]
            kv.txn((), ops)
            expired += len(page)
            self._ctx.metrics.tombstones_expired.inc(len(page))
            if len(page) < _TOMBSTONES_PER_TXN:
                break
        return expired

    def _observe_oldest(self, now: float) -> None:
        """Set the oldest-terminal-task gauge from the head of the prune index."""
        # On the store's clock (a test's moves it); a clock that went back reads again.
        if 0 <= now - self._oldest_read_at < _OLDEST_EVERY:
            return
        keys, kv = self._ctx.keys, self._ctx.kv
        head, _ = kv.range_page(
            keys.prune_due_prefix, kv.prefix_end(keys.prune_due_prefix), limit=1
        )
        finished = finished_at_of(head[0].value) if head else 0.0
        self._ctx.metrics.oldest_terminal_age.set(max(0.0, now - finished) if finished else 0.0)
        self._oldest_read_at = now
