"""``coordinator doctor``'s checks: every disagreement between task records, indexes, claim
keys, results, events and dependency edges in one snapshot of the keyspace (pure, no I/O).
The indexes include the two sorted by time, the delayed and the deadline index
(``due_indexes.py``).

The task record is the one place a task's current state is read from. Primary evidence written
by the same transactions - the live claim key, the canonical result, the event log - must agree
with it; derived keys (ready, claimed and waiting indexes, reverse edges, identity indexes) must
follow from it; likewise an effect record is primary for its open-effects and reconcile index
keys. A disagreement in derived keys of a task whose primary evidence agrees has one
unambiguous fix, offered as a ``Repair`` (one CAS txn, guarded by every key it relies on). A
conflict between primary sources (a live claim key on a task that is not CLAIMED, a missing
result, a broken event chain, edges that disagree) is reported and never repaired: guessing
which side is right is what the seed forbids ("preserve the conflict").

Three findings depend on time rather than on one snapshot: a CLAIMED task whose claim key is
gone (the reclaimer's job), a WAITING task whose upstreams are all DONE and one whose blocked
mark disagrees with its upstreams' states (the releaser's job: release it, or mark it). They
are ``lagging`` findings: the runner reports them only if they persist, unchanged, across a
second snapshot taken a reclaim window later (``confirm``).
"""

# The store first: store/history.py still imports doctor/parsed.py (an arrow back up that
# issue 26 item 3 removes by moving the index-key rule to domain/), and that import only
# completes when the store is already loading. Whoever imports the doctor alone (`coordinator
# doctor` no longer loads the server) would otherwise meet a half-initialized doctor/findings.py.
import coordinator.store  # noqa: F401
from coordinator.doctor.checks import check, confirm
from coordinator.doctor.findings import (
    LAGGING,
    Finding,
    Guard,
    Problem,
    Repair,
    RepairWrite,
    Snapshot,
)

__all__ = [
    "LAGGING",
    "Finding",
    "Guard",
    "Problem",
    "Repair",
    "RepairWrite",
    "Snapshot",
    "check",
    "confirm",
]
