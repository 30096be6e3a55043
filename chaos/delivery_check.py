"""The rules of a claim nobody received (the ``long-poll-cancel`` scenario, chaos/abandon.py).

Per claim in etcd's log:

* a claim the server gave back (its answer could not be delivered: a ``give_back``, or past the
  allowance the counted move that says so, ``EtcdWrite.given_back``) must not have
  reached anyone: a caller that heard CLAIMED for it holds a fence the server took back
  (``delivered-claim-given-back``);
* a claim made for a poll its caller abandoned, and not given back, is counted against the
  task's budget although nobody received it. The server cannot see an answer lost after it
  handed it to gRPC (it is on the wire when the caller leaves): such a claim was made before
  the caller left, and is tallied as lost in flight (what the SDK's idempotency key recovers).
  A claim made after the caller had left (by the replica's event time, the caller's wall clock
  at its completion, one host) is what the server must never do: its waiter should have left
  the line, or its claim should have been given back (``undelivered-attempt-counted``).
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.history import ABANDONED, EtcdWrite, Observed, Operation, OpKind
from chaos.violation import Rule, Violation
from coordinator.domain.states import Op as Transition

SLACK = 0.25
"""Seconds a replica's end of a call may lag its caller's (the server's own deadline timer and
the cancel's trip): a claim made within them of the caller leaving is not held against it."""


def undelivered_claims(
    ops: Sequence[Operation], writes: Sequence[EtcdWrite]
) -> tuple[list[Violation], int]:
    """The violations among the log's claims, and how many were lost in flight. ``ops`` are
    the calls as recorded (not settled from the log: settling hides whether a call heard)."""
    heard = {
        o.attempt_id
        for o in ops
        if o.op is OpKind.CLAIM and o.outcome is Observed.CLAIMED and o.attempt_id
    }
    left = {
        o.request_id: o
        for o in ops
        if o.op is OpKind.CLAIM and o.indefinite and o.reason == ABANDONED and o.request_id
    }
    given_back = {w.attempt_id for w in writes if w.given_back}
    violations: list[Violation] = []
    in_flight = 0
    for write in writes:
        label = f"{write.op}@{write.revision}({write.attempt_id or '-'})"
        if write.given_back and write.attempt_id in heard:
            detail = "the server gave back a claim whose caller heard CLAIMED"
            violations.append(
                Violation(Rule.DELIVERED_CLAIM_GIVEN_BACK, write.task, (label,), detail)
            )
        if write.op is not Transition.CLAIM or write.attempt_id in given_back | heard:
            continue
        poll = left.get(write.request_id)
        if poll is None:
            continue  # not an abandoned poll's claim: the other rules hold it
        if poll.end_wall is not None and write.at > poll.end_wall + SLACK:
            detail = (
                f"claimed {write.at - poll.end_wall:.3f} s after its caller left, never given "
                "back: an attempt counted that nobody received"
            )
            labels = (poll.label(), label)
            violations.append(
                Violation(Rule.UNDELIVERED_ATTEMPT_COUNTED, write.task, labels, detail)
            )
        else:
            in_flight += 1
    return violations, in_flight


def abandoned_polls(ops: Sequence[Operation]) -> int:
    """The polls their callers left before an answer came."""
    return sum(o.op is OpKind.CLAIM and o.indefinite and o.reason == ABANDONED for o in ops)
