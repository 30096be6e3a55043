"""A real downstream for tests and the demo: an HTTP "outbox" that pretends to send emails.

Run it as its own process (``python -m coordinator.demo.outbox --port 0`` prints its URL on the
first line of stdout), or through ``OutboxProcess``. Endpoints:

* ``POST /send`` - body: the payload; headers ``Idempotency-Key`` and ``X-Fencing-Generation``.
  With idempotency (the default) the call is *performed* once per key: a repeat with the same
  payload answers the original result (200, ``replayed``) without performing again; the same
  key with another payload is refused (422); a generation lower than one already seen for the
  key is refused (409), so a late call of a fenced owner cannot land after a takeover looked
  the key up. A performed call answers 201 with ``message_id`` (also the ETag).
* ``GET /lookup/<key>`` - whether the call of that key was performed, and its result (200) or
  not (404). A ``X-Fencing-Generation`` header raises the key's generation floor, like a send.
* ``GET /admin/counts`` - performed calls, send calls and lookups per key.
* ``POST /admin/drop`` - ``{"next": N}`` or ``{"key": K}``, ``"mode"``: ``close`` (default) or
  ``hang``: perform the call, then lose the response (close the connection without answering,
  or hold it open unanswered). Simulates a lost response.
* ``POST /admin/stall`` / ``POST /admin/release`` - ``{"key": K}``: hold the next send of a key
  *before* it is performed, until released (a call still in flight when its sender gives up);
  later sends of the key are not held.

``--no-idempotency`` is a downstream without idempotency support: every send performs (keys are
only counted), lookups answer 501. Tasks whose downstream is like this are non-replayable.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.error import HTTPError

import click

from coordinator import lifeline

KEY_HEADER = "Idempotency-Key"
GENERATION_HEADER = "X-Fencing-Generation"
# How long a hung response or a stalled send is held at most (the sender has long given up).
HOLD_SECONDS = 60.0
_KEY = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


@dataclass
class OutboxState:
    """Everything the outbox remembers; guarded by ``lock``."""

    idempotent: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)
    performed: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    lookups: Counter[str] = field(default_factory=Counter)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)
    drop_next: int = 0
    drop_keys: set[str] = field(default_factory=set)
    drop_mode: str = "close"
    # Keys whose next send is held, and the events that release held sends.
    stall_next: set[str] = field(default_factory=set)
    stalls: dict[str, threading.Event] = field(default_factory=dict)
    closing: threading.Event = field(default_factory=threading.Event)
    sent: int = 0

    def counts(self) -> dict[str, Any]:
        """The per-key counts, as ``GET /admin/counts`` answers them."""
        with self.lock:
            return {
                "idempotent": self.idempotent,
                "performed": dict(self.performed),
                "calls": dict(self.calls),
                "lookups": dict(self.lookups),
                "total_performed": sum(self.performed.values()),
            }

    def take_drop(self, key: str) -> str:
        """The drop mode if this performed call must lose its response, else ''."""
        with self.lock:
            if key in self.drop_keys:
                self.drop_keys.discard(key)
                return self.drop_mode
            if self.drop_next > 0:
                self.drop_next -= 1
                return self.drop_mode
        return ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: stdout carries only the URL line."""

    # --- routes ---------------------------------------------------------------------------

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/send":
            self._send(body)
        elif self.path in ("/admin/drop", "/admin/stall", "/admin/release"):
            self._admin(self.path.rsplit("/", 1)[1], json.loads(body or b"{}"))
        else:
            self._json(404, {"error": f"no route {self.path}"})

    def do_GET(self) -> None:
        if self.path.startswith("/lookup/"):
            self._lookup(self.path.removeprefix("/lookup/"))
        elif self.path == "/admin/counts":
            self._json(200, self.server.state.counts())
        elif self.path == "/healthz":
            self._json(200, {"ok": True})
        else:
            self._json(404, {"error": f"no route {self.path}"})

    # --- the downstream itself -------------------------------------------------------------

    def _send(self, payload: bytes) -> None:
        state = self.server.state
        key = self.headers.get(KEY_HEADER, "")
        generation = self._generation()
        if generation is None:
            return
        if state.idempotent and not _KEY.fullmatch(key):
            self._json(400, {"error": f"{KEY_HEADER} is required (1-200 of [A-Za-z0-9._:@-])"})
            return
        with state.lock:
            stall = state.stalls.get(key) if key in state.stall_next else None
            state.stall_next.discard(key)
        if stall is not None:
            stall.wait(HOLD_SECONDS)
        digest = "sha256:" + hashlib.sha256(payload).hexdigest()
        with state.lock:
            state.calls[key] += 1
            refusal = self._refusal(key, generation, digest) if state.idempotent else None
            if refusal is None:
                result = self._perform(key, generation, digest)
        if refusal is not None:  # refused, or a replay of the original result
            status, body, etag = refusal
            self._json(status, body, etag=etag)
            return
        mode = state.take_drop(key)
        if mode == "hang":
            state.closing.wait(HOLD_SECONDS)
        if mode:
            self.close_connection = True  # performed, and the answer is lost
            return
        self._json(201, {**result, "replayed": False}, etag=result["message_id"])

    def _perform(self, key: str, generation: int, digest: str) -> dict[str, Any]:
        """Send the pretend email (under the lock); returns its result."""
        state = self.server.state
        if state.idempotent:
            state.floors[key] = max(state.floors.get(key, 0), generation)
        state.performed[key] += 1
        state.sent += 1
        result = {
            "message_id": f"msg-{state.sent}",
            "key": key,
            "generation": generation,
            "payload_digest": digest,
        }
        if state.idempotent:
            state.results[key] = result
            state.digests[key] = digest
        return result

    def _refusal(
        self, key: str, generation: int, digest: str
    ) -> tuple[int, dict[str, Any], str] | None:
        """The answer of an idempotent send that must not perform (under the lock): a refusal,
        or the replay of the original result (with its ETag). None: perform it."""
        state = self.server.state
        floor = state.floors.get(key, 0)
        if generation < floor:
            stale = {"error": "stale fencing generation", "generation": generation, "floor": floor}
            return 409, stale, ""
        if key in state.results:
            if state.digests[key] != digest:
                return 422, {"error": f"{KEY_HEADER} reused with a different payload"}, ""
            original = state.results[key]
            return 200, {**original, "replayed": True}, original["message_id"]
        return None

    def _lookup(self, key: str) -> None:
        state = self.server.state
        if not state.idempotent:
            self._json(501, {"error": "this downstream keeps no idempotent results"})
            return
        generation = self._generation()
        if generation is None:
            return
        with state.lock:
            state.lookups[key] += 1
            state.floors[key] = max(state.floors.get(key, 0), generation)
            result = state.results.get(key)
        if result is None:
            self._json(404, {"performed": False, "key": key})
        else:
            self._json(200, {"performed": True, **result}, etag=result["message_id"])

    def _admin(self, action: str, body: dict[str, Any]) -> None:
        state = self.server.state
        key = str(body.get("key", ""))
        with state.lock:
            if action == "drop":
                state.drop_mode = str(body.get("mode", "close"))
                state.drop_next += int(body.get("next", 0))
                if key:
                    state.drop_keys.add(key)
            elif action == "stall":
                state.stall_next.add(key)
                state.stalls.setdefault(key, threading.Event())
            else:
                event = state.stalls.pop(key, None)
                if event is not None:
                    event.set()
        self._json(200, {"ok": True})

    # --- plumbing --------------------------------------------------------------------------

    def _generation(self) -> int | None:
        raw = self.headers.get(GENERATION_HEADER, "0")
        try:
            return int(raw)
        except ValueError:
            self._json(400, {"error": f"{GENERATION_HEADER} must be an integer, got {raw!r}"})
            return None

    def _json(self, status: int, body: dict[str, Any], *, etag: str = "") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if etag:
            self.send_header("ETag", f'"{etag}"')
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: OutboxState) -> None:
        super().__init__(address, _Handler)
        self.state = state


def make_server(host: str = "127.0.0.1", port: int = 0, *, idempotent: bool = True) -> _Server:
    """A bound (not yet serving) outbox; ``server_address`` tells the port."""
    return _Server((host, port), OutboxState(idempotent=idempotent))


class OutboxProcess:
    """``python -m coordinator.demo.outbox`` as a child process, with its admin calls."""

    def __init__(self, *, idempotent: bool = True, drop_next: int = 0) -> None:
        args = [sys.executable, "-m", "coordinator.demo.outbox", "--port", "0"]
        if not idempotent:
            args.append("--no-idempotency")
        if drop_next:
            args += ["--drop-next", str(drop_next)]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        lifeline.kill_with_parent(self.proc.pid)  # even if its starter is SIGKILLed
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the outbox did not start (printed {self.url!r})")
        # Loopback: an http_proxy from the environment must not apply.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def counts(self) -> dict[str, Any]:
        """Performed calls, send calls and lookups per key."""
        counts: dict[str, Any] = self._call("GET", "/admin/counts")
        return counts

    def performed(self, key: str) -> int:
        """How many times the call of ``key`` was performed."""
        return int(self.counts()["performed"].get(key, 0))

    def drop(self, *, next: int = 0, key: str = "", mode: str = "close") -> None:
        """Lose the response of the next ``next`` performed calls (or of ``key``'s)."""
        self._call("POST", "/admin/drop", {"next": next, "key": key, "mode": mode})

    def stall(self, key: str) -> None:
        """Hold the next send of ``key`` before performing it, until ``release``."""
        self._call("POST", "/admin/stall", {"key": key})

    def release(self, key: str) -> None:
        """Let stalled sends of ``key`` go on."""
        self._call("POST", "/admin/release", {"key": key})

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with self._opener.open(request, timeout=10) as response:
                return json.loads(response.read())
        except HTTPError as exc:
            raise RuntimeError(f"outbox {method} {path}: {exc.code} {exc.read()!r}") from exc

    def stop(self) -> None:
        """Terminate the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--no-idempotency", is_flag=True, help="Every send performs; no lookups.")
@click.option("--drop-next", type=click.IntRange(0), default=0, help="Lose these responses.")
@click.option("--drop-mode", type=click.Choice(["close", "hang"]), default="close")
def main(host: str, port: int, no_idempotency: bool, drop_next: int, drop_mode: str) -> None:
    """Serve the outbox until SIGTERM or SIGINT; print its URL first."""
    import signal

    server = make_server(host, port, idempotent=not no_idempotency)
    server.state.drop_next, server.state.drop_mode = drop_next, drop_mode

    def stop(signum: int, frame: object) -> None:
        server.state.closing.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"http://{bound_host!s}:{bound_port}", nl=True)
    sys.stdout.flush()
    server.serve_forever(poll_interval=0.2)
    server.server_close()


if __name__ == "__main__":
    main()
