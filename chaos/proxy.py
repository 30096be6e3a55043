"""A small TCP proxy of our own in front of an etcd member, for delay and drop.

This kernel has no netem qdisc, so (as etcd's robustness tests do) faults on the wire go
through a forwarding proxy: ``delay`` holds every forwarded chunk that long; ``drop()`` closes
every open connection and refuses new ones until ``heal()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from coordinator.etcd_process import free_port


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` (``host:port``) on daemon threads."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1") -> None:
        # ``host``: where to listen (a veth address, for a worker in a network namespace).
        up_host, port = upstream.rsplit(":", 1)
        self._upstream = (up_host, int(port))
        self.host = host
        self.port = free_port(host)
        self.delay = 0.0
        self._dropping = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, self.port))
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def endpoint(self) -> str:
        """Where clients connect."""
        return f"{self.host}:{self.port}"

    def drop(self) -> None:
        """Cut every connection and refuse new ones (a partition, seen from the client)."""
        with self._lock:
            self._dropping = True
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def heal(self) -> None:
        """No delay, no drop."""
        self.delay = 0.0
        with self._lock:
            self._dropping = False

    def close(self) -> None:
        """Stop listening and cut every connection."""
        self._closed = True
        self.drop()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._dropping:
                    client.close()
                    continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
