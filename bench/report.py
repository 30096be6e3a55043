"""The report: the JSON document (``--json FILE``) and the markdown tables on stdout.

The JSON's top level always has the headline keys (``HEADLINE``); a key whose figure could not
be measured is null and ``reasons[key]`` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.hostile import hostile_line
from bench.long_polls import long_polls_line
from bench.machine import busier_than

HEADLINE = (
    "ratio_a_b_32",
    "ratio_a_c_32",
    "ratio_a_d_32",
    "reclaim_p95_s_over_ttl",
    "promote_claimable_p95_s_after_due",
    "claimnext_100k_over_1k",
    "coordinator_rss_mib_10k_claims",
    "etcd_db_mib_at_200k_over_50k",
    "throughput_pruner_on_over_off",
    "held_renewals_on_time_ratio",
    "held_coordinator_cpu_cores",
    "held_etcd_ms_per_renewal_over_anchor",
    "ratio_a_b_32_batched",
    "ratio_multislot_b_32",
    "hostile_db_peak_over_quota",
    "hostile_renew_p99_over_ttl_third",
    "hostile_replay_rss_growth_mib",
    "hostile_list_pages_answered_ratio",
)
"""The keys the issues require at the top level of the JSON."""

# (key, what, target, passes) for item 4 of the issue.
TARGETS: tuple[tuple[str, str, str, Callable[[float], bool]], ...] = (
    ("ratio_a_b_32", "a/b at 32 workers (coordinator vs raw floor)", ">= 1.0", lambda v: v >= 1.0),
    ("ratio_a_c_32", "a/c at 32 workers (vs etcd3 Lock recipe)", ">= 0.8", lambda v: v >= 0.8),
    ("ratio_a_d_32", "a/d at 32 workers (vs tooz)", ">= 4", lambda v: v >= 4.0),
    (
        "reclaim_p95_s_over_ttl",
        "reclaim: READY again after TTL, p95 (s)",
        "<= 0.6",
        lambda v: v <= 0.6,
    ),
    (
        "promote_claimable_p95_s_after_due",
        "delayed task claimed after its not_before, p95 (s)",
        "<= 1.0",
        lambda v: v <= 1.0,
    ),
    ("claimnext_100k_over_1k", "ClaimNext p50 at 100k / at 1k ready", "<= 1.2", lambda v: v <= 1.2),
    (
        "coordinator_rss_mib_10k_claims",
        "coordinator RSS with 10k held claims (MiB)",
        "< 200",
        lambda v: v < 200,
    ),
    (
        "etcd_db_mib_at_200k_over_50k",
        "etcd db after compaction + defrag, all tasks / a quarter, steady state (retention)",
        "<= 1.1",
        lambda v: v <= 1.1,
    ),
    (
        "throughput_pruner_on_over_off",
        "cycles/s with the pruner on / off (retention phase)",
        ">= 0.9",
        lambda v: v >= 0.9,
    ),
    (
        "held_renewals_on_time_ratio",
        "10k held claims, TTL 30 s: renewals done / wanted (held phase)",
        ">= 0.99, 0 lost",
        lambda v: v >= 0.99,
    ),
    (
        "held_coordinator_cpu_cores",
        "coordinator CPU keeping 10k claims alive (cores)",
        "<= 0.25",
        lambda v: v <= 0.25,
    ),
    (
        "held_etcd_ms_per_renewal_over_anchor",
        "etcd CPU per renewal / per bare lease keepalive",
        "<= 1.0",
        lambda v: v <= 1.0,
    ),
    (
        "ratio_a_b_32_batched",
        "a/b at 32 workers, batched worker loop (claim_many + commit_and_next)",
        ">= 1.0",
        lambda v: v >= 1.0,
    ),
    (
        "ratio_multislot_b_32",
        "multi-slot workers (4 processes x 8 slots) / raw floor, 32 at once",
        ">= 1.0",
        lambda v: v >= 1.0,
    ),
    (
        "hostile_db_peak_over_quota",
        "one worker token churning writes: etcd db peak / its 256 MiB quota (hostile)",
        "< 0.8, pool never refused",
        lambda v: v < 0.8,
    ),
    (
        "hostile_renew_p99_over_ttl_third",
        "50 x RenewMany of 1,000 made-up fences: legit renew p99 / (TTL/3) (hostile)",
        "< 1, 0 lost",
        lambda v: v < 1.0,
    ),
    (
        "hostile_replay_rss_growth_mib",
        "32 whole-log replays from 4 tokens: coordinator RSS growth at peak (MiB)",
        "< 64",
        lambda v: v < 64,
    ),
    (
        "hostile_list_pages_answered_ratio",
        "ListTasks of 256 KiB-input tasks: tasks listed / in the queue, every way (hostile)",
        ">= 1.0",
        lambda v: v >= 1.0,
    ),
)

SCENARIO_NAMES = {
    "a": "a coordinator",
    "b": "b raw floor",
    "c": "c etcd3 Lock",
    "d": "d tooz",
    "e": "e coordinator, batched",
    "m": "m multi-slot workers",
}


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Where each target of the issue stands in this run."""
    rows = []
    for key, what, target, passes in TARGETS:
        value = doc.get(key)
        rows.append(
            {
                "key": key,
                "what": what,
                "target": target,
                "value": value,
                "met": passes(value) if isinstance(value, (int, float)) else None,
            }
        )
    return rows


def markdown(doc: dict[str, Any]) -> str:
    """Every table of the report, as markdown."""
    parts = [_throughput_table(doc), _ratio_table(doc), *_phase_parts(doc)]
    parts.append(_targets_table(doc))
    if doc.get("load_average"):
        parts.append(_load_table(doc))
    skipped = doc.get("skipped") or {}
    reasons = doc.get("reasons") or {}
    notes = [f"- scenario {k} skipped: {v}" for k, v in skipped.items()]
    notes += [f"- phase {k} {_skip_text(v)}" for k, v in doc.get("skipped_phases", {}).items()]
    busy = _busy_phases(doc)
    if busy:
        notes.append(
            f"- a busy machine: the 1-minute load was above its {doc['machine']['cpus']} cores "
            f"around {', '.join(busy)}; other work competed for the CPU there, so those "
            "figures are noisier (only ratios of runs taken side by side compare)"
        )
    for row in doc.get("throughput", []):
        false_empty = row.get("counters", {}).get("false_no_ready_task", 0)
        if false_empty:
            notes.append(
                f"- a at {row['workers']} workers: ClaimNext answered NO_READY_TASK "
                f"{false_empty} times while ready tasks remained (the worker asked again)"
            )
    notes += [f"- `{k}` is null: {v}" for k, v in reasons.items()]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts) + "\n"


def _skip_text(reason: str) -> str:
    return reason if reason.startswith("cut off") else f"skipped: {reason}"


def _busy_phases(doc: dict[str, Any]) -> list[str]:
    cores = doc.get("machine", {}).get("cpus")
    return [
        phase
        for phase, load in doc.get("load_average", {}).items()
        if busier_than(cores, load["before"], load["after"])
    ]


def _load_table(doc: dict[str, Any]) -> str:
    lines = [
        f"Load average around each phase (1 / 5 / 15 min; {doc['machine'].get('cpus')} cores):",
        "",
        "| phase | before | after |",
        "| --- | --- | --- |",
    ]
    for phase, load in doc["load_average"].items():
        before, after = (" / ".join(f"{v:.2f}" for v in load[k]) for k in ("before", "after"))
        lines.append(f"| {phase} | {before} | {after} |")
    return "\n".join(lines)


def _phase_parts(doc: dict[str, Any]) -> list[str]:
    """The section of each phase that ran, in the phases' order."""
    sections: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
        ("multislot", _multislot_table),
        ("reclaim", _reclaim_table),
        ("promote", _promote_line),
        ("scale", _scale_table),
        ("held", _held_table),
        ("long_polls", long_polls_line),
        ("hostile", hostile_line),
    )
    return [render(doc[phase]) for phase, render in sections if doc.get(phase)]


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _trio(spread: dict[str, Any]) -> str:
    return " / ".join(_fmt(spread.get(q)) for q in ("p50", "p95", "p99"))


def _throughput_table(doc: dict[str, Any]) -> str:
    return _rows_table(doc.get("throughput", []))


def _multislot_table(multislot: dict[str, Any]) -> str:
    return (
        f"Multi-slot workers: {multislot['processes']} `coordinator worker --slots "
        f"{multislot['slots']}` processes against the raw floor's "
        f"{multislot['processes'] * multislot['slots']} workers, side by side (m's client CPU "
        f"is its worker processes'; m has no per-call latency): m/b "
        f"{_fmt(multislot['ratio_m_b'], 3)}.\n\n" + _rows_table(multislot["rows"])
    )


def _rows_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | workers | cycles/s | claim ms p50 / p95 / p99 | commit ms p50 / p95 / p99 "
        "| CPU ms/cycle client / coordinator / etcd | etcd calls/cycle | errors |",
        "| --- | ---: | ---: | --- | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        cpu = row["cpu_ms_per_cycle"]
        lines.append(
            f"| {SCENARIO_NAMES.get(row['scenario'], row['scenario'])} | {row['workers']} "
            f"| {_fmt(row['cycles_per_s'], 0)} | {_trio(row['claim_ms'])} "
            f"| {_trio(row['commit_ms'])} "
            f"| {_fmt(cpu['client'])} / {_fmt(cpu['coordinator'])} / {_fmt(cpu['etcd'])} "
            f"| {_fmt(row.get('etcd_calls_per_cycle'))} | {row['errors']} |"
        )
    return "\n".join(lines)


def _ratio_table(doc: dict[str, Any]) -> str:
    ratios = doc.get("ratios", {})
    lines = ["| workers | a/b | a/c | a/d |", "| ---: | ---: | ---: | ---: |"]
    for level in doc.get("config", {}).get("levels", []):
        cells = [_fmt(ratios.get(pair, {}).get(str(level))) for pair in ("a/b", "a/c", "a/d")]
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _reclaim_table(reclaim: dict[str, Any]) -> str:
    lines = [
        f"Reclaim after a SIGSTOPped holder (TTL {_fmt(reclaim['ttl_s'], 0)} s, "
        f"{reclaim['samples']} samples), seconds after the lease's expiry:",
        "",
        "| event | p50 | p95 | max |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in (
        ("lease_gone_s_after_ttl", "claim key gone (etcd lease expiry)"),
        ("ready_s_after_ttl", "task READY again (claimable by ClaimNext)"),
        ("held_by_another_s_after_ttl", "another worker holds it"),
    ):
        s = reclaim[key]
        lines.append(
            f"| {label} | {_fmt(s['p50'], 3)} | {_fmt(s['p95'], 3)} | {_fmt(s['max'], 3)} |"
        )
    return "\n".join(lines)


def _promote_line(promote: dict[str, Any]) -> str:
    s = promote["claimable_s_after_due"]
    return (
        f"Delayed tasks ({promote['claimed']} of {promote['tasks']} claimed; "
        f"{promote['batches']} batches of {promote['batch_size']}, due "
        f"{_fmt(promote['delay_s'], 1)} s after creation; {promote['workers']} workers "
        f"long-polling {_fmt(promote['wait_s'], 0)} s), claimed this long after their "
        f"not_before: p50 {_fmt(s['p50'], 3)} s, p95 {_fmt(s['p95'], 3)} s, max "
        f"{_fmt(s['max'], 3)} s; {s['early']} claimed early, {promote['errors']} errors."
    )


def _scale_table(scale: dict[str, Any]) -> str:
    lines = [
        "| ready tasks | ClaimNext ms p50 / p95 | etcd range limit=1 ms p50 / p95 |",
        "| ---: | --- | --- |",
    ]
    for n in scale["sizes"]:
        c, r = scale["claim_next_ms"][str(n)], scale["etcd_range_limit1_ms"][str(n)]
        lines.append(
            f"| {n} | {_fmt(c['p50'], 3)} / {_fmt(c['p95'], 3)} "
            f"| {_fmt(r['p50'], 3)} / {_fmt(r['p95'], 3)} |"
        )
    lines += [
        "",
        f"ClaimNext largest/smallest: x{_fmt(scale['claim_next_ratio_large_over_small'], 3)}; "
        f"etcd limit=1 range: x{_fmt(scale['etcd_range_ratio_large_over_small'], 2)}. "
        f"Per 100k tasks: etcd db +{_fmt(scale['etcd_db_mib_per_100k_tasks'], 1)} MiB, "
        f"etcd RSS +{_fmt(scale['etcd_rss_mib_per_100k_tasks'], 1)} MiB.",
    ]
    return "\n".join(lines)


def _held_table(held: dict[str, Any]) -> str:
    return (
        f"Held claims: {held['claims_held']} claims of {held['clients']} clients held for "
        f"{_fmt(held['seconds'], 0)} s (TTL 30 s, a tenth of the markers moving each interval): "
        f"renewals done / wanted {_fmt(held['renewals_on_time_ratio'], 3)}, {held['lost']} lost; "
        f"coordinator {_fmt(held['coordinator_cpu_cores'], 3)} cores "
        f"({_fmt(held['coordinator_ms_per_renewal'], 3)} ms a renewal), etcd "
        f"{_fmt(held['etcd_ms_per_renewal'], 3)} ms a renewal against "
        f"{_fmt(held['anchor_etcd_ms_per_keepalive'], 3)} ms a bare lease keepalive "
        f"({_fmt(held['etcd_ms_per_renewal_over_anchor'], 2)}x). Coordinator memory: "
        f"{_fmt(held['coordinator_rss_mib_fresh'], 1)} MiB fresh, "
        f"{_fmt(held['coordinator_rss_mib_held'], 1)} MiB holding them "
        f"(peak {_fmt(held['coordinator_hwm_mib'], 1)} MiB)."
    )


def _targets_table(doc: dict[str, Any]) -> str:
    lines = ["| target (issue item 4) | wanted | measured | met |", "| --- | --- | ---: | --- |"]
    for row in doc.get("targets", []):
        met = {True: "yes", False: "**no**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['what']} | {row['target']} | {_fmt(row['value'], 3)} | {met} |")
    return "\n".join(lines)
