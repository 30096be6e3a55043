"""Retention of finished tasks (pure, no I/O): how long a terminal task stays in etcd, when it
is due for pruning, and the compact tombstone it leaves behind.

A task becomes due ``retention`` after it became terminal (DONE, CANCELLED, FAILED), with the
retention of its queue at that moment: the due time is written, as the key of the prune index,
in the txn that makes the task terminal (store/retention_index.py). A later change of the setting
applies to tasks that finish after it, as in Temporal, whose namespace retention is fixed when a
workflow closes: the index then stays ordered by due time, so a pass reads exactly the due
tasks. Retention 0 keeps a queue's tasks forever (and fills etcd).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TERMINAL_STATES, TaskState
from coordinator.errors import ConfigError

DEFAULT_RETENTION = 7 * 24 * 3600.0
DEFAULT_TOMBSTONE_RETENTION = 24 * 3600.0
"""A day, like the default idempotency window: a pruned id is refused (a late retry of its
create cannot make a second task) for that long; after it, the id is free again."""

DEFAULT_ENDED_ATTEMPT_RETENTION = 7 * 24 * 3600.0
"""How long the staged result and finished job records of an attempt that ended while its task
stays live (released, expired, failed and retried, sent to review) are kept."""

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhdw]?)\s*$")


def parse_setting_duration(setting: str, value: object) -> float:
    """Seconds from ``90``, ``"90"``, ``"90s"``, ``"15m"``, ``"1h"``, ``"7d"`` or ``"2w"``;
    ConfigError naming ``setting`` for anything else (negative numbers included)."""
    if isinstance(value, bool):
        raise ConfigError(f"{setting} must be a duration such as 3600, '1h' or '7d', got {value}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ConfigError(
                f"{setting} must be a duration such as 3600, '1h' or '7d', got {value!r}"
            )
        seconds = float(match["number"]) * _UNITS[match["unit"] or "s"]
    if seconds < 0 or not math.isfinite(seconds):
        raise ConfigError(f"{setting} must be >= 0 seconds, got {value!r}")
    return seconds


def parse_per_queue(setting: str, value: object) -> dict[str, float]:
    """Per-queue durations from a TOML table (``{"q" = "1h"}``) or ``"q=1h,r=0"`` (flag, env)."""
    pairs: list[tuple[str, object]]
    if isinstance(value, Mapping):
        pairs = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        pairs = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            name, sep, text = part.partition("=")
            if not sep:
                raise ConfigError(f"{setting} must be QUEUE=DURATION[,...], got {part!r}")
            pairs.append((name.strip(), text.strip()))
    else:
        raise ConfigError(f"{setting} must be a table of queue = duration, got {value!r}")
    out: dict[str, float] = {}
    for queue, duration in pairs:
        if not queue or "/" in queue:
            raise ConfigError(f"{setting}: {queue!r} is not a queue name")
        out[queue] = parse_setting_duration(f"{setting}.{queue}", duration)
    return out


@dataclass(frozen=True)
class RetentionPolicy:
    """How long terminal tasks are kept, per queue (seconds; 0: forever)."""

    default: float = DEFAULT_RETENTION
    per_queue: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    tombstone: float = DEFAULT_TOMBSTONE_RETENTION
    """How long a pruned task's tombstone (and with it the refusal of its id) is kept."""
    ended_attempt: float = DEFAULT_ENDED_ATTEMPT_RETENTION
    """How long an ended attempt's staged result and finished job records stay while its task
    is live (0: until the task itself is pruned)."""

    def sweep_at(self, before: TaskRecord | None, after: TaskRecord) -> float | None:
        """When the records of the attempt that the move ``before`` -> ``after`` ends are due
        for their sweep; None if the move ends no attempt, ends the task (its prune takes
        them), or they are kept with the task (lifetime 0)."""
        if before is None or before.state is not TaskState.CLAIMED or not before.attempt_id:
            return None
        if after.state in TERMINAL_STATES or self.ended_attempt <= 0:
            return None
        if after.state is TaskState.CLAIMED and after.attempt_id == before.attempt_id:
            return None  # a renewal or edit of the same attempt
        return after.updated_at + self.ended_attempt

    def for_queue(self, queue: str) -> float:
        """The retention of ``queue`` (0: keep forever)."""
        return self.per_queue.get(queue, self.default)

    def due_at(self, task: TaskRecord) -> float | None:
        """When a task that just became terminal is due for pruning (None: never)."""
        retention = self.for_queue(task.queue)
        if retention <= 0:
            return None
        return task.updated_at + retention


def micros(seconds: float) -> int:
    """Seconds as whole microseconds (the time part of the index keys)."""
    return int(seconds * 1_000_000)


@dataclass(frozen=True)
class Tombstone:
    """What stays of a pruned task under {p}/tombstones/{task_id}: enough to answer GetTask,
    refuse the id to CreateTask, and settle a dependency on it."""

    task_id: str
    queue: str
    state: TaskState
    revision: int
    root_task_id: str
    parent_task_id: str
    finished_at: float
    pruned_at: float
    archive: str
    """Where the task's history was written (a file or object URL)."""

    @classmethod
    def of(cls, task: TaskRecord, *, pruned_at: float, archive: str) -> Tombstone:
        """The tombstone of ``task``, pruned now after archiving to ``archive``."""
        return cls(
            task_id=task.task_id,
            queue=task.queue,
            state=task.state,
            revision=task.revision,
            root_task_id=task.root_task_id,
            parent_task_id=task.parent_task_id,
            finished_at=task.updated_at,
            pruned_at=pruned_at,
            archive=archive,
        )

    def as_task(self) -> TaskRecord:
        """A stand-in record for dependency and lineage checks: the final state and revision;
        state_version 0, so a txn that compares it holds only while the task key is absent."""
        return TaskRecord(
            task_id=self.task_id,
            queue=self.queue,
            input_digest="",
            state=self.state,
            revision=self.revision,
            root_task_id=self.root_task_id,
            parent_task_id=self.parent_task_id,
            updated_at=self.finished_at,
        )

    def describe(self) -> str:
        """Why the task is gone and where its history is (the NOT_FOUND message)."""
        return (
            f"task {self.task_id!r} finished {self.state.name} and was archived and removed "
            f"from etcd after its retention; its history is in {self.archive} (read it with "
            f"`coordinator archive show {self.task_id} --archive ...`)"
        )
