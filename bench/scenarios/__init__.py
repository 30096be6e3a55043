"""The five ways to run a claim-and-commit cycle that the benchmark puts side by side.

a. ``coordinator``: ClaimNext -> Commit through the gRPC front-end with the worker SDK;
b. ``raw``: the same claim and fenced commit issued straight to etcd (the floor);
c. ``lock``: the ``etcd3`` client's Lock recipe per task (acquire, write result, release);
d. ``tooz``: tooz's etcd3gw driver per task (lock, write, unlock), where it installs;
e. ``coordinator, batched``: a's front-end with claim_many and commit_and_next (one call a task).
"""

from bench.scenarios.coordinator import BatchedCoordinatorScenario, CoordinatorScenario
from bench.scenarios.lock import LockScenario
from bench.scenarios.raw import RawFloorScenario
from bench.scenarios.tooz_locks import ToozScenario

__all__ = [
    "BatchedCoordinatorScenario",
    "CoordinatorScenario",
    "LockScenario",
    "RawFloorScenario",
    "ToozScenario",
]
