"""Random operation sequences against a real etcd; after every step the keyspace must be
consistent: records, indexes, claims, attempts, results and the event chain agree.

Lease expiry is simulated by revoking the claim's lease through a raw client: etcd deletes the
claim key exactly as when the TTL runs out, without waiting for it.
"""

from __future__ import annotations

import itertools
import secrets
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.clock import ManualClock
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import (
    AttemptRecord,
    ClaimRecord,
    EventRecord,
    ResultRecord,
    TaskRecord,
    decode,
)
from coordinator.domain.states import AttemptEnd, Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store, TaskSpec
from tests.helpers import eventually
from tests.store.support import LIMITS, NO_SCAN

TASKS = 2
# Weighted towards the interleavings that matter: claim, expire, commit (and again).
KINDS = (
    ["claim"] * 3
    + ["commit"] * 3
    + ["expire"] * 2
    + ["claim_next", "release", "renew", "checkpoint", "cancel", "update", "scan", "bump"]
)
# (kind, task number, worker, which fence of the task (newest first), result bytes)
OPS = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, TASKS - 1),
    st.sampled_from(["w0", "w1"]),
    st.integers(0, 3),
    st.sampled_from([b"r1", b"r2"]),
)


class Run:
    """One store on a fresh prefix, the fences it handed out, and the op interpreter."""

    def __init__(self, etcd: EtcdProcess, etcd_client: Any) -> None:
        self.raw = etcd_client
        self.kv = EtcdKV.connect([etcd.endpoint])
        self.keys = Keyspace(f"/t/invariants-{secrets.token_hex(4)}")
        self.store = Store.open(
            self.kv, keys=self.keys, limits=LIMITS, clock=ManualClock(), scan_interval=NO_SCAN
        )
        self.store.start(reclaim=False)
        self.fences: dict[str, list[Fence]] = defaultdict(list)
        self.commits: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.epoch = 1
        self.inputs = 0
        for n in range(TASKS):
            self.store.tasks.create(TaskSpec(task_id=f"t{n}", priority=n % 2, input=b"in"), by="pm")

    def close(self) -> None:
        self.store.close()
        self.kv.close()

    def apply(self, op: tuple[str, int, str, int, bytes]) -> None:
        kind, number, worker, pick, result = op
        task_id = f"t{number}"
        if kind in ("claim", "claim_next"):
            self._claim(kind, task_id, worker)
        elif kind in ("release", "commit", "renew", "checkpoint"):
            self._held(kind, task_id, pick, result)
        elif kind == "cancel":
            self._cancel(task_id)
        elif kind == "update":
            self._update(task_id)
        elif kind == "expire":
            _, meta = self.raw.get(self.keys.claim(task_id))
            if meta is not None:
                self.raw.revoke_lease(meta.lease_id)
        elif kind == "scan":
            self.store.reclaimer.scan()
        else:
            self.epoch = self.store.admin.bump_epoch()

    def _claim(self, kind: str, task_id: str, worker: str) -> None:
        claims = self.store.claims
        if kind == "claim":
            claimed = claims.claim(task_id, principal=worker, epoch=self.epoch, ttl=30)
        else:
            claimed = claims.claim_next("default", principal=worker, epoch=self.epoch, ttl=30)
        assert (claimed.fence is not None) == (claimed.verdict.outcome is Outcome.CLAIMED)
        if claimed.fence is not None:
            self.fences[claimed.fence.task_id].insert(0, claimed.fence)

    def _held(self, kind: str, task_id: str, pick: int, result: bytes) -> None:
        """Release, renew (with a checkpoint or not) or commit with one of the fences the task
        was ever claimed with."""
        fences = self.fences[task_id]
        if not fences:
            return
        fence = fences[min(pick, len(fences) - 1)]
        owner = self._owner(fence)
        if kind == "release":
            self.store.acceptance.release(fence, principal=owner, reason="")
        elif kind == "renew":
            self.store.renewals.renew(fence, principal=owner, progress="p")
        elif kind == "checkpoint":  # gives an attempt the task record holds a key (schema 3)
            self.store.renewals.renew(fence, principal=owner, progress="p", checkpoint=result)
        else:
            self._commit(fence, owner, result)

    def _cancel(self, task_id: str) -> None:
        try:
            self.store.tasks.cancel(task_id, by="pm", reason="")
        except FailedPrecondition:
            assert self.store.tasks.get(task_id).state is TaskState.DONE

    def _update(self, task_id: str) -> None:
        self.inputs += 1
        data = f"input {self.inputs}".encode()
        try:
            self.store.tasks.update_input(
                task_id, data=data, input_digest=digest_of(data), expected_revision=0, by="pm"
            )
        except FailedPrecondition:
            assert self.store.tasks.get(task_id).state in (TaskState.DONE, TaskState.CANCELLED)

    def _owner(self, fence: Fence) -> str:
        (attempt,) = [
            a for a in self.store.tasks.attempts(fence.task_id) if a.attempt_id == fence.attempt_id
        ]
        return attempt.owner_id

    def _commit(self, fence: Fence, owner: str, result: bytes) -> None:
        task = self.store.tasks.get(fence.task_id)
        was_holder = (
            task.state is TaskState.CLAIMED
            and task.claim_generation == fence.claim_generation
            and self.raw.get(self.keys.claim(fence.task_id))[1] is not None
            and fence.scheduler_epoch == self.epoch
        )
        before = self._attempt(fence)
        already = before.end is AttemptEnd.COMMITTED  # a retry after a lost response
        committed = self.store.acceptance.commit(
            fence,
            principal=owner,
            input_digest=before.input_digest,
            result_digest=digest_of(result),
            result=result,
            result_ref="",
        )
        if committed.verdict.outcome is Outcome.COMMITTED:
            assert was_holder or already, (fence, committed)
            self.commits[(fence.task_id, before.revision)].add(committed.result_commit_id)

    def _attempt(self, fence: Fence) -> AttemptRecord:
        value, _ = self.raw.get(self.keys.attempt(fence.task_id, fence.attempt_id))
        if value is not None:
            return decode(AttemptRecord, value)
        recorded = recorded_attempt(self.store.tasks.get(fence.task_id))  # schema 3: no key
        assert recorded is not None and recorded.attempt_id == fence.attempt_id
        return recorded

    def check(self) -> None:
        """Every invariant of a consistent keyspace."""
        raw = {m.key.decode(): (v, m) for v, m in self.raw.get_prefix(self.keys.prefix + "/")}
        keys, ready_count = self.keys, 0
        ready_keys = {k for k in raw if k.startswith(keys.ready_prefix())}
        for n in range(TASKS):
            task_id = f"t{n}"
            value, meta = raw[keys.task(task_id)]
            task = decode(TaskRecord, value, state_version=meta.mod_revision)
            own_ready = {k for k in ready_keys if k.rsplit("/", 1)[1] == task_id}
            if task.state is TaskState.READY:
                ready_count += 1
                assert own_ready == {keys.ready(task.queue, task.priority, task.ready_seq, task_id)}
            else:
                assert own_ready == set(), task
            assert (keys.claimed(task_id) in raw) == (task.state is TaskState.CLAIMED)
            if keys.claim(task_id) in raw:
                claim_value, claim_meta = raw[keys.claim(task_id)]
                claim = decode(ClaimRecord, claim_value)
                assert task.state is TaskState.CLAIMED
                assert claim.attempt_id == task.attempt_id
                assert claim_meta.create_revision == meta.mod_revision
            attempts = sorted(
                (
                    decode(AttemptRecord, v)
                    for k, (v, _) in raw.items()
                    if k.startswith(keys.attempts_prefix(task_id))
                ),
                key=lambda a: a.attempt,
            )
            recorded = recorded_attempt(task)  # schema 3: the record holds its latest attempt
            keyed = [a for a in attempts if a.attempt_id == task.attempt_id]
            if recorded is not None and not keyed:
                attempts.append(recorded)
            elif recorded is not None:  # a checkpoint gave it a key, which wins: the same end
                assert keyed[0].end is recorded.end, (keyed[0], recorded)
            assert [a.attempt for a in attempts] == list(range(1, task.attempt + 1))
            for attempt in attempts:
                if attempt.end is AttemptEnd.RUNNING:
                    assert task.state is TaskState.CLAIMED
                    assert attempt.attempt_id == task.attempt_id
            results = [
                decode(ResultRecord, v)
                for k, (v, _) in raw.items()
                if k.startswith(f"{keys.results_prefix}{task_id}/")
            ]
            if task.state is TaskState.DONE:
                current = [r for r in results if r.revision == task.revision]
                assert [r.commit_id for r in current] == [task.result_commit_id]
                winner = next(a for a in attempts if a.attempt_id == current[0].attempt_id)
                assert winner.end is AttemptEnd.COMMITTED
            else:
                assert [r for r in results if r.revision == task.revision] == []
            chain = [
                decode(EventRecord, v)
                for k, (v, _) in sorted(raw.items())
                if k.startswith(keys.events_prefix(task_id))
            ]
            assert (chain[0].op, chain[0].from_state) == (Op.CREATE, None)
            for before, after in itertools.pairwise(chain):
                assert after.from_state is before.to_state, chain
            assert chain[-1].to_state is task.state
        assert all(len(ids) == 1 for ids in self.commits.values()), self.commits
        assert len(ready_keys) == ready_count
        eventually(lambda: self.store.ready.size("default") == ready_count, timeout=5)


@settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(OPS, min_size=10, max_size=50))
def test_random_operations_keep_the_keyspace_consistent(
    etcd: EtcdProcess, etcd_client: Any, ops: list[tuple[str, int, str, int, bytes]]
) -> None:
    run = Run(etcd, etcd_client)
    try:
        run.check()
        for op in ops:
            run.apply(op)
            run.check()
    finally:
        run.close()
