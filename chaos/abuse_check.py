"""The abuse scenario's rules (chaos/flood.py): a flood stream past the caps is refused
RESOURCE_EXHAUSTED, and only so; the consumer that never reads is ended by the server, by one of
the bounds that may end it (its maximum age, or its buffer: ``behind``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import grpc

from chaos.history import Observed, Operation, OpKind
from chaos.violation import Rule, Violation

ENDED_BY = frozenset({"max_age", "behind"})
"""How the server may end a stream its caller never reads: at its maximum age (UNAVAILABLE), or
once its buffer stayed full (RESOURCE_EXHAUSTED). Anything else - still open at the heal, a bare
CANCELLED - means the stream held its slot and thread on."""


def refused_at_the_caps(op: Operation) -> bool:
    """Whether ``op`` is a flood stream refused RESOURCE_EXHAUSTED."""
    return (
        op.op is OpKind.WATCH
        and op.outcome is Observed.REFUSED
        and op.reason == grpc.StatusCode.RESOURCE_EXHAUSTED.name
    )


def stream_refusals(ops: Sequence[Operation]) -> list[Violation]:
    """A stream past the caps is refused RESOURCE_EXHAUSTED (and only so): any other refusal
    of a flood stream means the caps leaked into another failure (a timeout, an error)."""
    return [
        Violation(
            Rule.STREAM_REFUSED_WRONGLY,
            "",
            (op.label(),),
            f"refused {op.reason or '?'}, not RESOURCE_EXHAUSTED",
        )
        for op in ops
        if op.op is OpKind.WATCH and op.outcome is Observed.REFUSED and not refused_at_the_caps(op)
    ]


def _ended_by_a_bound(op: Operation) -> bool:
    return op.outcome is Observed.ENDED and op.reason in ENDED_BY


def unread_streams_ended(ops: Sequence[Operation]) -> dict[str, int]:
    """Streams nobody read that the server ended, by the bound that ended them."""
    return dict(
        Counter(op.reason for op in ops if op.op is OpKind.UNREAD and _ended_by_a_bound(op))
    )


def unread_streams(ops: Sequence[Operation]) -> list[Violation]:
    """Every stream nobody read was ended by the server, at its age or behind."""
    return [
        Violation(
            Rule.UNREAD_STREAM_NOT_ENDED,
            "",
            (op.label(),),
            f"a stream nobody read ended {op.outcome} {op.reason or '(no status)'}, not by its "
            "maximum age or its buffer",
        )
        for op in ops
        if op.op is OpKind.UNREAD and not _ended_by_a_bound(op)
    ]
