"""The etcd key layout under one prefix (default ``/coordinator``). Pure string building.

Every key the coordinator reads or writes is named here and nowhere else, so a task's record,
its index keys and its event, which one transaction changes together, cannot drift apart by a
typo in some caller.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PRIORITY = 999


@dataclass(frozen=True)
class Keyspace:
    """Every key the coordinator reads or writes, derived from one prefix."""

    prefix: str = "/coordinator"

    @property
    def epoch(self) -> str:
        """Scheduler epoch (decimal integer)."""
        return f"{self.prefix}/epoch"

    @property
    def versions(self) -> str:
        """The version gate's record (JSON: schema and minimum coordinator/SDK versions)."""
        return f"{self.prefix}/meta/versions"

    @property
    def claims_paused(self) -> str:
        """Exists while new claims are paused."""
        return f"{self.prefix}/control/claims_paused"

    def queue_paused(self, queue: str) -> str:
        """Exists while new claims of one queue's tasks are paused (value: the reason)."""
        return f"{self.queue_paused_prefix}{queue}"

    @property
    def queue_paused_prefix(self) -> str:
        """Range of the paused queues."""
        return f"{self.prefix}/control/queue_paused/"

    def task(self, task_id: str) -> str:
        """The task record."""
        return f"{self.prefix}/tasks/{task_id}"

    @property
    def tasks_prefix(self) -> str:
        """Range of every task record."""
        return f"{self.prefix}/tasks/"

    def input(self, task_id: str) -> str:
        """A task's input, raw bytes, when its record says ``input_in_key`` (schema 2)."""
        return f"{self.inputs_prefix}{task_id}"

    @property
    def inputs_prefix(self) -> str:
        """Range of every input kept in a key of its own."""
        return f"{self.prefix}/inputs/"

    def ready(self, queue: str, priority: int, seq: int, task_id: str) -> str:
        """Ready-index entry. Sorts by queue, then higher priority first, then FIFO."""
        return f"{self.ready_prefix(queue)}{MAX_PRIORITY - priority:03d}/{seq:020d}/{task_id}"

    def ready_prefix(self, queue: str = "") -> str:
        """Range of the ready index (of one queue, or of all queues if empty)."""
        if queue:
            return f"{self.prefix}/ready/{queue}/"
        return f"{self.prefix}/ready/"

    def delayed(self, due: float, task_id: str) -> str:
        """Delayed-index entry of a DELAYED task: sorts by the time (ms) it becomes READY."""
        return f"{self.delayed_prefix}{due_ms(due):015d}/{task_id}"

    @property
    def delayed_prefix(self) -> str:
        """Range of the delayed index."""
        return f"{self.prefix}/delayed/"

    def delayed_due_end(self, now: float) -> str:
        """End of the range of delayed-index entries due at ``now`` (exclusive)."""
        return f"{self.delayed_prefix}{int(now * 1000) + 1:015d}"

    def deadline(self, at: float, task_id: str) -> str:
        """Deadline-index entry of a task with a schedule_to_close, while it awaits a result."""
        return f"{self.deadlines_prefix}{due_ms(at):015d}/{task_id}"

    @property
    def deadlines_prefix(self) -> str:
        """Range of the deadline index."""
        return f"{self.prefix}/deadlines/"

    def deadlines_due_end(self, now: float) -> str:
        """End of the range of deadline-index entries passed at ``now`` (exclusive)."""
        return f"{self.deadlines_prefix}{int(now * 1000) + 1:015d}"

    def claim(self, task_id: str) -> str:
        """The live claim: attached to the claim's etcd lease, gone when it expires."""
        return f"{self.prefix}/claims/{task_id}"

    @property
    def claims_prefix(self) -> str:
        """Range of every live claim."""
        return f"{self.prefix}/claims/"

    def claimed(self, task_id: str) -> str:
        """Claimed index (no lease): lets the reclaimer find expired claims in O(claimed)."""
        return f"{self.prefix}/claimed/{task_id}"

    @property
    def claimed_prefix(self) -> str:
        """Range of the claimed index."""
        return f"{self.prefix}/claimed/"

    def attempt(self, task_id: str, attempt_id: str) -> str:
        """One attempt record."""
        return f"{self.prefix}/attempts/{task_id}/{attempt_id}"

    def attempts_prefix(self, task_id: str) -> str:
        """Range of a task's attempts."""
        return f"{self.prefix}/attempts/{task_id}/"

    def staging(self, task_id: str, attempt_id: str) -> str:
        """A staged result: any attempt may write its own; never canonical."""
        return f"{self.prefix}/staging/{task_id}/{attempt_id}"

    @property
    def staging_prefix(self) -> str:
        """Range of every staged result."""
        return f"{self.prefix}/staging/"

    def result(self, task_id: str, revision: int) -> str:
        """The canonical result of one task revision; created at most once, by commit."""
        return f"{self.results_prefix}{task_id}/{revision:010d}"

    def results_of(self, task_id: str) -> str:
        """Range of one task's canonical results (one per revision)."""
        return f"{self.results_prefix}{task_id}/"

    @property
    def results_prefix(self) -> str:
        """Range of every canonical result."""
        return f"{self.prefix}/results/"

    def event(self, task_id: str, prev_state_version: int) -> str:
        """A transition event, keyed by the task's state_version before the transition.

        The txn that writes it compares that state_version, so the key is unique per transition
        and sorts in transition order.
        """
        return f"{self.prefix}/events/{task_id}/{prev_state_version:020d}"

    def events_prefix(self, task_id: str = "") -> str:
        """Range of the events (of one task, or all)."""
        if task_id:
            return f"{self.prefix}/events/{task_id}/"
        return f"{self.prefix}/events/"

    # --- lifecycle: dependencies, identity indexes, idempotency keys (issue 4) ---------------

    def waiting(self, task_id: str) -> str:
        """Waiting index (no lease): lets the releaser find WAITING tasks in O(waiting)."""
        return f"{self.waiting_prefix}{task_id}"

    @property
    def waiting_prefix(self) -> str:
        """Range of the waiting index."""
        return f"{self.prefix}/waiting/"

    def blocked(self, task_id: str) -> str:
        """Blocked index (value: the queue): a WAITING task with a FAILED or CANCELLED
        upstream (domain/waiting.py)."""
        return f"{self.blocked_prefix}{task_id}"

    @property
    def blocked_prefix(self) -> str:
        """Range of the blocked index."""
        return f"{self.prefix}/blocked/"

    def overdue(self, task_id: str) -> str:
        """Overdue index (value: the queue): a WAITING task past its schedule_to_close."""
        return f"{self.overdue_prefix}{task_id}"

    @property
    def overdue_prefix(self) -> str:
        """Range of the overdue index."""
        return f"{self.prefix}/overdue/"

    def deps(self, task_id: str) -> str:
        """A task's outgoing edges (JSON list); rewritten only when its edges change, so the
        cycle check can compare it without aborting on unrelated state changes."""
        return f"{self.deps_prefix}{task_id}"

    @property
    def deps_prefix(self) -> str:
        """Range of every task's outgoing edges."""
        return f"{self.prefix}/deps/"

    def dependent(self, upstream: str, dependent: str) -> str:
        """Reverse edge: ``dependent`` depends on ``upstream`` (empty value)."""
        return f"{self.dependents_prefix(upstream)}{dependent}"

    def dependents_prefix(self, upstream: str = "") -> str:
        """Range of the reverse edges (of one upstream, or all)."""
        if upstream:
            return f"{self.prefix}/dependents/{upstream}/"
        return f"{self.prefix}/dependents/"

    def by_identity(self, kind: str, value: str, task_id: str) -> str:
        """Identity index entry (kind: root, parent or thread; value already key-safe)."""
        return f"{self.identity_prefix(kind, value)}{task_id}"

    def identity_prefix(self, kind: str = "", value: str = "") -> str:
        """Range of an identity index (of one value of one kind, of one kind, or all)."""
        if kind and value:
            return f"{self.prefix}/index/{kind}/{value}/"
        if kind:
            return f"{self.prefix}/index/{kind}/"
        return f"{self.prefix}/index/"

    def idem(self, principal: str, key: str, *, claims: bool = False) -> str:
        """A stored response of a keyed request, scoped to the calling principal; those of
        calls that hand out ``claims`` apart (they live only as long as a lease, and are not
        counted against the principal's bound: store/control/idempotency.py)."""
        if claims:
            return f"{self.prefix}/idem-claims/{principal}/{key}"
        return f"{self.idem_prefix}{principal}/{key}"

    def keyed_claims(self, principal: str, key: str) -> str:
        """The claims a keyed ClaimNext won, written by its own claim txns
        (store/claims/claim_keys.py)."""
        return f"{self.prefix}/keyed-claims/{principal}/{key}"

    @property
    def idem_prefix(self) -> str:
        """Range of every stored idempotent response."""
        return f"{self.prefix}/idem/"

    # --- side effects (issue 3, store/effects/effect.py) ------------------------------------------

    def effect(self, effect_id: str) -> str:
        """One effect record (effect_id: domain/effect_ids.py)."""
        return f"{self.effects_prefix}{effect_id}"

    @property
    def effects_prefix(self) -> str:
        """Range of every effect record."""
        return f"{self.prefix}/effects/"

    def open_effect(self, task_id: str, effect_id: str) -> str:
        """Present (empty) exactly while the effect is PREPARED or UNKNOWN: written in the txn
        that changes the effect, so a task's uncertain effects are one short range away."""
        return f"{self.open_effects_prefix(task_id)}{effect_id}"

    def open_effects_prefix(self, task_id: str = "") -> str:
        """Range of the uncertain effects (of one task, or all)."""
        if task_id:
            return f"{self.prefix}/open-effects/{task_id}/"
        return f"{self.prefix}/open-effects/"

    def reconcile(self, task_id: str, effect_id: str) -> str:
        """An open reconciliation of an UNKNOWN effect (value: its owner and deadline): written
        in the txn that records UNKNOWN, deleted in the one that resolves or escalates it."""
        return f"{self.reconcile_prefix(task_id)}{effect_id}"

    def reconcile_prefix(self, task_id: str = "") -> str:
        """Range of the open reconciliations (of one task, or all: the sweeper's scan)."""
        if task_id:
            return f"{self.prefix}/reconcile/{task_id}/"
        return f"{self.prefix}/reconcile/"

    # --- managed jobs (issue 8, store/effects/jobs.py) --------------------------------------------

    def job(self, task_id: str, job_id: str) -> str:
        """One managed job record (authoritative)."""
        return f"{self.jobs_prefix(task_id)}{job_id}"

    def jobs_prefix(self, task_id: str = "") -> str:
        """Range of the job records (of one task, or all)."""
        if task_id:
            return f"{self.prefix}/jobs/{task_id}/"
        return f"{self.prefix}/jobs/"

    def worker_job(self, worker_id: str, job_id: str) -> str:
        """Per-worker job index (value: the task id), written with the record: a restarted
        worker finds its jobs in one short range."""
        return f"{self.worker_jobs_prefix(worker_id)}{job_id}"

    def worker_jobs_prefix(self, worker_id: str = "") -> str:
        """Range of the per-worker job index (of one worker, or all)."""
        if worker_id:
            return f"{self.prefix}/jobs-by-worker/{worker_id}/"
        return f"{self.prefix}/jobs-by-worker/"

    # --- retention (issue 16, store/retention_index.py, store/retention/pruner.py) ----------------

    def prune_due(self, due_us: int, task_id: str) -> str:
        """Prune index: a terminal task due for pruning at ``due_us`` (microseconds), written
        in the txn that makes it terminal (value: JSON of its queue and finish time)."""
        return f"{self.prune_due_prefix}{due_us:020d}/{task_id}"

    @property
    def prune_turn(self) -> str:
        """Held on a lease by the one replica whose pruner runs a pass now."""
        return f"{self.prefix}/control/prune-turn"

    @property
    def prune_due_prefix(self) -> str:
        """Range of the prune index, in due-time order."""
        return f"{self.prefix}/prune-due/"

    def tombstone(self, task_id: str) -> str:
        """What stays of a pruned task (JSON Tombstone); its id is refused while it exists."""
        return f"{self.tombstones_prefix}{task_id}"

    @property
    def tombstones_prefix(self) -> str:
        """Range of every tombstone."""
        return f"{self.prefix}/tombstones/"

    def tombstone_due(self, due_us: int, task_id: str) -> str:
        """Tombstone expiry index: the tombstone of ``task_id`` is removed at ``due_us``."""
        return f"{self.tombstone_due_prefix}{due_us:020d}/{task_id}"

    @property
    def tombstone_due_prefix(self) -> str:
        """Range of the tombstone expiry index, in due-time order."""
        return f"{self.prefix}/tombstone-due/"

    def attempt_sweep(self, due_us: int, task_id: str, attempt_id: str) -> str:
        """Sweep index: attempt ``attempt_id`` of ``task_id`` ended while the task stays live;
        at ``due_us`` its staged result and finished job records are archived and removed."""
        return f"{self.attempt_sweep_prefix}{due_us:020d}/{task_id}/{attempt_id}"

    @property
    def attempt_sweep_prefix(self) -> str:
        """Range of the sweep index of ended attempts, in due-time order."""
        return f"{self.prefix}/attempt-sweep/"

    def prune_pending(self, task_id: str) -> str:
        """Written by a prune too large for one txn, deleted by its last page: the records of
        ``task_id`` still to delete (its task key is already gone)."""
        return f"{self.prune_pending_prefix}{task_id}"

    @property
    def prune_pending_prefix(self) -> str:
        """Range of the unfinished prunes."""
        return f"{self.prefix}/prune-pending/"

    def task_effect(self, task_id: str, effect_id: str) -> str:
        """Per-task effect index (empty), written with the effect's first record: effect keys
        are hashes, and pruning a task must find every effect it owns."""
        return f"{self.task_effects_prefix(task_id)}{effect_id}"

    def task_effects_prefix(self, task_id: str = "") -> str:
        """Range of the per-task effect index (of one task, or all)."""
        if task_id:
            return f"{self.prefix}/task-effects/{task_id}/"
        return f"{self.prefix}/task-effects/"


def due_ms(seconds: float) -> int:
    """A due time in whole milliseconds, rounded up (an entry is never due early)."""
    return -int(-seconds * 1000 // 1)


def task_id_from_ready_key(key: str) -> str:
    """The task id at the end of a ready-index key."""
    return key.rsplit("/", 1)[1]
