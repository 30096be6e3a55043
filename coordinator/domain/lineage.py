"""Task identity: root, parent and a canonical thread key (pure, no I/O).

Every work item has exactly one identity, its ``task_id``. The lineage fields place it in a
responsibility tree: a root task is its own root; a child names both its root and its parent,
and the parent must belong to that same root. The thread key groups tasks of one conversation.

Thread keys are normalized so that a lineage suffix is never mistaken for a second identity
(the seed's ``canonicalThreadKey``): ``"CSV-Export#TASK-20260101-001"``, ``"csv-export#2"`` and
``"csv-export/retry-1"`` all name the thread ``csv-export``. The rule, applied in this order:

1. strip surrounding blanks and lowercase (thread keys are case-insensitive);
2. cut everything from the first ``#`` (a lineage bucket such as ``#2`` or ``#TASK-...``);
3. drop trailing ``/retry-N``, ``/round-N``, ``/rev-N``, ``/revision-N``, ``/attempt-N``
   segments (the dash is optional: ``/retry1``), repeatedly;
4. strip leading and trailing ``/``.

What remains must be 1-128 characters of ``[a-z0-9._:@/-]``, none of its ``/`` parts ``.`` or
``..``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.domain.validation import no_dot_segments
from coordinator.errors import FailedPrecondition, InvalidArgument, NotFound

MAX_THREAD_KEY_CHARS = 128
# The raw value may carry a long lineage suffix; it is bounded before normalization.
MAX_RAW_THREAD_KEY_CHARS = 512

_LINEAGE_SUFFIX = re.compile(r"(?:/(?:retry|round|rev|revision|attempt)-?\d+)+$")
_CANONICAL = re.compile(r"^[a-z0-9._:@/-]{1,128}$")


def canonical_thread_key(value: str) -> str:
    """``value`` normalized by the module's rule (may be empty or malformed: see thread_key)."""
    key = value.strip().lower().split("#", 1)[0]
    key = _LINEAGE_SUFFIX.sub("", key.rstrip("/"))
    return key.strip("/").strip()


def thread_key(value: str, field: str = "thread_key") -> str:
    """A caller's thread key, normalized; InvalidArgument naming ``field`` if nothing valid
    remains."""
    if len(value) > MAX_RAW_THREAD_KEY_CHARS:
        raise InvalidArgument(
            f"{field} is {len(value)} characters, the limit is {MAX_RAW_THREAD_KEY_CHARS}"
        )
    key = canonical_thread_key(value)
    if not key:
        raise InvalidArgument(
            f"{field} {value[:80]!r} has nothing left once normalized (lineage suffixes such as "
            "'#2' or '/retry-1' are removed)"
        )
    if not _CANONICAL.fullmatch(key):
        raise InvalidArgument(
            f"{field} must normalize to 1-{MAX_THREAD_KEY_CHARS} characters of [a-z0-9._:@/-], "
            f"got {key[:140]!r}"
        )
    return no_dot_segments(field, key)


def index_value(key: str) -> str:
    """A key-safe form of a canonical thread key (``/`` escaped), for the identity index."""
    return quote(key, safe="")


def identity_keys(keys: Keyspace, task: TaskRecord) -> list[str]:
    """The identity index keys of ``task`` for ListTasks' lineage filters: root, thread, and
    parent if it has one. The create txn writes exactly these, the prune deletes them and the
    doctor expects them, so the three can never disagree on a key. A record from before lineage
    (no root, no thread) is its own root and its own thread, as ``decide_lineage`` makes it."""
    found = [
        keys.by_identity("root", task.root_task_id or task.task_id, task.task_id),
        keys.by_identity(
            "thread", index_value(task.thread_key or _own_thread(task.task_id)), task.task_id
        ),
    ]
    if task.parent_task_id:
        found.append(keys.by_identity("parent", task.parent_task_id, task.task_id))
    return found


@dataclass(frozen=True)
class Lineage:
    """Where a new task sits in its responsibility tree."""

    root_task_id: str
    parent_task_id: str
    thread_key: str


def decide_lineage(
    task_id: str,
    *,
    root_task_id: str,
    parent_task_id: str,
    thread: str,
    root: TaskRecord | None,
    parent: TaskRecord | None,
) -> Lineage:
    """The lineage of a task being created, from what the caller named and the store read.

    ``thread`` is already canonical (or empty). ``root`` and ``parent`` are the records of the
    named tasks (None when absent or not named). A task naming neither is a root (its own root,
    thread = its id lowercased unless given). A child names both; its parent must exist and
    belong to the named root; its thread defaults to the parent's.
    """
    if not root_task_id and not parent_task_id:
        return Lineage(task_id, "", thread or _own_thread(task_id))
    if parent_task_id == task_id:
        raise InvalidArgument(f"parent_task_id names the task itself ({task_id!r})")
    if root_task_id == task_id:
        if parent_task_id:
            raise InvalidArgument(
                f"task {task_id!r} names itself as root_task_id, so it is a root and cannot "
                f"have parent_task_id {parent_task_id!r}"
            )
        return Lineage(task_id, "", thread or _own_thread(task_id))
    if not root_task_id or not parent_task_id:
        missing = "root_task_id" if not root_task_id else "parent_task_id"
        raise InvalidArgument(
            f"a child task names both root_task_id and parent_task_id; {missing} is missing"
        )
    if root is None:
        raise NotFound(f"root_task_id {root_task_id!r} does not exist")
    if parent is None:
        raise NotFound(f"parent_task_id {parent_task_id!r} does not exist")
    if root.root_task_id != root.task_id:
        raise FailedPrecondition(
            f"root_task_id {root_task_id!r} is not a root: it belongs to root {root.root_task_id!r}"
        )
    if parent.root_task_id != root_task_id:
        raise FailedPrecondition(
            f"parent {parent_task_id!r} belongs to root {parent.root_task_id!r}, not to "
            f"{root_task_id!r}"
        )
    return Lineage(root_task_id, parent_task_id, thread or parent.thread_key)


def _own_thread(task_id: str) -> str:
    # Task ids are [A-Za-z0-9._:-], so lowercasing one always yields a valid thread key; the
    # suffix rule is not applied: a root's own id is its identity, not a lineage bucket.
    return task_id.lower()
