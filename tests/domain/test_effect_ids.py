"""coordinator.domain.effect_ids: one id per slot of a task incarnation's revision, pinned (the
downstream remembers it), and the V1 rule kept for tasks created before ids named the
incarnation."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.effect_ids import effect_id, effect_id_of, legacy_effect_id
from coordinator.domain.effects import check_effect_id
from coordinator.domain.records import EffectIdScheme, TaskRecord, decode, encode
from coordinator.domain.states import TaskState

TASK = TaskRecord(
    task_id="t1",
    queue="q",
    input_digest="sha256:" + "0" * 64,
    state=TaskState.CLAIMED,
    effect_ids=EffectIdScheme.V2,
    created_revision=7,
)


def _sha_of_parts(tag: bytes, *parts: str) -> str:
    h = hashlib.sha256(tag)
    for part in parts:
        h.update(len(part.encode()).to_bytes(4, "big") + part.encode())
    return "eff-" + h.hexdigest()


def test_both_rules_are_pinned_and_well_formed() -> None:
    """The id is the idempotency key downstream: it must never change across releases, for
    the tasks of either rule."""
    v2 = effect_id("t1", 7, 1, "notify", "email")
    assert v2 == _sha_of_parts(b"coordinator.effect.v2", "t1", "7", "1", "notify", "email")
    v1 = legacy_effect_id("t1", 1, "notify", "email")
    assert v1 == _sha_of_parts(b"coordinator.effect.v1", "t1", "1", "notify", "email")
    assert check_effect_id(v2) == v2 and check_effect_id(v1) == v1 and v1 != v2


def test_the_id_depends_on_the_incarnation_revision_node_and_slot() -> None:
    base = effect_id("t1", 7, 1, "notify", "email")
    assert effect_id("t1", 7, 1, "notify", "email") == base  # every attempt sends the same
    assert effect_id("t1", 9, 1, "notify", "email") != base  # the id created again: new effects
    assert effect_id("t1", 7, 2, "notify", "email") != base  # a new revision: a new effect
    assert effect_id("t1", 7, 1, "notify", "email-2") != base  # a new slot: a new effect
    assert effect_id("t1", 7, 1, "other", "email") != base
    assert effect_id("t2", 7, 1, "notify", "email") != base


def test_the_encoding_is_length_prefixed() -> None:
    assert effect_id("a", 7, 1, "bc", "d") != effect_id("ab", 7, 1, "c", "d")
    assert effect_id("t", 7, 1, "n", "s/x") != effect_id("t", 7, 1, "n/s", "x")
    assert effect_id("t", 7, 11, "n", "s") != effect_id("t", 71, 1, "n", "s")


Parts = tuple[str, int, int, str, str]
_PARTS = st.tuples(
    st.text(max_size=6),
    st.integers(1, 99),
    st.integers(1, 99),
    st.text(max_size=6),
    st.text(max_size=6),
)


@given(_PARTS, _PARTS)
def test_different_tuples_never_share_an_id(a: Parts, b: Parts) -> None:
    assert (effect_id(*a) == effect_id(*b)) == (a == b)


@given(_PARTS)
def test_no_v2_id_is_ever_a_v1_id(a: Parts) -> None:
    task_id, _, revision, node, slot = a
    assert effect_id(*a) != legacy_effect_id(task_id, revision, node, slot)


def test_a_task_uses_the_rule_it_was_created_with() -> None:
    assert effect_id_of(TASK, 1, "notify", "email") == effect_id("t1", 7, 1, "notify", "email")
    old = replace(TASK, effect_ids=EffectIdScheme.V1)
    assert effect_id_of(old, 1, "notify", "email") == legacy_effect_id("t1", 1, "notify", "email")


def test_a_record_written_before_the_scheme_existed_reads_v1() -> None:
    """Its effects were prepared with V1 ids: it keeps finding them."""
    stored = json.loads(encode(TASK))
    assert stored["effect_ids"] == "V2" and "created_revision" not in stored  # metadata
    del stored["effect_ids"]
    old = decode(TaskRecord, json.dumps(stored).encode(), created_revision=7)
    assert old.effect_ids is EffectIdScheme.V1
    assert effect_id_of(old, 1, "n", "s") == legacy_effect_id("t1", 1, "n", "s")


def test_a_v2_id_needs_the_incarnation() -> None:
    """A task read without its key's metadata would give every incarnation the same ids."""
    with pytest.raises(ValueError, match="created_revision unknown"):
        effect_id_of(replace(TASK, created_revision=0), 1, "notify", "email")
