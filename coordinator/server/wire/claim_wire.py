"""Live claims on the wire (ListClaims): the page bounds and token, and each claim with its
lease as the store read it. Pure and mechanical (see common_wire)."""

from __future__ import annotations

from coordinator.domain import validation
from coordinator.domain.live_claims import LiveClaim
from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.common_wire import timestamp_to_proto
from coordinator.store.claims.live_claims import ClaimsPage
from coordinator.v1 import tasks_pb2

DEFAULT_CLAIMS_PAGE = 50
MAX_CLAIMS_PAGE = 100
"""Claims per page at most: each costs a LeaseTimeToLive call to etcd."""

# --- proto -> domain -------------------------------------------------------------------------


def parse_claims_page_size(value: int) -> int:
    """A ListClaims page size in 1-100; 0 means 50."""
    if value == 0:
        return DEFAULT_CLAIMS_PAGE
    if not 1 <= value <= MAX_CLAIMS_PAGE:
        raise InvalidArgument(
            f"page_size must be between 1 and {MAX_CLAIMS_PAGE} (0 means {DEFAULT_CLAIMS_PAGE}; "
            f"each claim costs a lease read), got {value}"
        )
    return value


def parse_claims_page_token(value: str, queue: str) -> str:
    """A ListClaims page token (the task id the previous page ended at) of the same ``queue``
    filter; empty: the first page."""
    return page_tokens.parse(
        "ListClaims", {"queue": queue}, value, lambda tid: validation.task_id(tid, "page_token")
    )


# --- domain -> proto -------------------------------------------------------------------------


def live_claim_to_proto(live: LiveClaim) -> tasks_pb2.LiveClaim:
    """One live claim: the task's fence and attempt, the claim key, the lease as etcd said."""
    task, claim, lease = live.task, live.claim, live.lease
    return tasks_pb2.LiveClaim(
        task_id=task.task_id,
        queue=task.queue,
        attempt=task.attempt,
        attempt_id=claim.attempt_id,
        owner_id=claim.owner_id,
        claim_generation=claim.generation,
        scheduler_epoch=task.scheduler_epoch,
        claimed_at=timestamp_to_proto(claim.claimed_at),
        lease_id=claim.lease_id,
        lease_granted_seconds=lease.granted,
        lease_remaining_seconds=lease.remaining,
        lease_expires_at=timestamp_to_proto(lease.expires_at),
        lease_refreshed_at=timestamp_to_proto(lease.refreshed_at),
        renewed=lease.renewed,
        progress=claim.progress,
        progress_at=timestamp_to_proto(claim.progress_at or claim.claimed_at),
        renew_limit_at=timestamp_to_proto(claim.deadline),
    )


def claims_page_to_proto(page: ClaimsPage, queue: str) -> tasks_pb2.ListClaimsResponse:
    """ListClaimsResponse of one page of ``queue``'s claims (empty: every queue's)."""
    return tasks_pb2.ListClaimsResponse(
        claims=[live_claim_to_proto(c) for c in page.claims],
        next_page_token=page_tokens.issue("ListClaims", {"queue": queue}, page.next_page_token),
        read_at=timestamp_to_proto(page.read_at),
    )
