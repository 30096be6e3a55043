"""The report's headline: the issues' top-level keys, read off the phases' figures, each null
one with its reason (``doc["reasons"]``) and each measured off its nominal size with a note
(``doc["notes"]``)."""

from __future__ import annotations

from typing import Any

from bench.report import HEADLINE


def headline(doc: dict[str, Any]) -> None:
    """The issue's top-level keys; a null one gets its reason in ``doc["reasons"]``."""
    reasons: dict[str, str] = {}
    notes: dict[str, str] = {}
    skipped_phases = doc.get("skipped_phases", {})
    _ratio_headlines(doc, reasons)
    _multislot_headline(doc, reasons)
    reclaim = doc.get("reclaim")
    doc["reclaim_p95_s_over_ttl"] = reclaim["ready_s_after_ttl"]["p95"] if reclaim else None
    scale = doc.get("scale")
    doc["claimnext_100k_over_1k"] = scale["claim_next_ratio_large_over_small"] if scale else None
    if scale and (min(scale["sizes"]), max(scale["sizes"])) != (1_000, 100_000):
        notes["claimnext_100k_over_1k"] = (
            f"measured at {min(scale['sizes'])} vs {max(scale['sizes'])} ready tasks"
        )
    promote = doc.get("promote")
    doc["promote_claimable_p95_s_after_due"] = (
        promote["claimable_s_after_due"]["p95"] if promote else None
    )
    held = doc.get("held") or {}
    for key, field in (
        ("coordinator_rss_mib_10k_claims", "coordinator_rss_mib_held"),
        ("held_renewals_on_time_ratio", "renewals_on_time_ratio"),
        ("held_coordinator_cpu_cores", "coordinator_cpu_cores"),
        ("held_etcd_ms_per_renewal_over_anchor", "etcd_ms_per_renewal_over_anchor"),
    ):
        doc[key] = held.get(field)
        if held and held["claims_held"] != 10_000:
            notes[key] = f"measured with {held['claims_held']} claims"
    if held.get("lost"):
        notes["held_renewals_on_time_ratio"] = f"{held['lost']} claims lost"
    for key, phase in (
        ("reclaim_p95_s_over_ttl", "reclaim"),
        ("promote_claimable_p95_s_after_due", "promote"),
        ("claimnext_100k_over_1k", "scale"),
        ("coordinator_rss_mib_10k_claims", "held"),
        ("held_renewals_on_time_ratio", "held"),
        ("held_coordinator_cpu_cores", "held"),
        ("held_etcd_ms_per_renewal_over_anchor", "held"),
    ):
        if doc[key] is None:
            ran = phase in doc and doc[phase]
            reasons[key] = skipped_phases.get(
                phase,
                _unmeasured(key, held) if ran else f"the {phase} phase was not run (--only)",
            )
    retention = doc.get("retention") or {}
    doc["etcd_db_mib_at_200k_over_50k"] = retention.get("etcd_db_mib_last_over_first")
    doc["throughput_pruner_on_over_off"] = retention.get("pruner_on_over_off")
    if retention and retention["retention_tasks"] != 200_000:
        marks = list(retention["etcd_db_mib_at"])
        notes["etcd_db_mib_at_200k_over_50k"] = (
            f"measured at {marks[-1]} over {marks[0]} tasks (--retention-200k for the full size)"
        )
    for key in ("etcd_db_mib_at_200k_over_50k", "throughput_pruner_on_over_off"):
        if doc[key] is None:
            reasons[key] = skipped_phases.get(
                "retention", "the retention phase was not run (--only)"
            )
    _hostile_headlines(doc, reasons, notes)
    doc["reasons"] = reasons
    doc["notes"] = notes
    assert all(k in doc for k in HEADLINE)


def _ratio_headlines(doc: dict[str, Any], reasons: dict[str, str]) -> None:
    """The a/b, a/c, a/d throughput ratios at 32 workers, each null one with its reason."""
    ratios = doc.get("ratios", {})
    skipped = doc.get("skipped", {})
    for other in ("b", "c", "d"):
        key = f"ratio_a_{other}_32"
        value = ratios.get(f"a/{other}", {}).get("32")
        doc[key] = value
        if value is None:
            reasons[key] = _no_ratio_reason(doc, other, skipped)
    doc["ratio_a_b_32_batched"] = ratios.get("e/b", {}).get("32")
    if doc["ratio_a_b_32_batched"] is None:
        reasons["ratio_a_b_32_batched"] = _no_ratio_reason(doc, "b", skipped)


def _no_ratio_reason(doc: dict[str, Any], other: str, skipped: dict[str, str]) -> str:
    if "throughput" not in doc["config"]["phases"]:
        return "the throughput phase was not run (--only)"
    if "throughput" in doc.get("skipped_phases", {}):
        return f"the throughput phase was {doc['skipped_phases']['throughput']}"
    if other in skipped:
        return f"scenario {other} skipped: {skipped[other]}"
    if 32 not in doc["config"]["levels"]:
        return "32 workers is not among --levels"
    return "no complete round at 32 workers (time budget, or errors)"


def _multislot_headline(doc: dict[str, Any], reasons: dict[str, str]) -> None:
    """The multi-slot workers over the raw floor at the same concurrency, or why not."""
    multislot = doc.get("multislot")
    doc["ratio_multislot_b_32"] = multislot["ratio_m_b"] if multislot else None
    if doc["ratio_multislot_b_32"] is not None:
        return
    if multislot:
        reasons["ratio_multislot_b_32"] = (
            "no round measured both m and b (see the errors in multislot.rows)"
        )
    else:
        reasons["ratio_multislot_b_32"] = doc.get("skipped_phases", {}).get(
            "multislot", "the multislot phase was not run (--only)"
        )


def _hostile_headlines(doc: dict[str, Any], reasons: dict[str, str], notes: dict[str, str]) -> None:
    """Issue 25's table (the hostile phase): a target whose other half is a count (the pool
    refused, claims lost, memory kept) gets that count as a note when it is not zero; a row
    left out (``--only``, ``--hostile-rows``) leaves its figure null, saying so."""
    hostile = doc.get("hostile") or {}
    rows = {
        "hostile_db_peak_over_quota": "writes",
        "hostile_renew_p99_over_ttl_third": "renewals",
        "hostile_replay_rss_growth_mib": "replays",
        "hostile_list_pages_answered_ratio": "lists",
    }
    for key, row in rows.items():
        if row not in hostile:
            doc[key] = None
            reasons[key] = doc.get("skipped_phases", {}).get(
                "hostile",
                f"the hostile phase's {row} row was not run (--hostile-rows)"
                if hostile
                else "the hostile phase was not run (--only)",
            )
    if "writes" in hostile:
        _writes_headline(doc, hostile["writes"], notes)
    if "renewals" in hostile:
        _renewals_headline(doc, hostile["renewals"], reasons, notes)
    if "replays" in hostile:
        replays = hostile["replays"]
        doc["hostile_replay_rss_growth_mib"] = float(replays["rss_growth_mib_peak"])
        notes["hostile_replay_rss_growth_mib"] = (
            f"{replays['rss_growth_mib_after']} MiB still held once they ended"
        )
    if "lists" in hostile:
        lists = hostile["lists"]
        listed = [lists[way]["tasks_listed"] for way in ("queue", "queue_with_inputs", "state")]
        doc["hostile_list_pages_answered_ratio"] = round(min(listed) / lists["tasks"], 3)


def _writes_headline(doc: dict[str, Any], writes: dict[str, Any], notes: dict[str, str]) -> None:
    doc["hostile_db_peak_over_quota"] = writes["db_peak_over_quota"]
    if writes["legit_refusals"] or writes["nospace_alarms"]:
        notes["hostile_db_peak_over_quota"] = (
            f"the pool was refused {writes['legit_refusals']}, "
            f"{writes['nospace_alarms']} NOSPACE readings"
        )


def _renewals_headline(
    doc: dict[str, Any], renewals: dict[str, Any], reasons: dict[str, str], notes: dict[str, str]
) -> None:
    doc["hostile_renew_p99_over_ttl_third"] = renewals["renew_p99_over_ttl_third"]
    if renewals["lost"]:
        notes["hostile_renew_p99_over_ttl_third"] = f"{renewals['lost']} claims lost"
    if doc["hostile_renew_p99_over_ttl_third"] is None:
        reasons["hostile_renew_p99_over_ttl_third"] = "no renewal during the flood"


def _unmeasured(key: str, held: dict[str, Any]) -> str:
    """Why a phase that ran left ``key`` null (only the held phase's figures can be)."""
    if key == "held_etcd_ms_per_renewal_over_anchor" and held.get("etcd_ratio_unmeasured"):
        return str(held["etcd_ratio_unmeasured"])
    return "no renewal in the held window"
