"""The fault interface every scenario's fault implements (chaos/faults.py lists them), and the
wait they share."""

from __future__ import annotations

import time
from collections.abc import Callable

from chaos.harness import Harness


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
    skews: tuple[str, ...] = ()  # libfaketime offsets for replicas and workers (clock skew)
    partition = False  # w0 runs in a network namespace of its own (chaos/netns.py)
    replica_flags: tuple[str, ...] = ()  # more `coordinator serve` options for the replicas
    local_only = ""  # why it must not run against a deployed coordinator ("" : it may)
    poisoned: frozenset[str] = frozenset()  # tasks it made poison: each must be dead-lettered

    def available(self) -> str:
        """Empty when this machine can run the fault; else the reason it cannot."""
        return ""

    def inject(self, h: Harness) -> None:
        """Put the fault in place."""

    def heal(self, h: Harness) -> None:
        """Undo it."""
