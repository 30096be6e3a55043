"""A smoke run of ``python -m bench`` so the benchmark never rots.

It runs the whole benchmark at tiny sizes (own etcd, own coordinator, every phase) and checks
the JSON it writes: the keys the issue requires and sane types. No timing is asserted and no time
budget applies: these figures come from a loaded CI machine and mean nothing, and a smoke run
has no wall-time bound (bench/cli.py), so a slow machine makes it slower, never skip a phase.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.held import UNDER_A_TICK
from bench.report import HEADLINE

REPO = Path(__file__).resolve().parents[2]
# Only against a hang (a wedged child), far beyond any run: the smoke sizes are fixed and tiny.
HANG_GUARD = 1800


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """The JSON and the stdout of one smoke run."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_every_headline_key_is_a_number_or_null_with_a_reason(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, _ = smoke
    for key in HEADLINE:
        assert key in doc, key
        value = doc[key]
        if value is None:
            assert doc["reasons"].get(key), f"{key} is null without a reason"
        else:
            assert isinstance(value, float), (key, value)
    # Only tooz may be missing (an optional package); everything else must have run.
    for key in HEADLINE:
        if key == "ratio_a_d_32":
            continue
        if key == "held_etcd_ms_per_renewal_over_anchor" and doc[key] is None:
            # The smoke's anchor is short: on a busy machine etcd may spend under a tick.
            assert doc["reasons"][key] == UNDER_A_TICK
            continue
        assert doc[key] is not None, (key, doc["reasons"].get(key))
    if doc["ratio_a_d_32"] is None:
        assert "d" in doc["skipped"]


@pytest.mark.slow
def test_every_scenario_ran_every_level_without_errors(smoke: tuple[dict[str, Any], str]) -> None:
    doc, _ = smoke
    scenarios = {"a", "b", "c", "d", "e"} - set(doc["skipped"])
    expected = {(s, n) for s in scenarios for n in doc["config"]["levels"]}
    rows = {(row["scenario"], row["workers"]): row for row in doc["throughput"]}
    assert set(rows) == expected
    for row in rows.values():
        assert row["cycles"] > 0, row
        assert row["errors"] == 0, row
        assert isinstance(row["cycles_per_s"], float)
        for process in ("client", "coordinator", "etcd"):
            assert isinstance(row["cpu_ms_per_cycle"][process], float)
        # Read off etcd's own /metrics: every cycle of every scenario costs etcd round trips.
        assert isinstance(row["etcd_calls_per_cycle"], float)
        assert row["etcd_calls_per_cycle"] > 0, row
        for spread in (row["claim_ms"], row["commit_ms"]):
            assert set(spread) == {"p50", "p95", "p99"}
            assert all(isinstance(v, float) for v in spread.values())


@pytest.mark.slow
def test_the_multislot_phase_ran_both_sides_of_its_ratio(smoke: tuple[dict[str, Any], str]) -> None:
    doc, stdout = smoke
    multislot = doc["multislot"]
    assert (multislot["processes"], multislot["slots"]) == (4, 8)
    rows = {row["scenario"]: row for row in multislot["rows"]}
    assert set(rows) == {"b", "m"}
    for row in rows.values():
        assert row["workers"] == 32
        assert row["cycles"] > 0, row
        assert row["errors"] == 0, row
        assert all(isinstance(v, float) for v in row["cpu_ms_per_cycle"].values()), row
    assert doc["ratio_multislot_b_32"] == multislot["ratio_m_b"]
    assert "Multi-slot workers: 4 `coordinator worker --slots 8` processes" in stdout


@pytest.mark.slow
def test_the_other_phases_report_their_figures(smoke: tuple[dict[str, Any], str]) -> None:
    doc, stdout = smoke
    config = doc["config"]
    assert doc["reclaim"]["samples"] + len(doc["reclaim"]["discarded"]) == config["reclaim_samples"]
    assert doc["reclaim"]["samples"] >= 1
    assert doc["scale"]["sizes"] == config["scale_sizes"]
    promote = doc["promote"]
    assert promote["tasks"] == config["promote_batches"] * config["promote_batch_size"]
    assert (promote["claimed"], promote["errors"]) == (promote["tasks"], 0), promote
    assert promote["claimable_s_after_due"]["early"] == 0  # DELAYED is not claimable
    assert "Delayed tasks (" in stdout
    assert doc["held"]["claims_held"] == config["held_claims"]
    long_polls = doc["long_polls"]
    admitted = (long_polls["polls_admitted"], long_polls["follows_admitted"])
    assert admitted == (config["long_polls"], config["long_polls"])
    assert long_polls["polls_claimed"] == long_polls["tasks_created"]
    assert "Long polls: " in stdout
    assert [row["key"] for row in doc["targets"]] == list(HEADLINE)
    assert config["budget_s"] is None  # no wall-time bound: every phase ran, however slowly
    assert doc["skipped_phases"] == {}
    assert doc["budget_reached"] is False
    assert "| scenario | workers | cycles/s |" in stdout
    assert "| target (issue item 4) |" in stdout


@pytest.mark.slow
def test_the_events_phase_streamed_the_whole_history_to_every_caller(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, _ = smoke
    events = doc["events"]
    assert events["history_events_each"] == [events["events"]]
    assert isinstance(events["rss_growth_mib_nonreading_follower"], float)
    assert isinstance(events["rss_growth_mib_history_callers"], float)


@pytest.mark.slow
def test_the_load_average_around_every_phase_is_in_the_json_and_the_report(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = smoke
    assert isinstance(doc["machine"]["cpus"], int)
    assert list(doc["load_average"]) == doc["config"]["phases"]  # in the order they ran
    for load in doc["load_average"].values():
        assert set(load) == {"before", "after"}
        for reading in load.values():  # 1, 5 and 15 minutes
            assert len(reading) == 3
            assert all(isinstance(v, float) for v in reading)
    assert "| phase | before | after |" in stdout
    for phase in doc["config"]["phases"]:
        assert f"| {phase} | " in stdout


@pytest.mark.slow
def test_the_hostile_phase_reports_every_row_of_issue_25s_table(
    smoke: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = smoke
    config, hostile = doc["config"], doc["hostile"]
    assert hostile["quota_mib"] == 256
    writes = hostile["writes"]
    # Exact outcomes, not timings: no NOSPACE, the pool never refused, the abuser answered.
    assert writes["nospace_alarms"] == 0
    assert writes["legit_refusals"] == {}
    assert writes["legit_cycles"] > 0
    assert writes["abuser"].get("claim_lost", 0) == 0
    assert writes["db_mib_series"] and doc["hostile_db_peak_over_quota"] < 1.0
    renewals = hostile["renewals"]
    assert (renewals["claims_held"], renewals["lost"]) == (config["hostile_claims"], 0)
    assert renewals["flood_callers"] == config["hostile_flooders"]
    assert sum(renewals["flood_calls"].values()) > 0
    assert isinstance(doc["hostile_renew_p99_over_ttl_third"], float)
    replays = hostile["replays"]
    assert (replays["replays"], replays["tokens"]) == (32, 4)
    assert replays["replays_complete"] == 32
    assert replays["events"] == config["hostile_events"]
    assert isinstance(replays["rss_growth_mib_after"], float)
    lists = hostile["lists"]
    for way in ("queue", "queue_with_inputs", "state"):
        assert lists[way]["tasks_listed"] == config["hostile_list_tasks"], (way, lists[way])
        assert lists[way]["errors"] == {}
        assert lists[way]["pages"] >= 1
    assert doc["hostile_list_pages_answered_ratio"] == 1.0
    assert "One token against the pool (etcd quota 256 MiB)." in stdout
