"""ClaimNext cost at 1k vs 100k ready tasks, side by side with etcd's own `limit=1` range.

Why: etcd 3.4 answers a range with limit=1 over a flat prefix in O(n) (it counts the whole
range), so a ready index read straight from etcd gets slower as the queue grows. ClaimNext reads
a watch-fed in-memory copy instead. This script seeds a fresh etcd with N ready tasks for each N,
then times, in the same run:

* ``etcd_first``: one ``Range(ready prefix, limit=1)`` - the naive "first ready key" read;
* ``claim_next``: a full ClaimNext (pick + read + lease grant + claim txn).

It prints medians and the ratio large/small for each; the claim is that ClaimNext's ratio stays
near 1 while the raw range's grows with n. Bounded: it stops by itself (~1 minute).

Run: .venv/bin/python bench/claim_next_scaling.py [--sizes 1000,100000] [--samples 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord, encode
from coordinator.domain.states import TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store
from coordinator.store.etcd import put

_BATCH = 60  # two keys per task; etcd allows 128 operations per txn


def seed(kv: EtcdKV, keys: Keyspace, count: int) -> None:
    """Write ``count`` READY tasks and their ready-index keys, in batched txns."""
    digest = digest_of(b"")
    for start in range(0, count, _BATCH):
        ops = []
        for i in range(start, min(start + _BATCH, count)):
            task = TaskRecord(
                task_id=f"t{i:08d}",
                queue="q",
                input_digest=digest,
                state=TaskState.READY,
                ready_seq=i + 1,
            )
            ops.append(put(keys.task(task.task_id), encode(task)))
            ops.append(put(keys.ready("q", 0, task.ready_seq, task.task_id), b""))
        kv.txn((), ops)


def median_ms(fn: Callable[[], object], samples: int) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(kv: EtcdKV, size: int, samples: int) -> dict[str, float]:
    """Seed ``size`` ready tasks under a fresh prefix and time both reads."""
    keys = Keyspace(f"/bench/n{size}")
    seed(kv, keys, size)
    store = Store.open(kv, keys=keys, limits=ClaimLimits(min_ttl=2, max_ttl=60))
    store.start(reclaim=False)
    try:
        prefix = keys.ready_prefix("q")
        end = kv.prefix_end(prefix)
        first_ms = median_ms(lambda: kv.range_page(prefix, end, limit=1), samples)

        def claim_next() -> None:
            result = store.claims.claim_next("q", principal="bench", epoch=1, ttl=60)
            assert result.fence is not None, result.verdict

        claim_ms = median_ms(claim_next, samples)
    finally:
        store.close()
    return {"size": size, "etcd_first_ms": first_ms, "claim_next_ms": claim_ms}


def main() -> None:
    """Run the comparison and print a table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    sizes = [int(s) for s in ns.sizes.split(",")]
    with EtcdProcess() as etcd:
        kv = EtcdKV.connect([etcd.endpoint], timeout=30)
        rows = [measure(kv, size, ns.samples) for size in sizes]
        kv.close()
    small, large = rows[0], rows[-1]
    ratios = {
        "etcd_first_ratio": large["etcd_first_ms"] / small["etcd_first_ms"],
        "claim_next_ratio": large["claim_next_ms"] / small["claim_next_ms"],
    }
    if ns.json:
        print(json.dumps({"rows": rows, **ratios}))
        return
    print(f"{'ready tasks':>12} {'etcd limit=1 ms':>16} {'ClaimNext ms':>13}")
    for row in rows:
        print(f"{row['size']:>12} {row['etcd_first_ms']:>16.3f} {row['claim_next_ms']:>13.3f}")
    print(
        f"ratio {large['size']}/{small['size']}: etcd limit=1 x{ratios['etcd_first_ratio']:.1f}, "
        f"ClaimNext x{ratios['claim_next_ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
