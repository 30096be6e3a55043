"""A network namespace joined to the host by a veth pair: a process inside can be cut off.

``ip netns add`` needs CAP_SYS_ADMIN (root here); where it is refused, ``unavailable()`` says
so and the partition fault is skipped. Addresses come from 10.200.0.0/16, one /30 per
namespace (host .1, namespace .2): private, on a link that exists only on this machine, so
nothing leaves it. ``delete()`` removes the namespace and the veth pair (deleting one end of a
veth deletes both), and is safe to call twice or after a failed ``create()``.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import subprocess
import time
from collections.abc import Sequence

IP = "ip"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=10, check=check)


def unavailable() -> str:
    """Why this machine cannot make network namespaces ("" when it can)."""
    probe = f"chaos-probe-{secrets.token_hex(3)}"
    try:
        added = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` cannot run here: {exc}"
    if added.returncode != 0:
        return f"`ip netns add` is not permitted here: {added.stderr.strip() or added.returncode}"
    _ip("netns", "del", probe, check=False)
    return ""


def _taken_subnets() -> set[int]:
    out = _ip("-o", "-4", "addr", "show", check=False).stdout
    return {int(w.split(".")[2]) for w in out.split() if w.startswith("10.200.")}


class Netns:
    """One namespace, its veth pair and its /30."""

    def __init__(self) -> None:
        token = secrets.token_hex(3)
        self.name = f"chaos-{token}"
        self.host_if, self.ns_if = f"chh{token}", f"chn{token}"  # <= 15 characters
        free = sorted(set(range(1, 255)) - _taken_subnets())
        if not free:
            raise RuntimeError("no free /30 left in 10.200.0.0/16")
        subnet = random.choice(free)
        self.host_ip, self.ns_ip = f"10.200.{subnet}.1", f"10.200.{subnet}.2"
        self.created = False

    def create(self) -> Netns:
        """The namespace, the veth pair, the addresses; both ends up."""
        self.created = True  # from here on, delete() has something to clean
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        inside = ("netns", "exec", self.name, IP)
        _ip(*inside, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _ip(*inside, "link", "set", self.ns_if, "up")
        _ip(*inside, "link", "set", "lo", "up")
        self._wait_up()
        return self

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same PID)."""
        return [IP, "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Take the link down: the namespace loses its only route out."""
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        """Bring the link back up, and wait until both ends say so."""
        _ip("link", "set", self.host_if, "up")
        self._wait_up()

    def _wait_up(self, timeout: float = 10.0) -> None:
        """Until both ends of the veth are operationally up: ``ip link set up`` returns before
        the kernel has the carrier (CI once found the link still down right after a restore)."""
        deadline = time.monotonic() + timeout
        while True:
            host = _ip("-o", "link", "show", self.host_if, check=False).stdout
            inner = _ip("-n", self.name, "-o", "link", "show", self.ns_if, check=False).stdout
            if "state UP" in host and "state UP" in inner:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"veth {self.host_if} not up after {timeout} s: {host.strip()}")
            time.sleep(0.05)

    def delete(self) -> None:
        """Remove the veth pair and the namespace (idempotent)."""
        if not self.created:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("link", "del", self.host_if, check=False)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("netns", "del", self.name, check=False)
        self.created = False
