"""The bounds of long-lived calls and the admission decision, as plain data and functions.

Pure (no gRPC, no clock): coordinator.server.streams counts the open calls and asks
``admission`` whether one more may open; the refusal message names the setting to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

UNAUTHENTICATED_CALLERS = ""
"""The per-principal key of callers of the open services (health Watch, reflection), which send
no credentials. No principal is empty, so it never shares a count with a real one."""


@dataclass(frozen=True)
class StreamLimits:
    """The bounds of long-lived calls on one replica (settings in coordinator.config)."""

    max_streams: int = 2048
    """Long-lived calls open at once on the replica; each holds one handler thread."""
    max_per_principal: int = 8
    """Long-lived calls one principal is always let hold (its guaranteed share) while the
    replica has room; past it a principal only borrows idle slots (``reserve``)."""
    reserve: float | None = 0.25
    """The share of ``max_streams`` kept for principals within their guaranteed share: a
    principal past ``max_per_principal`` is admitted only while more slots than that stay free.
    None: ``max_per_principal`` is a hard cap (replays). Not a setting."""
    max_age: float = 600.0
    """Seconds after which a long-lived call is ended with a resumable UNAVAILABLE."""
    max_claim_wait: float = 20.0
    """The longest a long-poll ClaimNext may wait for a task (its wait_seconds bound)."""
    sweep_interval: float = 1.0
    """Seconds between checks of every open call's credentials (at most the token reload
    interval, so a revocation is seen at the reload that brings it). Not a setting."""
    stuck_grace: float = 5.0
    """Seconds a call whose end was decided may take to notice before it is cancelled; a
    handler that looks checks every 0.5 s, so only one that cannot look reaches it. Not a
    setting."""


class Admission(Enum):
    """Whether a new long-lived call may open, and which bound refused it."""

    ADMITTED = "admitted"
    SERVER_FULL = "server_full"
    PRINCIPAL_FULL = "principal_full"


def admission(
    limits: StreamLimits, *, open_total: int, open_of_principal: int, borrows: bool = True
) -> Admission:
    """The decision for one more call, given what is open now (the replica's, the caller's).

    The per-principal bound protects fairness, not threads: a principal within its guaranteed
    share (``max_per_principal``) is admitted while the replica has room; one past it (a pool
    whose hundreds of pods share one token) borrows idle slots, but never the last ``reserve``
    of them, which stay for principals within their share. So a lone principal uses three
    quarters of the replica when nobody else waits, and another principal arriving later still
    finds room for its own share. Nothing is taken back from a borrower (a long poll or a
    stream cannot be preempted without a retry storm): the reserve is what makes borrowing
    safe. ``borrows`` False (callers that share one anonymous count) never borrows.
    """
    guaranteed = open_of_principal < limits.max_per_principal
    if not guaranteed and (
        not borrows
        or limits.reserve is None
        or open_total >= _borrowable(limits.max_streams, limits.reserve)
    ):
        # The caller's own share is what it can act on, so it is named even when the replica
        # is full too.
        return Admission.PRINCIPAL_FULL
    if open_total >= limits.max_streams:
        return Admission.SERVER_FULL
    return Admission.ADMITTED


def _borrowable(max_streams: int, reserve: float) -> int:
    """Slots a principal past its guaranteed share may fill (the replica's, less the reserve)."""
    return max_streams - int(max_streams * reserve)


def refusal_message(decision: Admission, limits: StreamLimits, principal: str) -> str:
    """What a refused caller reads: which bound, its value and the setting that sets it."""
    if decision is Admission.PRINCIPAL_FULL:
        who = (
            "unauthenticated callers (who share one count) already hold"
            if principal == UNAUTHENTICATED_CALLERS
            else f"principal {principal!r} already holds"
        )
        reserve = limits.reserve
        if reserve is None or principal == UNAUTHENTICATED_CALLERS:
            return (
                f"{who} {limits.max_per_principal} open streams, the most one principal may "
                "(max_streams_per_principal); close one, or raise max_streams_per_principal"
            )
        return (
            f"{who} its share of {limits.max_per_principal} open streams or more "
            "(max_streams_per_principal) and the replica's last "
            f"{limits.max_streams - _borrowable(limits.max_streams, reserve)} of "
            f"{limits.max_streams} slots are kept "
            "for other principals; retry later or on another replica, close one, or raise "
            "max_streams"
        )
    return (
        f"this replica already serves {limits.max_streams} open streams, its limit "
        "(max_streams); retry later or on another replica, or raise max_streams"
    )
