"""Faults: small classes with ``name``, ``available``, ``inject`` and ``heal`` (the interface is
chaos/fault.py's ``Fault``).

``worker_flags`` are passed to the first worker of a scenario (the worker acts out the precise
moment: it stops or kills itself right after its downstream call); ``all_worker_flags`` go to
every worker. ``inject`` returns once the fault is in place; ``heal`` undoes it.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import grpc

from chaos import clock_skew, netns
from chaos.abandon import AbandonPolls
from chaos.cluster import Member
from chaos.fault import Fault, wait_until
from chaos.flood import NonReader, StreamFlood
from chaos.harness import TTL, Harness, stopped
from chaos.history import End, Observed, OpKind, load
from chaos.hostile import HostileTenant
from coordinator.errors import CoordinatorError, FailedPrecondition
from coordinator.sdk import TaskInfo, TaskRetryPolicy, TaskState, WorkerClient

PAST_TTL = 2 * TTL + 1.5
"""How long a pause lasts: past the lease TTL and the reclaimer's scan."""


class PauseWorker(Fault):
    """A worker frozen (SIGSTOP) holding a claim, past its TTL, then resumed (SIGCONT)."""

    name = "worker-pause"
    worker_flags = ("--pause-first",)

    def inject(self, h: Harness) -> None:
        proc = h.workers["w0"]
        wait_until(lambda: stopped(proc.pid), 30, "w0 to stop holding its claim")
        time.sleep(PAST_TTL)  # another worker takes the task over meanwhile

    def heal(self, h: Harness) -> None:
        h.workers["w0"].send_signal(signal.SIGCONT)


class KillWorkerAfterEffect(Fault):
    """Workers SIGKILLed right after their first downstream call: the response is lost.

    Every worker carries the flag, so the fault lands whichever worker wins the first claims;
    each dead one is replaced by a worker without it."""

    name = "worker-kill"
    all_worker_flags = ("--kill-after-effect",)

    def inject(self, h: Harness) -> None:
        wait_until(lambda: any(p.poll() is not None for p in h.workers.values()), 30, "a kill")

    def heal(self, h: Harness) -> None:
        for name, proc in list(h.workers.items()):
            if proc.poll() is not None:
                h.start_worker(f"{name}-again")


class KillReplica(Fault):
    """A coordinator replica SIGKILLed while commits are in flight, restarted later."""

    name = "replica-kill"
    server_side = True

    def inject(self, h: Harness) -> None:
        proc = h.replicas[0].proc
        assert proc is not None
        proc.kill()
        proc.wait()
        time.sleep(TTL)

    def heal(self, h: Harness) -> None:
        h.replicas[0].start()


class StopEtcdLeader(Fault):
    """The etcd leader frozen (SIGSTOP): the others elect a new leader; then SIGCONT."""

    name = "etcd-leader-pause"
    server_side = True

    def __init__(self) -> None:
        self.member: Member | None = None

    def inject(self, h: Harness) -> None:
        self.member = h.cluster.leader()
        self.member.signal(signal.SIGSTOP)
        wait_until(lambda: _new_leader(h, self.member), 20, "a new etcd leader")

    def heal(self, h: Harness) -> None:
        if self.member is not None:
            self.member.signal(signal.SIGCONT)


def _new_leader(h: Harness, old: Member | None) -> bool:
    with contextlib.suppress(Exception):
        for member in h.cluster.members:
            if member is old or not member.running:
                continue
            client = h.cluster.client(member)
            try:
                name = client.status().leader.name
            finally:
                client.close()
            return old is None or name != old.name
    return False


class RestartEtcdMember(Fault):
    """The etcd leader SIGKILLed, then restarted on its data dir: acknowledged commits stay."""

    name = "etcd-member-restart"
    server_side = True

    def __init__(self) -> None:
        self.member: Member | None = None

    def inject(self, h: Harness) -> None:
        self.member = h.cluster.leader()
        self.member.signal(signal.SIGKILL)
        assert self.member.proc is not None
        self.member.proc.wait()
        time.sleep(TTL)

    def heal(self, h: Harness) -> None:
        if self.member is not None:
            h.cluster.start_member(self.member)
            h.cluster.wait_healthy()


class BumpEpoch(Fault):
    """The scheduler epoch bumped while a commit is due: old claims are fenced.

    w0 holds its first claim (``--hold-first``) until the bump has completed, then commits: that
    commit carries the old epoch and must be refused EPOCH_CHANGED (the checker's
    ``old_epoch_commits`` reads the bump from the operator's history, and so judges every other
    old-epoch commit that happened to be in flight too)."""

    name = "epoch-bump"
    worker_flags = ("--hold-first",)

    def __init__(self) -> None:
        self.bumped = False

    def inject(self, h: Harness) -> None:
        wait_until(lambda: _claimed(h.root / "w0.jsonl"), 30, "w0 to hold a claim")
        rec = h.recorder("operator-epoch-bump")
        with h.client("operator") as admin:
            op = rec.invoke(OpKind.BUMP_EPOCH, task="")
            with rec.bound(op):
                epoch = admin.admin.bump_epoch()
            rec.complete(op, End.OK, Observed.OK, epoch=epoch)
        self.bumped = True

    def heal(self, h: Harness) -> None:
        h.workers["w0"].send_signal(signal.SIGUSR1)  # now commit the held, old-epoch claim
        if self.bumped:
            wait_until(lambda: _committed(h.root / "w0.jsonl"), 30, "w0's late commit")


class _RacingCommit(Fault):
    """An operator call on a few held tasks while their holders are about to commit (within a
    TTL), each recorded in the operator's history so the checker orders it with the commits.

    w0 holds its first claim (``--hold-first``) until the heal, so at least one holder's commit
    surely comes after the call (on a busy machine the others' 30 ms of work often ends before
    an operator's listing does); the rest race as they come."""

    WANTED = 3
    op: OpKind
    worker_flags = ("--hold-first",)

    def __init__(self) -> None:
        self.done: list[str] = []

    def call(self, client: WorkerClient, task: TaskInfo) -> TaskInfo:
        """The racing call on one held task."""
        raise NotImplementedError

    def inject(self, h: Harness) -> None:
        wait_until(lambda: _claimed(h.root / "w0.jsonl"), 30, "w0 to hold a claim")
        deadline = time.monotonic() + TTL
        rec = h.recorder(f"operator-{self.name}")
        with h.client("operator") as operator:
            while len(self.done) < self.WANTED and time.monotonic() < deadline:
                for task in operator.list_tasks(queue=h.queue, state=TaskState.CLAIMED):
                    if task.task_id in self.done:
                        continue
                    op = rec.invoke(self.op, task=task.task_id, revision=task.revision)
                    try:
                        with rec.bound(op):
                            got = self.call(operator, task)
                    except FailedPrecondition as exc:
                        # It may have committed since the listing: refused, as it should be.
                        rec.complete(op, End.FAIL, Observed.REFUSED, message=str(exc)[:200])
                        continue
                    except CoordinatorError as exc:
                        rec.complete(op, End.INFO, message=str(exc)[:200])
                        continue
                    rec.complete(op, End.OK, Observed.OK, revision=got.revision)
                    self.done.append(task.task_id)
                time.sleep(0.01)

    def heal(self, h: Harness) -> None:
        h.workers["w0"].send_signal(signal.SIGUSR1)  # now commit the held claim
        wait_until(lambda: _committed(h.root / "w0.jsonl"), 30, "w0's late commit")


class CancelRacingCommit(_RacingCommit):
    """Held tasks cancelled while their holders are about to commit (a few, within a TTL)."""

    name = "cancel-race"
    op = OpKind.CANCEL

    def call(self, client: WorkerClient, task: TaskInfo) -> TaskInfo:
        return client.cancel_task(task.task_id, reason="chaos")


class InputChangeRacingCommit(_RacingCommit):
    """Held tasks given a new input while their holders are about to commit: each holder's
    commit must be STALE_INPUT (or FENCED), and the task's canonical result must come from an
    attempt that ran on the new input."""

    name = "input-change-race"
    op = OpKind.UPDATE_INPUT

    def call(self, client: WorkerClient, task: TaskInfo) -> TaskInfo:
        return client.update_input(task.task_id, input=f"{task.task_id} v2".encode())


class DuplicateRequests(Fault):
    """Every commit is sent twice (a retried / duplicated request) by every worker."""

    name = "duplicate-requests"
    all_worker_flags = ("--retry-commits",)


class EtcdDelay(Fault):
    """Every byte between the replicas and etcd delayed (our TCP proxy), then undelayed."""

    name = "etcd-delay"
    server_side = True
    proxied = True

    def inject(self, h: Harness) -> None:
        for proxy in h.proxies:
            proxy.delay = 0.15
        time.sleep(TTL)

    def heal(self, h: Harness) -> None:
        for proxy in h.proxies:
            proxy.heal()


class EtcdDrop(Fault):
    """The replicas cut off from etcd (every proxied connection dropped) past a TTL."""

    name = "etcd-drop"
    server_side = True
    proxied = True

    def inject(self, h: Harness) -> None:
        for proxy in h.proxies:
            proxy.drop()
        time.sleep(TTL + 1)

    def heal(self, h: Harness) -> None:
        for proxy in h.proxies:
            proxy.heal()


class ClockSkew(Fault):
    """Replicas and workers with wall clocks 5 minutes off, half ahead and half behind
    (libfaketime; never etcd): must change nothing. The harness starts them skewed
    (chaos/clock_skew.py); the scenario adds no other fault, so the history must pass the
    checker, and a commit may be refused only as any slow worker's is (SUPERSEDED,
    LEASE_EXPIRED: a loaded machine, not the skew, let its lease run out)."""

    name = "clock-skew"
    skews = ("+5m", "-5m")

    def available(self) -> str:
        return clock_skew.unavailable()


class PartitionWorker(Fault):
    """A worker cut off from the coordinator while it works on a claim (its network namespace's
    link taken down past the TTL, then restored): another worker takes the task over, and the
    cut-off worker's commit, sent once the link is back, is refused."""

    name = "worker-partition"
    partition = True
    worker_flags = ("--hold-first",)

    def __init__(self) -> None:
        self.cut = False

    def available(self) -> str:
        return netns.unavailable()

    def inject(self, h: Harness) -> None:
        assert h.netns is not None
        w0 = h.root / "w0.jsonl"
        wait_until(lambda: _claimed(w0), 30, "w0 to hold a claim")
        h.netns.cut()
        self.cut = True
        time.sleep(PAST_TTL)  # its lease expires; another worker takes the task over

    def heal(self, h: Harness) -> None:
        if h.netns is None or not self.cut:
            return
        h.netns.restore()
        h.workers["w0"].send_signal(signal.SIGUSR1)  # now commit the held claim
        wait_until(lambda: _committed(h.root / "w0.jsonl"), 60, "w0's late commit")


class AbuseStreams(Fault):
    """During the normal workload, a flood of WatchEvents follow streams - one principal asking
    for more than its cap, two others filling the replica's - each reopened as soon as it ends,
    plus a consumer that never reads its stream. The replicas run with small stream bounds
    (``replica_flags``) and a short maximum age, so the caps are contended all through the flood
    and the run's follower (chaos/follower.py) must resume past refusals. Expected: nothing else
    changes (every task done once, no violation, the follower sees the whole log), every
    refusal is RESOURCE_EXHAUSTED (the checker's ``stream_refusals``), and the non-reader is
    ended by the server (``unread_streams``): by its maximum age (1.5 s), since its buffer
    (10,000 events, 10 s of patience) cannot fill in this workload's few seconds. Whether its
    handler sees the age itself or, its send blocked by a full flow-control window, is cut by
    the sweep, the stream ends UNAVAILABLE naming the age, which the non-reader reads at the
    heal."""

    name = "abuse"
    MAX_STREAMS, PER_PRINCIPAL = 8, 3
    replica_flags = (
        *("--max-streams", str(MAX_STREAMS)),
        *("--max-streams-per-principal", str(PER_PRINCIPAL)),
        *("--max-stream-age", "1.5"),
    )
    local_only = "it floods the stream slots, sized to the local replicas' bounds"
    # One principal over its cap; two more that, with the follower and the non-reader, fill
    # the replica's slots, so both caps refuse.
    FLOOD = {"flood-0": PER_PRINCIPAL + 2, "flood-1": PER_PRINCIPAL, "flood-2": PER_PRINCIPAL}
    FLOOD_SECONDS = 3.0

    def __init__(self) -> None:
        self.flood: StreamFlood | None = None
        self.non_reader: NonReader | None = None
        self.channels: list[grpc.Channel] = []

    def inject(self, h: Harness) -> None:
        self.channels = [h.channel(), h.channel()]
        rec = h.recorder("operator-abuse")
        self.non_reader = NonReader(self.channels[0], h.queue, h.metadata("non-reader"), rec)
        self.flood = StreamFlood(self.channels[1], h.queue, self.FLOOD, h.metadata, rec).start()
        time.sleep(self.FLOOD_SECONDS)  # the workers claim and commit meanwhile

    def heal(self, h: Harness) -> None:
        if self.flood is not None:
            self.flood.stop()
        if self.non_reader is not None:
            self.non_reader.finish()
        for channel in self.channels:
            channel.close()


class PoisonTask(Fault):
    """A poison task beside the normal workload: whichever worker claims it dies (chaos/worker.py
    ``--poison``), frozen (SIGSTOP) past its TTL on the first attempt and SIGKILLed on every
    other. Its retry policy allows ``BUDGET`` attempts, so when the last one's lease expires the
    reclaimer must dead-letter it (FAILED, EXHAUSTED), having let no claim beyond the budget;
    then the frozen worker is resumed (SIGCONT) and commits: the store must refuse it. Dead
    workers are replaced as they die (with the flag: no worker may finish the poison task), so
    the normal workload goes on and every other task is done once."""

    name = "poison-task"
    BUDGET = 3

    def __init__(self) -> None:
        # Its own id per run: against a deployed coordinator no other run's task is touched.
        self.task_id = f"poison-{uuid.uuid4().hex[:8]}"
        self.all_worker_flags = ("--poison", self.task_id)

    def inject(self, h: Harness) -> None:
        policy = TaskRetryPolicy(max_attempts=self.BUDGET, initial_backoff=timedelta(0))
        with h.client("operator") as operator:
            operator.create_task(self.task_id, input=b"poison", queue=h.queue, retry_policy=policy)
            self.poisoned = frozenset({self.task_id})
            # Each attempt lasts a lease and the reclaimer's scan; a few seconds more for slack.
            deadline = time.monotonic() + self.BUDGET * (PAST_TTL + 3)
            while operator.get_task(self.task_id).state is not TaskState.FAILED:
                self._replace_dead(h)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.task_id} was not dead-lettered in time")
                time.sleep(0.1)

    def heal(self, h: Harness) -> None:
        self._replace_dead(h)
        for name, proc in list(h.workers.items()):
            if stopped(proc.pid):
                proc.send_signal(signal.SIGCONT)
                late = partial(_committed, h.root / f"{name}.jsonl", self.task_id)
                wait_until(late, 30, f"{name}'s late commit")

    def _replace_dead(self, h: Harness) -> None:
        for name, proc in list(h.workers.items()):
            if proc.poll() is not None and f"{name}-again" not in h.workers:
                h.start_worker(f"{name}-again", *self.all_worker_flags)


def _claimed(history: Path) -> bool:
    """Whether ``history`` holds a claim answered CLAIMED."""
    return history.exists() and any(o.outcome is Observed.CLAIMED for o in load([history]))


def _committed(history: Path, task: str = "") -> bool:
    """Whether ``history`` holds a commit (of ``task``, if named) that completed (whatever it
    heard)."""
    return history.exists() and any(
        o.op is OpKind.COMMIT and o.end is not None and (not task or o.task == task)
        for o in load([history])
    )


FAULTS: dict[str, Callable[[], Fault]] = {
    f.name: f
    for f in (
        PauseWorker,
        KillWorkerAfterEffect,
        KillReplica,
        StopEtcdLeader,
        RestartEtcdMember,
        BumpEpoch,
        CancelRacingCommit,
        InputChangeRacingCommit,
        DuplicateRequests,
        EtcdDelay,
        EtcdDrop,
        ClockSkew,
        PartitionWorker,
        AbuseStreams,
        PoisonTask,
        AbandonPolls,
        HostileTenant,
    )
}
"""Every scenario, by name: one fault each."""
