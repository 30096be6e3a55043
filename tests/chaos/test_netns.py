"""The partition's network namespace: reachable through its veth, cut, restored, cleaned up."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from chaos import netns
from chaos.harness import Harness
from chaos.netns import Netns
from tests.helpers import eventually

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "-")

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
"""


def _names() -> tuple[str, str]:
    spaces = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    return spaces, links


def _reaches(ns: Netns, host: str, port: int) -> bool:
    argv = ns.command([sys.executable, "-c", _CONNECT, host, str(port)])
    return subprocess.run(argv, capture_output=True, timeout=20, check=False).returncode == 0


def test_a_process_in_the_namespace_is_cut_off_and_restored_and_all_is_removed() -> None:
    ns = Netns().create()
    try:
        listener = socket.create_server((ns.host_ip, 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert _reaches(ns, ns.host_ip, port)
        assert not _reaches(ns, "127.0.0.1", port)  # its loopback is its own
        ns.cut()
        assert not _reaches(ns, ns.host_ip, port)
        ns.restore()
        # Restored: reachable again, as a client that retries finds it (the first SYN may meet
        # a neighbour entry the cut left failed).
        eventually(lambda: _reaches(ns, ns.host_ip, port), timeout=15, message="not restored")
        listener.close()
        spaces, links = _names()
        assert ns.name in spaces and ns.host_if in links
        assert ns.host_ip.startswith("10.200.") and ns.ns_ip.startswith("10.200.")
    finally:
        ns.delete()
    spaces, links = _names()
    assert ns.name not in spaces and ns.host_if not in links
    ns.delete()  # idempotent


def test_the_harness_removes_its_namespace_even_when_stopping_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, partitioned=True)
    assert h.netns is not None
    h.netns.create()

    def broken() -> None:
        raise RuntimeError("etcd would not stop")

    monkeypatch.setattr(h.cluster, "stop", broken)
    with pytest.raises(RuntimeError, match="would not stop"):
        h.close()
    spaces, links = _names()
    assert h.netns.name not in spaces and h.netns.host_if not in links
