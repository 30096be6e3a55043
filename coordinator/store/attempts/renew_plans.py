"""A renewal's pieces that do no I/O: the claim to renew, its view, the txn it sends, and
what the view is once the txn landed (store/attempts/renewals.py runs them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from coordinator.domain.decisions import Fence, FenceView
from coordinator.domain.records import ClaimRecord, with_changes
from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.store.etcd.ops import Compare, NestedTxn, RequestOp, nested_txn
from coordinator.store.types import RenewResult


@dataclass(frozen=True)
class Renewal:
    """One claim to renew: its fence, the latest progress marker, and a checkpoint to keep
    (None: keep the one stored)."""

    fence: Fence
    progress: str = ""
    checkpoint: bytes | None = None


RenewAnswer = RenewResult | CoordinatorError
"""A renewal's answer, or the error a lone Renew would have raised for it."""


@dataclass
class Txns:
    """A claim's txns, built once and sent again while they stay the same (the fence check is
    the same every round; the renewal txn while the claim key's mod_revision is)."""

    fence: list[Compare] | None = None
    check: NestedTxn | None = None
    quiet: NestedTxn | None = None  # the renewal that writes nothing
    quiet_for: int = 0  # the claim key's mod_revision it pins


@dataclass(frozen=True)
class Known:
    """A claim's view and its attempt key's mod_revision (the claim key's is in the view);
    ``remembered``: not read by this call, so only a txn may accept on it."""

    view: FenceView
    attempt_revision: int
    remembered: bool = False
    txns: Txns = field(default_factory=Txns, compare=False)


@dataclass
class Plan:
    """One claim's txn in this round: ``fence`` (fence_compares) then the ``pins`` that make
    its view current, and the writes."""

    index: int
    known: Known
    fence: list[Compare]
    pins: list[Compare]
    ops: list[RequestOp] = field(default_factory=list)
    claim: ClaimRecord | None = None  # written: the marker moved
    attempt_written: bool = False
    checkpoint_refused: str = ""  # the space guard's refusal of a new checkpoint

    @property
    def compares(self) -> list[Compare]:
        """Every compare of the txn."""
        return [*self.fence, *self.pins]

    def txn(self) -> NestedTxn:
        """The txn to send (the claim's cached one when it writes nothing)."""
        txns = self.known.txns
        quiet = not self.ops and len(self.pins) == 1
        if not quiet:
            return nested_txn(self.compares, self.ops)
        claim = self.known.view.claim
        assert claim is not None
        if txns.quiet is None or txns.quiet_for != claim.mod_revision:
            txns.quiet, txns.quiet_for = nested_txn(self.compares), claim.mod_revision
        return txns.quiet

    def check(self) -> NestedTxn:
        """The fence alone, to compare again after the keepalive."""
        txns = self.known.txns
        if txns.check is None:
            txns.check = nested_txn(self.fence)
        return txns.check


def lease_of(plan: Plan) -> int:
    """The lease of the claim ``plan`` renews."""
    claim = plan.known.view.claim
    assert claim is not None
    return claim.lease_id


def after_landing(plan: Plan, renewal: Renewal, revision: int) -> Known:
    """The view once ``plan``'s txn landed at ``revision``: what it wrote, as etcd now holds it
    (kept to be remembered: the next renewal of the claim decides on it, through its txn)."""
    known = plan.known
    written = plan.claim is not None or plan.attempt_written
    if not written:
        return known if known.remembered else with_changes(known, remembered=True)
    view = known.view
    claim = view.claim
    assert claim is not None
    if plan.claim is not None:
        claim = with_changes(plan.claim, mod_revision=revision)
    attempt, attempt_revision = view.attempt, known.attempt_revision
    if plan.attempt_written and renewal.checkpoint is not None:
        attempt = with_changes(attempt, checkpoint=renewal.checkpoint, mod_revision=revision)
        attempt_revision = revision
    return Known(
        with_changes(view, claim=claim, attempt=attempt), attempt_revision, True, known.txns
    )


def duplicates(renewals: Sequence[Renewal]) -> Iterator[tuple[int, CoordinatorError]]:
    """Every item naming a task an earlier item of the same call names."""
    seen: dict[str, int] = {}
    for i, renewal in enumerate(renewals):
        task_id = renewal.fence.task_id
        if task_id in seen:
            yield (
                i,
                InvalidArgument(
                    f"renewals[{i}] names task {task_id!r}, as renewals[{seen[task_id]}] does: "
                    "renew each claim once per call"
                ),
            )
        else:
            seen[task_id] = i
