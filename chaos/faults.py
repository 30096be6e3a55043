"""Faults: small classes with ``name``, ``available``, ``inject`` and ``heal``.

``worker_flags`` are passed to the first worker of a scenario (the worker acts out the precise
moment: it stops or kills itself right after its downstream call); ``all_worker_flags`` go to
every worker. ``inject`` returns once the fault is in place; ``heal`` undoes it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Callable

from chaos.cluster import Member
from chaos.harness import TTL, Harness, stopped
from coordinator.errors import FailedPrecondition
from coordinator.sdk import TaskState

PAST_TTL = 2 * TTL + 1.5
"""How long a pause lasts: past the lease TTL and the reclaimer's scan."""


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until true; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Fault:
    """The interface: inject, heal, name, available."""

    name = "none"
    proxied = False  # replicas reach etcd through chaos/proxy.py
    server_side = False  # needs the coordinator's or etcd's processes (not with --target)
    worker_flags: tuple[str, ...] = ()
    all_worker_flags: tuple[str, ...] = ()

    def available(self) -> str:
        """Empty when this machine can run the fault; else the reason it cannot."""
        return ""

    def inject(self, h: Harness) -> None:
        """Put the fault in place."""

    def heal(self, h: Harness) -> None:
        """Undo it."""


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
    """The scheduler epoch bumped while commits are in flight: old claims are fenced."""

    name = "epoch-bump"

    def inject(self, h: Harness) -> None:
        with h.client("operator") as admin:
            admin.bump_epoch()


class CancelRacingCommit(Fault):
    """Held tasks cancelled while their holders are about to commit (a few, within a TTL)."""

    name = "cancel-race"
    WANTED = 3

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def inject(self, h: Harness) -> None:
        deadline = time.monotonic() + TTL
        with h.client("operator") as admin:
            while len(self.cancelled) < self.WANTED and time.monotonic() < deadline:
                for task in admin.list_tasks(queue=h.queue, state=TaskState.CLAIMED):
                    # It may have committed since the listing: refused, as it should be.
                    with contextlib.suppress(FailedPrecondition):
                        admin.cancel_task(task.task_id, reason="chaos")
                        self.cancelled.append(task.task_id)
                time.sleep(0.01)


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
    """Workers and coordinators with a clock minutes off (libfaketime): must change nothing."""

    name = "clock-skew"

    def available(self) -> str:
        if not shutil.which("faketime"):
            return "faketime (libfaketime) is not installed (apt-get install faketime)"
        # Tried: with libfaketime 0.9.10 preloaded, Python's timed waits (threading.Event.wait)
        # hang, and with FAKETIME_DONT_FAKE_MONOTONIC=1 time.sleep raises EINVAL; the SDK's
        # keepalive and gRPC both rely on them, so a skewed run would test libfaketime.
        return "libfaketime breaks Python's timed waits here (Event.wait hangs, sleep EINVAL)"


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
        DuplicateRequests,
        EtcdDelay,
        EtcdDrop,
        ClockSkew,
    )
}
"""Every scenario, by name: one fault each."""
