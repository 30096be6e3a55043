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
from pathlib import Path
from typing import Any, TextIO

from coordinator import request_ids

INFO = "info"
"""The outcome of an operation whose effect is unknown."""


@dataclass(frozen=True)
class Op:
    """One operation of one worker, from invocation to completion (``end`` None: never ended)."""

    id: str
    worker: str
    op: str  # claim | effect | commit
    task: str
    start: float
    end: float | None
    outcome: str  # COMMITTED, FENCED, CLAIMED, EXECUTED, ... or INFO
    reason: str = ""
    attempt: int = 0
    attempt_id: str = ""
    generation: int = 0
    revision: int = 0
    effect_key: str = ""
    request_id: str = ""  # the x-request-id the call carried (coordinator.request_ids)
    applied_at: int = 0  # the etcd revision of the write it made, once matched in etcd's history

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
class Write:
    """One transition as etcd's own history holds it (an event key's put, read by a watch
    from the first revision): the truth against which indefinite operations are settled."""

    task: str
    revision: int  # the etcd revision of the transition txn
    op: str  # the transition's Op value: create, claim, commit, reclaim, update_input, ...
    to_state: str
    request_id: str = ""
    attempt_id: str = ""
    generation: int = 0  # a claim's generation is its own revision
    at: float = 0.0  # the writing replica's wall clock (EventRecord.at)


@dataclass(frozen=True)
class EffectWrite:
    """One put of an effect key as etcd's own history holds it (read by a watch on
    ``{p}/effects/`` from the first revision): a prepare, record, resolve or approval."""

    effect_id: str
    task: str
    revision: int  # the etcd revision of the txn that wrote it
    state: str  # the EffectState name it left: PREPARED, COMMITTED, UNKNOWN, ABSENT
    request_id: str = ""  # EffectRecord.request_id: the call that wrote it ("" background)


class Recorder:
    """Appends invocation/completion lines to a JSONL file, flushed line by line."""

    def __init__(self, path: Path, worker: str) -> None:
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._worker = worker
        self._lock = threading.Lock()
        self._seq = 0
        self._request_ids: dict[str, str] = {}

    def invoke(self, op: str, **fields: Any) -> str:
        """Record an invocation with a fresh request id; returns its id for ``complete``.

        Make the call inside ``bound(op_id)`` so that it carries that request id."""
        request_id = request_ids.new()
        with self._lock:
            self._seq += 1
            op_id = f"{self._worker}-{self._seq}"
            self._request_ids[op_id] = request_id
        self._write({"type": "invoke", "id": op_id, "op": op, "request_id": request_id, **fields})
        return op_id

    def bound(self, op_id: str) -> AbstractContextManager[str]:
        """The context in which the call of ``op_id`` is made (its request id bound)."""
        with self._lock:
            request_id = self._request_ids.pop(op_id)
        return request_ids.bound(request_id)

    def complete(self, op_id: str, kind: str, **fields: Any) -> None:
        """Record a completion: ``kind`` is ok, fail or info."""
        self._write({"type": kind, "id": op_id, **fields})

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


def pair(lines: Iterable[dict[str, Any]]) -> list[Op]:
    """Operations from raw lines: each invocation merged with its completion, if any."""
    invoked: dict[str, dict[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    for line in lines:
        (invoked if line.get("type") == "invoke" else done)[str(line["id"])] = line
    ops = []
    for op_id, inv in invoked.items():
        end = done.get(op_id)
        merged = {**inv, **(end or {})}
        outcome = str(merged.get("outcome", INFO)) if end and end["type"] != INFO else INFO
        fields = {k: merged[k] for k in _FIELDS if k in merged}
        ops.append(
            Op(
                id=op_id,
                worker=str(inv["worker"]),
                op=str(inv["op"]),
                start=float(inv["time"]),
                end=float(end["time"]) if end else None,
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


def load(paths: Iterable[Path]) -> list[Op]:
    """The history recorded in the given files."""
    return pair(read_lines(paths))
