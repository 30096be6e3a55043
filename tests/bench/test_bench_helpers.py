"""The benchmark's pure helpers: percentiles, paired ratios, targets, profile folding."""

from __future__ import annotations

from typing import Any

import etcd3
import grpc
import pytest

from bench.harness import RunResult
from bench.headline import headline
from bench.hostile import hostile_line
from bench.procs import GRPC_OPTIONS, CpuSnapshot, compact_now, cpu_seconds, rss_mib
from bench.profile import summarize_folded, switches_by_thread, thread_group, thread_names
from bench.report import targets
from bench.retention import checkpoints
from bench.stats import percentile, ratio, spread_ms
from bench.throughput import paired_ratio, summarize
from coordinator.etcd_process import EtcdProcess, find_etcd_binary


def _run(scenario: str, level: int, rnd: int, cycles: int, elapsed: float = 1.0) -> RunResult:
    return RunResult(
        scenario=scenario,
        level=level,
        round=rnd,
        cycles=cycles,
        elapsed=elapsed,
        cpu=CpuSnapshot(0.5, 0.25, 1.0),
        claim=[0.001] * cycles,
        commit=[0.002] * cycles,
    )


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 95) == 4.8
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_spread_and_ratio_handle_empty_and_zero() -> None:
    assert spread_ms([0.001, 0.003]) == {"p50": 2.0, "p95": 2.9, "p99": 2.98}
    assert spread_ms([]) == {"p50": None, "p95": None, "p99": None}
    assert ratio(1.0, 0.0) is None
    assert ratio(None, 2.0) is None
    assert ratio(3.0, 2.0) == 1.5


def test_ratios_pair_runs_of_the_same_round() -> None:
    results = [
        _run("a", 32, 0, 100),
        _run("b", 32, 0, 400),  # round 0: 0.25
        _run("a", 32, 1, 300),
        _run("b", 32, 1, 300),  # round 1: 1.0
        _run("a", 32, 2, 100),
        _run("b", 32, 2, 200),  # round 2: 0.5
        _run("a", 8, 0, 999),
        _run("c", 32, 0, 100),  # another pair: ignored
    ]
    assert paired_ratio(results, "a", "b", 32) == 0.5
    assert paired_ratio(results, "a", "d", 32) is None
    assert paired_ratio(results, "a", "b", 8) is None


def test_summary_medians_rates_and_divides_cpu_by_cycles() -> None:
    rows = summarize([_run("a", 1, 0, 100), _run("a", 1, 1, 300), _run("a", 1, 2, 200)])
    assert len(rows) == 1
    row = rows[0]
    assert row["cycles_per_s"] == 200.0
    assert row["cycles"] == 600
    # 3 runs x (0.5 s client, 0.25 s coordinator, 1.0 s etcd) over 600 cycles.
    assert row["cpu_ms_per_cycle"] == {"client": 2.5, "coordinator": 1.25, "etcd": 5.0}
    assert row["claim_ms"]["p50"] == 1.0


def test_targets_say_met_unmet_or_unknown() -> None:
    doc = {
        "ratio_a_b_32": 1.2,
        "ratio_a_c_32": 0.5,
        "ratio_a_d_32": None,
        "reclaim_p95_s_over_ttl": 0.6,
        "claimnext_100k_over_1k": 1.3,
        "coordinator_rss_mib_10k_claims": 199.9,
        "etcd_db_mib_at_200k_over_50k": 1.1,
        "throughput_pruner_on_over_off": 0.89,
        "promote_claimable_p95_s_after_due": 1.0,
        "held_renewals_on_time_ratio": 0.99,
        "held_coordinator_cpu_cores": 0.26,
        "held_etcd_ms_per_renewal_over_anchor": 1.0,
        "ratio_a_b_32_batched": None,
        "ratio_multislot_b_32": 0.99,
        # Issue 25's table, each at its bound: the high-water mark and 64 MiB are not met.
        "hostile_db_peak_over_quota": 0.8,
        "hostile_renew_p99_over_ttl_third": 0.999,
        "hostile_replay_rss_growth_mib": 64.0,
        "hostile_list_pages_answered_ratio": 1.0,
    }
    met = {row["key"]: row["met"] for row in targets(doc)}
    assert met == {
        "ratio_a_b_32": True,
        "ratio_a_c_32": False,
        "ratio_a_d_32": None,
        "reclaim_p95_s_over_ttl": True,
        "claimnext_100k_over_1k": False,
        "coordinator_rss_mib_10k_claims": True,
        "etcd_db_mib_at_200k_over_50k": True,
        "throughput_pruner_on_over_off": False,
        "promote_claimable_p95_s_after_due": True,
        "held_renewals_on_time_ratio": True,
        "held_coordinator_cpu_cores": False,
        "held_etcd_ms_per_renewal_over_anchor": True,
        "ratio_a_b_32_batched": None,
        "ratio_multislot_b_32": False,
        "hostile_db_peak_over_quota": False,
        "hostile_renew_p99_over_ttl_third": True,
        "hostile_replay_rss_growth_mib": False,
        "hostile_list_pages_answered_ratio": True,
    }


def test_folded_stacks_rank_inclusive_and_self() -> None:
    folded = "\n".join(
        [
            "main (app.py:1);handle (srv.py:10);decode (rec.py:5) 6",
            "main (app.py:1);handle (srv.py:12);txn (etcd.py:3) 3",
            "main (app.py:1) 1",
        ]
    )
    text = summarize_folded("x", folded)
    assert "## x: 10 samples" in text
    assert "| 100.0 | `app.py:main` |" in text
    assert "| 90.0 | `srv.py:handle` |" in text  # lines 10 and 12 merge into one function
    assert "| 60.0 | `rec.py:decode` |" in text


def test_proc_readings_of_this_process() -> None:
    import os

    assert cpu_seconds(os.getpid()) > 0
    assert 1 < rss_mib(os.getpid()) < 100_000


def test_the_retention_db_is_measured_at_four_checkpoints() -> None:
    assert checkpoints(200_000) == [50_000, 100_000, 150_000, 200_000]
    assert checkpoints(400) == [100, 200, 300, 400]
    assert checkpoints(3) == [1, 2, 3]


def test_the_db_headline_is_the_last_checkpoint_over_the_first_with_a_note_below_200k() -> None:
    retention = {
        "retention_tasks": 20_000,
        "etcd_db_mib_at": {"5000": 1.0, "10000": 1.1, "15000": 1.0, "20000": 1.05},
        "etcd_db_mib_last_over_first": 1.05,
        "pruner_on_over_off": 0.95,
    }
    doc: dict[str, Any] = {
        "config": {"phases": ["retention"], "levels": []},
        "retention": retention,
    }
    headline(doc)
    assert (doc["etcd_db_mib_at_200k_over_50k"], doc["throughput_pruner_on_over_off"]) == (
        1.05,
        0.95,
    )
    assert doc["notes"]["etcd_db_mib_at_200k_over_50k"].startswith("measured at 20000 over 5000")
    full = {**retention, "retention_tasks": 200_000}
    doc = {"config": {"phases": ["retention"], "levels": []}, "retention": full}
    headline(doc)
    assert "etcd_db_mib_at_200k_over_50k" not in doc["notes"]


def test_the_multislot_headline_is_its_paired_ratio_or_null_with_the_reason() -> None:
    doc: dict[str, Any] = {"config": {"phases": ["multislot"], "levels": []}}
    doc["multislot"] = {"ratio_m_b": 1.07, "rows": []}
    headline(doc)
    assert doc["ratio_multislot_b_32"] == 1.07
    doc["multislot"] = {"ratio_m_b": None, "rows": []}
    headline(doc)
    assert (
        doc["reasons"]["ratio_multislot_b_32"]
        == "no round measured both m and b (see the errors in multislot.rows)"
    )
    doc = {"config": {"phases": ["held"], "levels": []}}
    headline(doc)
    assert doc["reasons"]["ratio_multislot_b_32"] == "the multislot phase was not run (--only)"


def test_hostile_rows_left_out_leave_their_figures_null_and_say_why() -> None:
    replays = {
        "events": 20_000,
        "replays": 32,
        "tokens": 4,
        "replays_complete": 32,
        "refusals": {},
        "rss_growth_mib_peak": 25.0,
        "rss_growth_mib_after": 1.5,
    }
    doc: dict[str, Any] = {
        "config": {"phases": ["hostile"], "levels": []},
        "hostile": {"quota_mib": 256, "replays": replays},
    }
    headline(doc)
    assert doc["hostile_replay_rss_growth_mib"] == 25.0
    assert doc["notes"]["hostile_replay_rss_growth_mib"] == "1.5 MiB still held once they ended"
    for key, row in (
        ("hostile_db_peak_over_quota", "writes"),
        ("hostile_renew_p99_over_ttl_third", "renewals"),
        ("hostile_list_pages_answered_ratio", "lists"),
    ):
        assert doc[key] is None
        assert doc["reasons"][key] == f"the hostile phase's {row} row was not run (--hostile-rows)"
    assert hostile_line(doc["hostile"]) == (
        "One token against the pool (etcd quota 256 MiB). Replays: 32 of 32 over 20000 events "
        "from 4 tokens, RSS +25.0 MiB at peak, +1.5 MiB after (refused never).\n"
    )


def test_compacting_twice_with_nothing_written_between_is_not_an_error() -> None:
    # An etcd of its own: compacting the session's shared one would cut other tests' history.
    with EtcdProcess(binary=find_etcd_binary()) as etcd:
        client = etcd3.client(etcd.host, etcd.port, timeout=30, grpc_options=GRPC_OPTIONS)
        try:
            client.put("/compact-twice/key", b"v")
            compact_now(client)
            # etcd refuses a compaction at a revision already compacted (OUT_OF_RANGE); the
            # history is as asked, so the second call is not an error (it once failed the
            # smoke bench).
            compact_now(client)
            with pytest.raises(grpc.RpcError) as refused:
                client.compact(1, physical=True)
            assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
        finally:
            client.close()


_DUMP = """Process 25870: python -c ... serve
Python v3.11.7 (/usr/bin/python3.11)

Thread 25870 (idle): "MainThread"
    Event.wait (threading.py:629)
Thread 25877 (idle): "watch /coordinator-bench/ready/"
    PrefixWatch._run (coordinator/store/etcd/watch.py:93)
Thread 25900 (active): "rpc_0"
    _worker (concurrent/futures/thread.py:81)
Thread 25934 (idle): "rpc_11"
    _worker (concurrent/futures/thread.py:81)
"""


def test_thread_names_come_from_py_spy_dump_thread_lines() -> None:
    assert thread_names(_DUMP) == {
        25870: "MainThread",
        25877: "watch /coordinator-bench/ready/",
        25900: "rpc_0",
        25934: "rpc_11",
    }
    assert thread_names("py-spy failed") == {}


def test_threads_are_grouped_by_name_with_numbers_as_n() -> None:
    assert thread_group("rpc_11") == thread_group("rpc_0") == "rpc_N"
    assert thread_group("Thread-8 (_serve)") == "Thread-N (_serve)"
    assert thread_group(None) == "(not a Python thread: grpc core, the runtime)"


def test_switches_by_thread_counts_each_group_per_cycle_most_first() -> None:
    names = thread_names(_DUMP)
    before = {25870: 5, 25877: 100, 25900: 10, 25934: 20, 25871: 0}
    # rpc_0 +30, rpc_11 +50, a watch +20, the main thread +0, a native thread +100, and a
    # handler thread started during the run (+10 from nothing).
    after = {25870: 5, 25877: 120, 25900: 40, 25934: 70, 25871: 100, 25999: 10}
    names[25999] = "rpc_12"
    table = switches_by_thread(before, after, names, cycles=10)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert rows == [
        "| 1 | `(not a Python thread: grpc core, the runtime)` | 10.0 | 48 |",
        "| 3 | `rpc_N` | 9.0 | 43 |",
        "| 1 | `watch /coordinator-bench/ready/` | 2.0 | 10 |",
        "| 1 | `MainThread` | 0.0 | 0 |",
    ]
