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

    max_streams: int = 32
    """Long-lived calls open at once on the replica; each holds one handler thread."""
    max_per_principal: int = 8
    """Long-lived calls one principal may hold open at once."""
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


def admission(limits: StreamLimits, *, open_total: int, open_of_principal: int) -> Admission:
    """The decision for one more call, given what is open now (the replica's, the caller's)."""
    if open_of_principal >= limits.max_per_principal:
        return Admission.PRINCIPAL_FULL
    if open_total >= limits.max_streams:
        return Admission.SERVER_FULL
    return Admission.ADMITTED


def refusal_message(decision: Admission, limits: StreamLimits, principal: str) -> str:
    """What a refused caller reads: which bound, its value and the setting that sets it."""
    if decision is Admission.PRINCIPAL_FULL:
        who = (
            "unauthenticated callers (who share one count) already hold"
            if principal == UNAUTHENTICATED_CALLERS
            else f"principal {principal!r} already holds"
        )
        return (
            f"{who} {limits.max_per_principal} open streams, the most one principal may "
            "(max_streams_per_principal); close one, or raise max_streams_per_principal"
        )
    return (
        f"this replica already serves {limits.max_streams} open streams, its limit "
        "(max_streams); retry later or on another replica, or raise max_streams"
    )
