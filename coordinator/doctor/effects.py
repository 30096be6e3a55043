"""Effect records against their two derived indexes: the open-effects index (a key exactly
while the effect is PREPARED or UNKNOWN) and the reconcile index (a key, holding a copy of the
reconciliation, exactly while the effect's reconciliation is open). The effect record is the
primary evidence; an index that disagrees has one unambiguous repair."""

from __future__ import annotations

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed, decode_or_report
from coordinator.domain.effects import EffectRecord
from coordinator.domain.keys import Keyspace
from coordinator.domain.reconcile import Reconciliation
from coordinator.domain.records import encode
from coordinator.store.etcd.ops import KV


def check_effects(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Every effect whose indexes disagree with it, and every index key without its effect."""
    out: list[Finding] = []
    effects: dict[str, tuple[KV, EffectRecord]] = {}
    for effect_id, kv in sorted(parsed.effects.items()):
        effect = decode_or_report(parsed, EffectRecord, kv, effect_id)
        if effect is not None:
            effects[effect_id] = (kv, effect)
    for kv, effect in effects.values():
        pair = (effect.task_id, effect.effect_id)
        if effect.uncertain and pair not in parsed.open_effects:
            index = keys.open_effect(*pair)
            out.append(
                _missing(Problem.OPEN_EFFECT_INDEX_MISSING, kv, effect, index, b"", "open-effects")
            )
        if effect.reconcile_open and pair not in parsed.reconcile:
            index = keys.reconcile(*pair)
            value = encode(Reconciliation.of(effect))
            out.append(
                _missing(Problem.RECONCILE_INDEX_MISSING, kv, effect, index, value, "reconcile")
            )
    for (task_id, effect_id), index_kv in sorted(parsed.open_effects.items()):
        found = effects.get(effect_id)
        if found is None or not found[1].uncertain:
            out.append(
                _orphan(Problem.OPEN_EFFECT_INDEX_ORPHAN, keys, task_id, effect_id, index_kv, found)
            )
    for (task_id, effect_id), index_kv in sorted(parsed.reconcile.items()):
        found = effects.get(effect_id)
        if found is None or not found[1].reconcile_open:
            out.append(
                _orphan(Problem.RECONCILE_INDEX_ORPHAN, keys, task_id, effect_id, index_kv, found)
            )
    return out


def _missing(
    problem: Problem, kv: KV, effect: EffectRecord, index: str, value: bytes, name: str
) -> Finding:
    return Finding(
        problem,
        effect.task_id,
        f"effect {effect.effect_id} of task {effect.task_id} is {effect.state.name} "
        f"(reconciliation {'open' if effect.reconcile_open else 'closed'}) but has no {name} "
        f"index key {index}",
        (kv.key, index),
        Repair(
            f"add {name} index key {index}",
            (Guard(kv.key, kv.mod_revision), Guard(index, 0)),
            (RepairWrite(index, value),),
        ),
    )


def _orphan(
    problem: Problem,
    keys: Keyspace,
    task_id: str,
    effect_id: str,
    index_kv: KV,
    found: tuple[KV, EffectRecord] | None,
) -> Finding:
    why = "does not exist" if found is None else f"is {found[1].state.name}, not open"
    effect_guard = Guard(keys.effect(effect_id), found[0].mod_revision if found else 0)
    return Finding(
        problem,
        task_id,
        f"index key {index_kv.key} names effect {effect_id}, which {why}",
        (index_kv.key,),
        Repair(
            f"delete index key {index_kv.key}",
            (effect_guard, Guard(index_kv.key, index_kv.mod_revision)),
            (RepairWrite(index_kv.key, None),),
        ),
    )
