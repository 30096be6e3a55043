"""Side effects from a claim: one call runs prepare -> execute / skip / reconcile -> record.

    from coordinator.sdk import HttpDownstream

    outbox = HttpDownstream("http://127.0.0.1:8025")
    outcome = claim.effect("notify", "welcome-email", payload, outbox)
    if outcome.status is EffectStatus.UNCERTAIN:
        ...  # nobody knows whether it happened: stop, a retry reconciles or a human approves

The effect id the coordinator returns is the idempotency key, for this attempt and every later
one: an adapter sends it with the claim generation and never invents a new key to resend. A
call whose answer is lost (a timeout, a dropped connection) is recorded UNKNOWN; a later
attempt is told to RECONCILE it - look the key up downstream - and records COMMITTED or ABSENT
from what it finds, without sending. Only ABSENT (confirmed not to have happened) lets the
holder send again, with the same key.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

from coordinator.domain.effects import EffectState
from coordinator.sdk._core.attempt import HeldAttempt
from coordinator.sdk._core.effects import (
    Call,
    Downstream,
    DownstreamRefused,
    DownstreamResult,
    DownstreamUncertain,
    EffectOutcome,
    EffectRun,
    EffectStatus,
    LookupUnsupported,
    Send,
    Step,
)
from coordinator.sdk.types import timestamp
from coordinator.v1 import types_pb2

__all__ = [
    "Downstream",
    "DownstreamRefused",
    "DownstreamResult",
    "DownstreamUncertain",
    "EffectInfo",
    "EffectOutcome",
    "EffectStatus",
    "HttpDownstream",
    "LookupUnsupported",
    "run_effect",
]

KEY_HEADER = "Idempotency-Key"
GENERATION_HEADER = "X-Fencing-Generation"


class HttpDownstream:
    """The HTTP adapter for an outbox-style service (coordinator.demo.outbox): ``POST /send`` with
    ``Idempotency-Key`` and ``X-Fencing-Generation``, ``GET /lookup/<key>``."""

    def __init__(self, base_url: str, *, timeout: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url must be http://host:port, got {base_url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self.timeout = timeout

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        """``POST /send``; 2xx is a result, 4xx a refusal, anything else is uncertain."""
        headers = {KEY_HEADER: idempotency_key, GENERATION_HEADER: str(generation)}
        status, body, etag = self._request(
            "POST", "/send", payload, headers, sent_is_uncertain=True
        )
        if 200 <= status < 300:
            return DownstreamResult(str(body.get("message_id", "")), etag)
        if 400 <= status < 500:
            raise DownstreamRefused(f"downstream refused the call: {status} {body}")
        raise DownstreamUncertain(f"downstream answered {status} {body}")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        """``GET /lookup/<key>``: 200 performed, 404 not performed, 501 cannot tell."""
        path = "/lookup/" + quote(idempotency_key, safe="")
        headers = {GENERATION_HEADER: str(generation)}
        status, body, etag = self._request("GET", path, None, headers, sent_is_uncertain=True)
        if status == 200:
            return DownstreamResult(str(body.get("message_id", "")), etag)
        if status == 404:
            return None
        if status == 501:
            raise LookupUnsupported(f"the downstream keeps no idempotent results: {body}")
        raise DownstreamUncertain(f"lookup answered {status} {body}")

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        *,
        sent_is_uncertain: bool,
    ) -> tuple[int, dict[str, object], str]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:  # never reached the downstream: nothing was performed
                raise DownstreamRefused(f"cannot connect to the downstream: {exc}") from exc
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
                raise DownstreamUncertain(f"the response was lost: {exc!r}") from exc
            try:
                parsed = json.loads(data) if data else {}
            except ValueError:
                parsed = {"raw": data[:200].decode(errors="replace")}
            return response.status, parsed, (response.getheader("ETag") or "").strip('"')
        finally:
            conn.close()


# --- what the coordinator stores -------------------------------------------------------------


@dataclass(frozen=True)
class EffectInfo:
    """One effect as the coordinator recorded it."""

    effect_id: str
    task_id: str
    task_revision: int
    node_id: str
    effect_slot: str
    payload_digest: str
    state: EffectState
    prepared_generation: int
    prepared_attempt_id: str
    reconciler_generation: int
    recorded_generation: int
    external_ref: str
    etag: str
    detail: str
    # Owned reconciliation, opened when the effect became UNKNOWN (see types.proto).
    reconcile_owner: str = ""
    reconcile_open: bool = False
    reconcile_named: bool = False
    reconcile_opened_at: datetime | None = None
    reconcile_deadline: datetime | None = None
    reconcile_escalated_at: datetime | None = None

    @classmethod
    def from_proto(cls, msg: types_pb2.Effect) -> EffectInfo:
        """Build from the wire message."""
        return cls(
            effect_id=msg.effect_id,
            task_id=msg.task_id,
            task_revision=msg.task_revision,
            node_id=msg.node_id,
            effect_slot=msg.effect_slot,
            payload_digest=msg.payload_digest,
            state=EffectState(msg.state),
            prepared_generation=msg.prepared_generation,
            prepared_attempt_id=msg.prepared_attempt_id,
            reconciler_generation=msg.reconciler_generation,
            recorded_generation=msg.recorded_generation,
            external_ref=msg.external_ref,
            etag=msg.etag,
            detail=msg.detail,
            reconcile_owner=msg.reconcile_owner,
            reconcile_open=msg.reconcile_open,
            reconcile_named=msg.reconcile_named,
            reconcile_opened_at=timestamp(msg.reconcile_opened_at),
            reconcile_deadline=timestamp(msg.reconcile_deadline),
            reconcile_escalated_at=timestamp(msg.reconcile_escalated_at),
        )


def run_effect(
    attempt: HeldAttempt,
    node_id: str,
    effect_slot: str,
    payload: bytes,
    downstream: Downstream,
    *,
    reconcile_principal: str = "",
) -> EffectOutcome:
    """Run the whole protocol for one slot (see the module doc); at most one send."""
    run = EffectRun(attempt, node_id, effect_slot, payload, reconcile_principal=reconcile_principal)
    while (step := run.step) is not None:
        with run.catching():
            run.answer(_perform(step, attempt, downstream))
    return run.outcome


def _perform(step: Step, attempt: HeldAttempt, downstream: Downstream) -> Any:
    if isinstance(step, Call):
        return attempt.call(step.method, step.request)
    if isinstance(step, Send):
        return downstream.execute(step.key, step.generation, step.payload)
    return downstream.lookup(step.key, step.generation)
