"""Effect ids: the idempotency key a side effect carries downstream, one per slot of a task
incarnation's revision.

``effect_id = H(task_id, created_revision, revision, node_id, effect_slot)``. No attempt and no
payload, so every attempt and takeover of a revision sends the same key and a downstream that
dedupes on it performs the effect once. The task revision is in it because a new revision is new
business input: its effects are new effects. ``created_revision`` (the etcd revision that
created the task key) is in it because a task id can be used again once the tombstone of a
pruned task expired (domain/retention.py): the new task is another incarnation, and its effects
must never share a key with the archived one's, or a downstream that dedupes by key would skip
them while the coordinator records them COMMITTED.

Tasks created before ids named the incarnation keep the old rule, ``H(task_id, revision,
node_id, effect_slot)`` (``EffectIdScheme.V1``, what a task record without the field reads):
their effects prepared then keep resolving to their stored ids, and a retry of such a slot sends
the key it sent before. Every task created since is V2. Both are pinned by tests: an id may
never change for the same slot, since it is what the downstream remembers.
"""

from __future__ import annotations

import hashlib

from coordinator.domain.records import EffectIdScheme, TaskRecord

_V1_TAG = b"coordinator.effect.v1"
_V2_TAG = b"coordinator.effect.v2"


def effect_id(
    task_id: str, created_revision: int, revision: int, node_id: str, effect_slot: str
) -> str:
    """The id of slot ``(node_id, effect_slot)`` of revision ``revision`` of the task
    incarnation created at etcd revision ``created_revision`` (EffectIdScheme.V2)."""
    if created_revision <= 0:
        # A record decoded without its key's metadata: an id made from it would be the same for
        # every incarnation, the very collision this rule exists to prevent.
        raise ValueError(f"task {task_id!r}: created_revision unknown ({created_revision})")
    return _digest(_V2_TAG, task_id, str(created_revision), str(revision), node_id, effect_slot)


def legacy_effect_id(task_id: str, revision: int, node_id: str, effect_slot: str) -> str:
    """The V1 id of a slot of a task created before ids named the incarnation."""
    return _digest(_V1_TAG, task_id, str(revision), node_id, effect_slot)


def effect_id_of(task: TaskRecord, revision: int, node_id: str, effect_slot: str) -> str:
    """The id of a slot of ``task``'s ``revision``, by the scheme the task was created with."""
    if task.effect_ids is EffectIdScheme.V1:
        return legacy_effect_id(task.task_id, revision, node_id, effect_slot)
    return effect_id(task.task_id, task.created_revision, revision, node_id, effect_slot)


def _digest(tag: bytes, *parts: str) -> str:
    """``eff-`` + sha256 over the length-prefixed parts: two different tuples never share an
    encoding (("a", "bc") and ("ab", "c") differ)."""
    h = hashlib.sha256(tag)
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)
    return "eff-" + h.hexdigest()


__all__ = ["effect_id", "effect_id_of", "legacy_effect_id"]
