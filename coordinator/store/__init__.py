"""The store: claim.v1 applied to etcd with transactions.

The store is in wings whose imports point one way (docs/architecture.md has a row for each):
``etcd/`` (plumbing that knows no task), the shared core at this root (``context``, ``types``,
``fence``, ``transition``), ``indexes/`` (watch-fed replica memory), ``retention/``,
``control/``, ``lifecycle/``, ``attempts/`` (everything that extends or ends a held attempt),
``effects/`` and ``claims/``. The claim txn is ``claims/claim.py``, the fence compares
``fence.py``, the acceptance points ``attempts/acceptance.py``, Renew and RenewMany
``attempts/renewals.py``. This module only assembles the wings into ``Store``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coordinator.archive import ArchiveSink
from coordinator.clock import Clock, SystemClock
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.keys import Keyspace
from coordinator.domain.queue_stats import MAX_REPORTED_QUEUES, QueueReport, queue_report
from coordinator.domain.retention import RetentionPolicy
from coordinator.metrics import METRICS, Metrics
from coordinator.store.attempts.acceptance import AcceptancePoints
from coordinator.store.attempts.failures import Failures
from coordinator.store.attempts.give_back import GiveBacks
from coordinator.store.attempts.reclaimer import Reclaimer
from coordinator.store.attempts.renew_plans import Renewal, RenewAnswer
from coordinator.store.attempts.renewals import Renewals, RenewViews
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.claims.claim import ClaimStore
from coordinator.store.claims.claim_keys import KeyedClaimStore
from coordinator.store.claims.gates import ApprovalGate, QueuePauseGate, ReconcileGate, SpaceGate
from coordinator.store.claims.live_claims import LiveClaims
from coordinator.store.claims.long_poll import LongPoll, ReadyWaiters
from coordinator.store.context import StoreContext
from coordinator.store.control.admin import AdminStore
from coordinator.store.control.idempotency import DEFAULT_TTL as DEFAULT_IDEMPOTENCY_TTL
from coordinator.store.control.idempotency import IdempotencyStore
from coordinator.store.control.versions import Standing, VersionStore
from coordinator.store.effects.effect import EffectStore
from coordinator.store.effects.jobs import JobStore
from coordinator.store.effects.reconcile import ReconcileStore, ReconcileSweeper
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.leases import ClaimLeases
from coordinator.store.indexes.claimed import ClaimedIndex, QueueCountIndex
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.lifecycle.cascade import Cascade
from coordinator.store.lifecycle.deadlines import Deadlines
from coordinator.store.lifecycle.dependencies import DependencyStore
from coordinator.store.lifecycle.events import EventFilter, EventLog, StoredEvent
from coordinator.store.lifecycle.promoter import Promoter
from coordinator.store.lifecycle.releaser import Releaser
from coordinator.store.lifecycle.replay_slots import (
    MAX_REPLAYS,
    MAX_REPLAYS_PER_PRINCIPAL,
    ReplaySlots,
)
from coordinator.store.lifecycle.results import ResultStore
from coordinator.store.lifecycle.retry_task import DeadLetters
from coordinator.store.lifecycle.review import ReviewStore
from coordinator.store.lifecycle.tasks import TaskStore
from coordinator.store.retention.pruner import DEFAULT_INTERVAL as DEFAULT_PRUNE_INTERVAL
from coordinator.store.retention.pruner import DEFAULT_RATE as DEFAULT_PRUNE_RATE
from coordinator.store.retention.pruner import Pruner
from coordinator.store.types import (
    Caller,
    ClaimResult,
    CommitResult,
    DrainStatus,
    FailResult,
    RenewResult,
    StagingResult,
    TaskSpec,
)


@dataclass
class Store:
    """The store's parts, wired to one etcd keyspace."""

    ctx: StoreContext
    ready: ReadyIndex
    claimed: ClaimedIndex
    blocked: QueueCountIndex
    overdue: QueueCountIndex
    tasks: TaskStore
    cascade: Cascade
    results: ResultStore
    claims: ClaimStore
    long_poll: LongPoll
    give_backs: GiveBacks
    acceptance: AcceptancePoints
    renewals: Renewals
    failures: Failures
    dead_letters: DeadLetters
    deadlines: Deadlines
    promoter: Promoter
    admin: AdminStore
    reclaimer: Reclaimer
    dependencies: DependencyStore
    review: ReviewStore
    releaser: Releaser
    events: EventLog
    idempotency: IdempotencyStore
    keyed_claims: KeyedClaimStore
    effects: EffectStore
    reconcile: ReconcileStore
    sweeper: ReconcileSweeper
    jobs: JobStore
    live_claims: LiveClaims
    # Whether the version record admits this replica: its loops and its version gate ask it.
    standing: Standing
    pruner: Pruner | None = None

    @classmethod
    def open(
        cls,
        kv: EtcdKV,
        *,
        keys: Keyspace | None = None,
        limits: ClaimLimits | None = None,
        clock: Clock | None = None,
        scan_interval: float = 5.0,
        idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
        retention: RetentionPolicy | None = None,
        archive: ArchiveSink | None = None,
        prune_interval: float = DEFAULT_PRUNE_INTERVAL,
        prune_rate: float = DEFAULT_PRUNE_RATE,
        promote_interval: float = 0.25,
        max_claim_waiters: int = 2048,
        metrics: Metrics | None = None,
        max_replays: int = MAX_REPLAYS,
        max_replays_per_principal: int = MAX_REPLAYS_PER_PRINCIPAL,
    ) -> Store:
        """Wire the parts (nothing runs until ``start``). Without ``archive`` no pruner runs
        here (terminal tasks are still indexed for whichever replica prunes). ``metrics``
        (default: the process-wide ones) count what the store and a server over it do.
        ``max_replays`` (``_per_principal``) bound the event log replays running at once."""
        ctx, standing = _context(kv, keys, limits, clock, retention, metrics)
        parts, claimed = _Parts.wire(ctx, max_claim_waiters), ClaimedIndex(ctx)
        ready, acceptance, reconcile = parts.ready, parts.acceptance, parts.reconcile
        return cls(
            ctx=ctx,
            ready=ready,
            claimed=claimed,
            blocked=QueueCountIndex(ctx, ctx.keys.blocked_prefix),
            overdue=QueueCountIndex(ctx, ctx.keys.overdue_prefix),
            tasks=parts.tasks,
            cascade=Cascade(ctx, parts.tasks),
            results=ResultStore(ctx),
            claims=parts.claims,
            long_poll=parts.long_poll,
            give_backs=parts.give_backs,
            acceptance=acceptance,
            renewals=Renewals(ctx, parts.held, RenewViews(), claimed),
            failures=Failures(ctx, ready, parts.held, acceptance),
            dead_letters=DeadLetters(ctx, ready),
            deadlines=parts.deadlines,
            promoter=Promoter(ctx, ready, parts.deadlines, interval=promote_interval),
            admin=AdminStore(ctx),
            reclaimer=Reclaimer(ctx, ready, scan_interval=scan_interval),
            dependencies=parts.dependencies,
            review=ReviewStore(ctx, ready),
            releaser=Releaser(ctx, ready, parts.dependencies, scan_interval=scan_interval),
            events=_event_log(ctx, max_replays, max_replays_per_principal),
            idempotency=IdempotencyStore(ctx, ttl=idempotency_ttl),
            keyed_claims=KeyedClaimStore(ctx, ttl=idempotency_ttl),
            effects=EffectStore(ctx, ready, acceptance),
            reconcile=reconcile,
            sweeper=ReconcileSweeper(reconcile, ctx.admitted, interval=scan_interval),
            jobs=JobStore(ctx, acceptance),
            live_claims=LiveClaims(ctx),
            standing=standing,
            pruner=_pruner(ctx, archive, prune_interval, prune_rate),
        )

    def start(self, *, reclaim: bool = True) -> None:
        """Initialise the keyspace, load the ready and claimed indexes, start the background
        loops (reclaimer, releaser, reconcile sweeper, promoter, pruner)."""
        self.admin.ensure_initialized()
        self.standing.current()  # the first reading of the version record, before any call
        self.ready.start()
        self.claimed.start()
        self.blocked.start()
        self.overdue.start()
        if reclaim:
            self.reclaimer.start()
            self.releaser.start()
            self.sweeper.start()
            self.promoter.start()
            if self.pruner is not None:
                self.pruner.start()

    def close(self) -> None:
        """Stop background work (the etcd connection is the caller's)."""
        self.reclaimer.close()
        self.releaser.close()
        self.sweeper.close()
        self.claimed.close()
        self.blocked.close()
        self.overdue.close()
        self.promoter.close()
        if self.pruner is not None:
            self.pruner.close()
        self.give_backs.close()
        self.events.close()
        self.ready.close()

    def queue_report(self, *, cap: int = MAX_REPORTED_QUEUES) -> QueueReport:
        """Ready, oldest ready age, claimed, blocked and overdue per queue, from this replica's
        watch-fed indexes (no etcd read; every replica following the same keys reports the
        same)."""
        return queue_report(
            self.ready.heads(),
            self.claimed.counts(),
            self.ctx.clock.now(),
            cap=cap,
            blocked=self.blocked.counts(),
            overdue=self.overdue.counts(),
        )


__all__ = [
    "Caller",
    "ClaimLimits",
    "ClaimResult",
    "CommitResult",
    "DrainStatus",
    "EtcdKV",
    "EventFilter",
    "FailResult",
    "Keyspace",
    "RenewAnswer",
    "RenewResult",
    "Renewal",
    "StagingResult",
    "Store",
    "StoredEvent",
    "TaskSpec",
]


def _context(
    kv: EtcdKV,
    keys: Keyspace | None,
    limits: ClaimLimits | None,
    clock: Clock | None,
    retention: RetentionPolicy | None,
    metrics: Metrics | None,
) -> tuple[StoreContext, Standing]:
    """The context every part shares, with Store.open's defaults for what is not given, and
    the replica's standing: its background loops work only while the version record admits it."""
    ctx = StoreContext(
        kv,
        keys or Keyspace(),
        limits or ClaimLimits(),
        clock or SystemClock(),
        ClaimLeases(kv),
        retention or RetentionPolicy(),
        metrics or METRICS,
    )
    standing = Standing(VersionStore(ctx).read)
    return replace(ctx, refusal=standing.refusal, writes_schema=standing.writes_schema), standing


@dataclass(frozen=True)
class _Parts:
    """The parts other parts are built over: the ready index, the held claims, the claim path
    with its gates, and the acceptance points (Store.open wires the rest around them)."""

    ready: ReadyIndex
    deadlines: Deadlines
    dependencies: DependencyStore
    held: HeldClaims
    acceptance: AcceptancePoints
    reconcile: ReconcileStore
    claims: ClaimStore
    give_backs: GiveBacks
    tasks: TaskStore
    long_poll: LongPoll

    @classmethod
    def wire(cls, ctx: StoreContext, max_claim_waiters: int) -> _Parts:
        """Build them in dependency order; nothing runs yet."""
        ready = ReadyIndex(ctx)
        waiters = ReadyWaiters(max_claim_waiters, ctx.metrics)
        ready.listen(lambda queue: waiters.notify(queue) if queue else waiters.notify_all())
        dependencies = DependencyStore(ctx, ready)
        held = HeldClaims()
        acceptance = AcceptancePoints(ctx, ready, held)
        reconcile = ReconcileStore(ctx, ready)
        # In this order: a paused queue and a full etcd answer before anything may write; an
        # open reconciliation decides before a hold for approval.
        gates = (
            QueuePauseGate(),
            SpaceGate(ctx),
            ReconcileGate(reconcile),
            ApprovalGate(ctx, ready),
        )
        claims = ClaimStore(ctx, ready, held, gates)
        give_backs = GiveBacks(ctx, ready, held, acceptance)
        return cls(
            ready=ready,
            deadlines=Deadlines(ctx),
            dependencies=dependencies,
            held=held,
            acceptance=acceptance,
            reconcile=reconcile,
            claims=claims,
            give_backs=give_backs,
            tasks=TaskStore(ctx, ready, dependencies),
            long_poll=LongPoll(claims, waiters, give_backs, refusal=ctx.refusal),
        )


def _event_log(ctx: StoreContext, max_replays: int, max_per_principal: int) -> EventLog:
    """The event log, its replays bounded per replica and per principal."""
    slots = ReplaySlots(ctx.metrics, max_replays=max_replays, max_per_principal=max_per_principal)
    return EventLog(ctx, slots=slots)


def _pruner(
    ctx: StoreContext, archive: ArchiveSink | None, interval: float, rate: float
) -> Pruner | None:
    """A pruner where an archive is set; without one this replica prunes nothing."""
    return Pruner(ctx, archive, interval=interval, rate=rate) if archive is not None else None
