"""The harness's downstream (PROTOCOL.md, op ``effect``): ``POST /send`` with
``{"slot", "payload", "task_id"}`` performs a slot's call once and remembers its answer;
``GET /lookup?slot=...`` answers it (200) or 404. It counts every call, so a scenario can
assert that a slot was sent exactly once whatever the drivers did.

A scenario can make the next send's answer get lost (``lose_next_answer``): the call is
performed and recorded, then answered 503, which the SDK must treat as "outcome unknown".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Ledger:
    """What the downstream saw, guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sends: int = 0
    performed: int = 0
    lookups: int = 0
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers_to_lose: int = 0

    def counts(self) -> dict[str, int]:
        """The counters a scenario asserts on (``downstream`` step)."""
        with self.lock:
            return {"sends": self.sends, "performed": self.performed, "lookups": self.lookups}

    def lose_next_answers(self, count: int) -> None:
        """Perform the next ``count`` sends but answer them 503, as if the answer was lost."""
        with self.lock:
            self.answers_to_lose += count


def _handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            slot = str(body.get("slot", ""))
            with ledger.lock:
                ledger.sends += 1
                answer = ledger.answers.get(slot)
                if answer is None:  # performed once per slot; a repeat gets the first answer
                    ledger.performed += 1
                    answer = {"message_id": f"msg-{ledger.performed}", "slot": slot}
                    ledger.answers[slot] = answer
                lose = ledger.answers_to_lose > 0
                ledger.answers_to_lose -= int(lose)
            self._answer(503 if lose else 200, {"lost": True} if lose else answer)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            slot = parse_qs(parts.query).get("slot", [""])[0]
            with ledger.lock:
                ledger.lookups += 1
                answer = ledger.answers.get(slot)
            if parts.path != "/lookup" or answer is None:
                self._answer(404, {"slot": slot, "performed": False})
            else:
                self._answer(200, answer)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the counts are what the test reads."""

    return Handler


@contextmanager
def serving() -> Iterator[tuple[str, Ledger]]:
    """A downstream on a free loopback port: its base URL and its ledger, until the block ends."""
    ledger = Ledger()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ledger))
    thread = threading.Thread(target=server.serve_forever, name="downstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", ledger
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
