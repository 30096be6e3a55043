"""Side-by-side benchmarks: the coordinator against the raw etcd floor, the etcd3 Lock recipe and
tooz, measured in one run on one machine (issue #7).

``python -m bench`` starts its own etcd and coordinator and prints markdown tables; ``--json
FILE`` also writes the figures, ``--smoke`` runs tiny sizes in seconds (CI), ``--profile DIR``
records the coordinator with py-spy under load; ``python -m bench.compare`` runs several checkouts
side by side (what a change buys). Performance here is always a ratio measured side by side,
never an absolute time.

Modules: ``cli`` (phases and options), ``procs`` (etcd/coordinator processes, /proc CPU and
RSS), ``harness`` (timed worker threads), ``scenarios`` (a, b, c, d), ``throughput``,
``reclaim`` (+ ``reclaim_worker``), ``scale``, ``held``, ``report``, ``profile``, ``compare``.
"""
