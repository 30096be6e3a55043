"""What a WatchEvents follower received, against etcd's own history of the run.

The follower (chaos/follower.py) must see the log exactly as etcd holds it: every event of its
queue once, in position order (revision, then task, then prev_state_version), however often its
stream broke and resumed. Pure: it reads two lists of writes and returns violations.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.history import EtcdWrite
from chaos.violation import Rule, Violation
from coordinator.domain.positions import EventPosition


def follower_agreement(received: Sequence[EtcdWrite], log: Sequence[EtcdWrite]) -> list[Violation]:
    """Gaps (an event of the log never received; one violation per run of consecutive ones),
    duplicates, events out of position order, and events the log does not hold."""
    violations: list[Violation] = []
    in_log = {w.position for w in log}
    seen: set[EventPosition] = set()
    newest: EtcdWrite | None = None
    for write in received:
        position = write.position
        if position in seen:
            violations.append(_one(Rule.FOLLOWER_DUPLICATE, write, "received again"))
            continue
        seen.add(position)
        if position not in in_log:
            violations.append(_one(Rule.FOLLOWER_UNKNOWN_EVENT, write, "not in etcd's history"))
        if newest is not None and position < newest.position:
            detail = f"received after {newest.position}"
            violations.append(_one(Rule.FOLLOWER_OUT_OF_ORDER, write, detail))
        else:
            newest = write
    return violations + _gaps(log, seen)


def _gaps(log: Sequence[EtcdWrite], seen: set[EventPosition]) -> list[Violation]:
    violations: list[Violation] = []
    run: list[EtcdWrite] = []  # consecutive events of the log not received
    for write in [*sorted(log, key=lambda w: w.position), None]:
        if write is not None and write.position not in seen:
            run.append(write)
            continue
        if run:
            first, last = run[0], run[-1]
            violations.append(
                Violation(
                    Rule.FOLLOWER_GAP,
                    first.task if len({w.task for w in run}) == 1 else "",
                    (_label(first), _label(last)),
                    f"{len(run)} event(s) of etcd's history never received, "
                    f"from {first.position} to {last.position}",
                )
            )
            run = []
    return violations


def _one(rule: Rule, write: EtcdWrite, detail: str) -> Violation:
    return Violation(rule, write.task, (_label(write),), f"{write.position} {detail}")


def _label(write: EtcdWrite) -> str:
    return f"{write.op}@{write.position}"
