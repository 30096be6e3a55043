"""The recorded history: one JSONL line per invocation and per completion of an operation.

A worker writes ``{"type": "invoke", "id": ..., ...}`` before a call and ``{"type": "ok" |
"fail" | "info", "id": ..., "outcome": ...}`` after it. ``info`` is Jepsen's indefinite
outcome (a timeout or a lost response: the call may or may not have taken effect); an
invocation with no completion at all (the process was killed) is indefinite too.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from coordinator import request_ids
from coordinator.domain.effects import EffectState
from coordinator.domain.positions import EventPosition
from coordinator.domain.states import Op as Transition
from coordinator.domain.states import TaskState


class End(StrEnum):
    """How a recorded call ended (the ``type`` of its completion line)."""

    OK = "ok"  # answered; the outcome says what
    FAIL = "fail"  # refused before doing anything (a claim that got no task, a refused cancel)
    INFO = "info"  # indefinite: a timeout or a lost response (Jepsen ``:info``)


class OpKind(StrEnum):
    """What a recorded call was."""

    CLAIM = "claim"  # ClaimNext (or Claim, in the naive baseline)
    EFFECT = "effect"  # the chaos worker's effect: prepare -> send / reconcile -> record
    COMMIT = "commit"
    CANCEL = "cancel"  # an operator's CancelTask
    UPDATE_INPUT = "update_input"  # an operator's UpdateInput
    BUMP_EPOCH = "bump_epoch"  # an operator's BumpEpoch (names no task)
    WATCH = "watch"  # a WatchEvents follow stream opened by the abuse scenario's flood
    UNREAD = "unread"  # the abuse scenario's follow stream that is never read until the heal


class Observed(StrEnum):
    """What a recorded call heard, or what the checker settled it to.

    The values are the names the history files hold: the coordinator's answers
    (``coordinator.domain.states.Outcome``), an effect call's status (``EffectStatus``), the
    effect state an indefinite effect call is settled to (``EffectState``), and the checker's
    own. An unknown name in a history file is an error, not a new outcome."""

    # The coordinator's answers.
    OK = "OK"
    CLAIMED = "CLAIMED"
    COMMITTED = "COMMITTED"
    FENCED = "FENCED"
    STALE_INPUT = "STALE_INPUT"
    CANCELLED = "CANCELLED"
    ALREADY_CLAIMED = "ALREADY_CLAIMED"
    STALE_STATE_VERSION = "STALE_STATE_VERSION"
    NOT_CLAIMABLE = "NOT_CLAIMABLE"
    CLAIMS_PAUSED = "CLAIMS_PAUSED"
    NO_READY_TASK = "NO_READY_TASK"
    STALLED = "STALLED"
    RENEW_LIMIT = "RENEW_LIMIT"
    PAYLOAD_CONFLICT = "PAYLOAD_CONFLICT"
    NEEDS_APPROVAL = "NEEDS_APPROVAL"
    RECONCILING = "RECONCILING"
    # How an effect call ended (EffectStatus).
    EXECUTED = "EXECUTED"
    SKIPPED = "SKIPPED"
    RECONCILED = "RECONCILED"
    UNCERTAIN = "UNCERTAIN"
    NOT_PERFORMED = "NOT_PERFORMED"
    CONFLICT = "CONFLICT"
    # The effect state an indefinite effect call left (EffectState; COMMITTED is above).
    PREPARED = "PREPARED"
    UNKNOWN = "UNKNOWN"
    ABSENT = "ABSENT"
    # The checker's own.
    INFO = "info"  # not known whether it took effect
    LOST = "LOST"  # settled: an indefinite call that did not take effect
    REFUSED = "REFUSED"  # refused with an error status (an operator's call, a flood stream)
    ABANDONED = "ABANDONED"  # the caller gave up on it first (a flood stream, at the heal)
    ENDED = "ENDED"  # the server ended a stream (the reason says how: max_age, behind, a code)


INFO = Observed.INFO
"""The outcome of an operation whose effect is unknown."""
ABANDONED = "abandoned"
"""The reason of a call whose caller left before an answer came (an abandoned long poll:
chaos/abandon.py)."""

INVOKE = "invoke"
"""The ``type`` of an invocation line (every other line is a completion: ``End``)."""


@dataclass(frozen=True)
class Operation:
    """One operation of one worker, from invocation to completion (``end`` None: never ended)."""

    id: str
    worker: str
    op: OpKind
    task: str
    start: float
    end: float | None
    outcome: Observed
    reason: str = ""
    attempt: int = 0
    attempt_id: str = ""
    generation: int = 0
    revision: int = 0
    effect_key: str = ""
    request_id: str = ""  # the x-request-id the call carried (coordinator.request_ids)
    applied_at: int = 0  # the etcd revision of the write it made, once matched in etcd's history
    # The recording process's wall clock at completion (None: never ended), for comparing with
    # the replicas' event times (EtcdWrite.at) on one host.
    end_wall: float | None = None

    @property
    def indefinite(self) -> bool:
        """Whether the outcome is unknown (Jepsen ``:info``)."""
        return self.outcome == INFO

    @property
    def lasted(self) -> float:
        """When it ended, or +inf if it never did (killed: it may take effect at any time)."""
        return self.end if self.end is not None else float("inf")

    def label(self) -> str:
        """A short name for reports: ``worker:op#id(task g=generation -> outcome)``."""
        return (
            f"{self.worker}:{self.op}#{self.id}({self.task} g={self.generation} -> {self.outcome})"
        )


@dataclass(frozen=True)
class EtcdWrite:
    """One transition as etcd's own history holds it (an event key's put, read by a watch
    from the first revision): the truth against which indefinite operations are settled."""

    task: str
    revision: int  # the etcd revision of the transition txn
    op: Transition
    to_state: TaskState
    request_id: str = ""
    attempt_id: str = ""
    generation: int = 0  # a claim's generation is its own revision
    at: float = 0.0  # the writing replica's wall clock (EventRecord.at)
    prev_state_version: int = 0  # the task's state_version before it (the event key's end)
    # An undelivered claim given back: a ``give_back``, or, past the allowance, the counted
    # move whose detail says so (domain/retry.py UNDELIVERED_COUNTED).
    given_back: bool = False

    @property
    def position(self) -> EventPosition:
        """Its place in the log: several events share a revision (group commit, the releaser),
        so the revision alone does not order them."""
        return EventPosition(self.revision, self.task, self.prev_state_version)


@dataclass(frozen=True)
class EffectWrite:
    """One put of an effect key as etcd's own history holds it (read by a watch on
    ``{p}/effects/`` from the first revision): a prepare, record, resolve or approval."""

    effect_id: str
    task: str
    revision: int  # the etcd revision of the txn that wrote it
    state: EffectState  # the state it left
    request_id: str = ""  # EffectRecord.request_id: the call that wrote it ("" background)


class Recorder:
    """Appends invocation/completion lines to a JSONL file, flushed line by line."""

    def __init__(self, path: Path, worker: str) -> None:
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._worker = worker
        self._lock = threading.Lock()
        self._seq = 0
        self._request_ids: dict[str, str] = {}

    def invoke(self, op: OpKind, **fields: Any) -> str:
        """Record an invocation with a fresh request id; returns its id for ``complete``.

        Make the call inside ``bound(op_id)`` so that it carries that request id."""
        request_id = request_ids.new()
        with self._lock:
            self._seq += 1
            op_id = f"{self._worker}-{self._seq}"
            self._request_ids[op_id] = request_id
        invocation = {"type": INVOKE, "id": op_id, "op": op.value, "request_id": request_id}
        self._write({**invocation, **fields})
        return op_id

    def bound(self, op_id: str) -> AbstractContextManager[str]:
        """The context in which the call of ``op_id`` is made (its request id bound)."""
        with self._lock:
            request_id = self._request_ids.pop(op_id)
        return request_ids.bound(request_id)

    def complete(
        self, op_id: str, end: End, outcome: Observed | None = None, **fields: Any
    ) -> None:
        """Record a completion (``outcome`` None: none was heard, as with ``End.INFO``)."""
        heard = {} if outcome is None else {"outcome": outcome.value}
        self._write({"type": end.value, "id": op_id, **heard, **fields})

    def _write(self, record: dict[str, Any]) -> None:
        # "time" is CLOCK_MONOTONIC: one clock for every process of the host, and one that
        # the clock-skew fault leaves alone (the checker compares it across workers).
        now = {"time": time.monotonic(), "wall": time.time()}
        line = json.dumps({**now, "worker": self._worker, **record})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


_FIELDS = (
    "task",
    "attempt",
    "attempt_id",
    "generation",
    "revision",
    "effect_key",
    "reason",
    "request_id",
)


def pair(lines: Iterable[dict[str, Any]]) -> list[Operation]:
    """Operations from raw lines: each invocation merged with its completion, if any."""
    invoked: dict[str, dict[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    for line in lines:
        (invoked if line.get("type") == INVOKE else done)[str(line["id"])] = line
    ops = []
    for op_id, inv in invoked.items():
        end = done.get(op_id)
        merged = {**inv, **(end or {})}
        definite = end is not None and End(end["type"]) is not End.INFO
        outcome = Observed(merged.get("outcome", INFO)) if definite else INFO
        fields = {k: merged[k] for k in _FIELDS if k in merged}
        ops.append(
            Operation(
                id=op_id,
                worker=str(inv["worker"]),
                op=OpKind(inv["op"]),
                start=float(inv["time"]),
                end=float(end["time"]) if end else None,
                end_wall=float(end["wall"]) if end and "wall" in end else None,
                outcome=outcome,
                **fields,
            )
        )
    return sorted(ops, key=lambda o: o.start)


def read_lines(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every parseable line of the given JSONL files (a torn last line is skipped)."""
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for raw in f:
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue


def load(paths: Iterable[Path]) -> list[Operation]:
    """The history recorded in the given files."""
    return pair(read_lines(paths))
