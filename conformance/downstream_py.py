"""The conformance downstream as the Python SDK sees it (PROTOCOL.md, op ``effect``): a
``coordinator.sdk.Downstream`` whose send POSTs ``{"slot", "payload", "task_id"}`` to
``<url>/send`` and whose lookup GETs ``<url>/lookup?slot=...``; the harness serves the URL and
counts the calls. Every send carries the SDK's key and fence as the HTTP adapter's headers do."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote

from coordinator.sdk import DownstreamRefused, DownstreamResult, DownstreamUncertain
from coordinator.sdk.effects import GENERATION_HEADER, KEY_HEADER

TIMEOUT = 5.0
"""Seconds a call to the downstream may take before its outcome counts as unknown."""

# The downstream is the harness's, on loopback: never route it through a proxy from the
# environment ($http_proxy), which urllib honours by default.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SlotDownstream:
    """One effect slot of one task at the harness's downstream."""

    def __init__(self, url: str, slot: str, task_id: str) -> None:
        self._url = url.rstrip("/")
        self._slot = slot
        self._task_id = task_id

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        """POST /send: 2xx performed, 4xx refused (not performed), anything else unknown."""
        body = {"slot": self._slot, "payload": json.loads(payload), "task_id": self._task_id}
        request = urllib.request.Request(
            self._url + "/send",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                KEY_HEADER: idempotency_key,
                GENERATION_HEADER: str(generation),
            },
        )
        status, answer = _call(request, sent=True)
        if 200 <= status < 300:
            return DownstreamResult(str(answer.get("message_id", "")))
        if 400 <= status < 500:
            raise DownstreamRefused(f"the downstream refused the send: {status} {answer}")
        raise DownstreamUncertain(f"the downstream answered {status} {answer}")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        """GET /lookup?slot=...: 200 performed (its answer), 404 never performed."""
        request = urllib.request.Request(
            f"{self._url}/lookup?slot={quote(self._slot)}",
            headers={GENERATION_HEADER: str(generation)},
        )
        status, answer = _call(request, sent=False)
        if status == 200:
            return DownstreamResult(str(answer.get("message_id", "")))
        if status == 404:
            return None
        raise DownstreamUncertain(f"the lookup answered {status} {answer}")


def _call(request: urllib.request.Request, *, sent: bool) -> tuple[int, dict[str, object]]:
    """The status and JSON body of one call; a send whose answer was lost is uncertain."""
    try:
        with _OPENER.open(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as answered:
        return answered.code, json.loads(answered.read() or b"{}")
    except OSError as exc:
        if sent:
            raise DownstreamUncertain(f"the send's answer was lost: {exc!r}") from exc
        raise DownstreamUncertain(f"the lookup was not answered: {exc!r}") from exc
