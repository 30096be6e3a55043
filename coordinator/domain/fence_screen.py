"""Whether a fence may name a live claim, from what a replica's claimed index has seen.

A renewal of a fence that names no claim must not cost etcd work: 50 callers sending RenewMany
with 1,000 made-up fences each read three keys per fence and took every legitimate claim past
its TTL (issue 25). Every claim txn writes the task's claimed-index key at the claim's own
revision (its generation), and every replica follows that index through a watch
(store/indexes/claimed.py), so once the index has applied every revision up to a fence's
generation, it knows whether a claim of that generation can still be live:

* the task's key was last written before the generation (or is absent): no claim was made at
  that generation, or it ended, so the fence is refused from memory;
* the key was written at or after it, or the task's claim ended recently at or after it: the
  claim may be live, or its end deserves the exact reason (a commit racing its own renewal must
  read ALREADY_COMMITTED): a read decides, as before;
* the index has not yet seen the generation: the claim may have been made on another replica a
  moment ago, so a read decides (the store first asks etcd for its revision once per batch: a
  generation beyond it is no claim at all).

Pure: the store hands in the index's numbers.
"""

from __future__ import annotations

from enum import Enum


class Screen(Enum):
    """What the claimed index says about a fence's claim."""

    NO_CLAIM = "no_claim"  # no live claim of that generation: refuse without reading
    READ = "read"  # may be live, or just ended: a read decides
    UNSEEN = "unseen"  # the index has not seen the generation yet


def screen(generation: int, *, seen_through: int, written: int | None, ended: int | None) -> Screen:
    """The screen of a fence of ``generation``, given the index's last applied revision
    (``seen_through``), the revision the task's key was last written at (None: absent) and, if
    the task's claim ended recently, the revision its key was last written at before that."""
    if generation > seen_through:
        return Screen.UNSEEN
    if written is not None and written >= generation:
        return Screen.READ
    if ended is not None and ended >= generation:
        return Screen.READ
    return Screen.NO_CLAIM


def no_claim_message(task_id: str, generation: int) -> str:
    """The refusal of a fence the index screened out."""
    return (
        f"no live claim of task {task_id!r} at generation {generation}: the claim ended, or "
        "was never granted; claim the task again"
    )
