"""The Python SDK's conformance driver: ``python -m conformance.driver_py``.

Speaks conformance/PROTOCOL.md: one JSON request a line on stdin, one JSON reply a line on
stdout (plus unsolicited ``lost`` events), logs on stderr. It uses the public SDK only
(``coordinator.sdk`` and the exceptions it raises), configured from the SDK's own environment
(``COORDINATOR_TARGET``, ``COORDINATOR_TOKEN`` ...), so the env contract is exercised too; the
Python SDK takes the principal as an argument, which the driver reads from
``COORDINATOR_WORKER_ID``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import IO, Any

import structlog

from conformance.downstream_py import SlotDownstream
from coordinator.errors import (
    AlreadyExists,
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from coordinator.sdk import (
    Claim,
    ClaimLost,
    ClaimRefused,
    EffectStatus,
    FenceReason,
    LostReason,
    Outcome,
    OutcomeUnknown,
    TaskRetryPolicy,
    TransportError,
    WorkerClient,
)
from coordinator.sdk.types import NotSupported

TTL = timedelta(seconds=5)
"""The TTL of every claim a driver makes (PROTOCOL.md): short, so a harness that pauses a driver
sees its lease expire within seconds, and long enough for a loaded machine's keepalive."""

Reply = dict[str, Any]

# The SDK raises one exception class per gRPC status the server answers with.
_STATUS_OF: tuple[tuple[type[CoordinatorError], str], ...] = (
    (InvalidArgument, "INVALID_ARGUMENT"),
    (NotFound, "NOT_FOUND"),
    (AlreadyExists, "ALREADY_EXISTS"),
    (FailedPrecondition, "FAILED_PRECONDITION"),
    (PermissionDenied, "PERMISSION_DENIED"),
    (Unauthenticated, "UNAUTHENTICATED"),
    (ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (NotSupported, "UNIMPLEMENTED"),
)


def encode(value: Any) -> bytes:
    """A JSON value as the bytes the SDK sends: compact UTF-8 JSON, as JSON.stringify writes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def decode(data: bytes) -> Any:
    """Bytes the SDK received as a JSON value: null when empty, the text when not JSON."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def reason_name(lost: LostReason) -> str:
    """A loss as one name: its fence reason, else its outcome (CANCELLED, STALLED, ...)."""
    return lost.reason.name if lost.reason is not FenceReason.NONE else lost.outcome.name


def error_of(exc: Exception) -> Reply:
    """The protocol's error object for an exception the SDK raised."""
    if isinstance(exc, TransportError):
        code = exc.code
    else:
        code = next((name for kind, name in _STATUS_OF if isinstance(exc, kind)), "UNKNOWN")
    kind = next(
        (k.__name__ for k in (ClaimLost, OutcomeUnknown, TransportError) if isinstance(exc, k)),
        "RpcError" if isinstance(exc, CoordinatorError) else type(exc).__name__,
    )
    return {"code": code, "kind": kind, "message": str(exc)}


class Output:
    """stdout, one JSON object a line, written whole by one thread at a time (replies come from
    the main loop, lost events from the SDK's keepalive)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, message: Reply) -> None:
        """Write ``message`` as one line and flush it at once."""
        line = json.dumps(message, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class Driver:
    """The ops of PROTOCOL.md over one WorkerClient; claims by their driver-local names."""

    def __init__(self, client: WorkerClient, out: Output) -> None:
        self._client = client
        self._out = out
        self._claims: dict[str, Claim] = {}
        # Which name a task's claim goes by, for its lost event: the SDK names a loss by task
        # id (LostReason.task_id), and one callback serves every claim of a claim_many.
        self._names: dict[str, str] = {}
        self._names_lock = threading.Lock()
        self._ops: dict[str, Callable[[dict[str, Any]], Reply]] = {
            "create_task": self.create_task,
            "get_task": self.get_task,
            "get_result": self.get_result,
            "claim": self.claim,
            "checkpoint": self.checkpoint,
            "commit": self.commit,
            "fail": self.fail,
            "release": self.release,
            "effect": self.effect,
            "wait_lost": self.wait_lost,
            "held": self.held,
        }

    def handle(self, request: dict[str, Any]) -> Reply:
        """The reply to one request (without its id)."""
        op = self._ops.get(str(request.get("op")))
        if op is None:
            error = {"code": "UNIMPLEMENTED", "kind": "Driver", "message": f"no op {request!r}"}
            return {"ok": False, "error": error}
        try:
            return {"ok": True, **op(request)}
        except Exception as exc:  # the protocol reports every SDK error as a reply
            return {"ok": False, "error": error_of(exc)}

    # --- producer calls -----------------------------------------------------------------

    def create_task(self, args: dict[str, Any]) -> Reply:
        """create_task {queue, input, task_id?, max_attempts?} -> {task_id}"""
        attempts = args.get("max_attempts")
        task = self._client.create_task(
            args.get("task_id", ""),
            input=encode(args.get("input")),
            queue=args["queue"],
            retry_policy=TaskRetryPolicy(max_attempts=attempts) if attempts else None,
        )
        return {"task_id": task.task_id}

    def get_task(self, args: dict[str, Any]) -> Reply:
        """get_task {task_id} -> {state, attempts}"""
        task = self._client.get_task(args["task_id"])
        return {"state": task.state.name, "attempts": task.attempt}

    def get_result(self, args: dict[str, Any]) -> Reply:
        """get_result {task_id} -> {result}: null for a task without a committed result,
        NOT_FOUND for a task that does not exist."""
        try:
            return {"result": decode(self._client.get_result(args["task_id"]).result)}
        except NotFound:
            self._client.get_task(args["task_id"])  # NotFound: no such task at all
            return {"result": None}

    # --- claims -------------------------------------------------------------------------

    def claim(self, args: dict[str, Any]) -> Reply:
        """claim {queue, as, task_id?, wait_s?, max_tasks?} -> {claims: [...]}"""
        name, on_lost = args["as"], self._lost
        won: Claim | list[Claim] | ClaimRefused
        if "task_id" in args:
            won = self._client.claim(args["task_id"], ttl=TTL, on_lost=on_lost)
        elif args.get("max_tasks", 1) > 1:
            won = self._client.claim_many(
                args["queue"],
                ttl=TTL,
                max_tasks=args["max_tasks"],
                wait=args.get("wait_s"),
                on_lost=on_lost,
            )
        else:
            wait = args.get("wait_s")
            won = self._client.claim_next(args["queue"], ttl=TTL, wait=wait, on_lost=on_lost)
        claims = [] if isinstance(won, ClaimRefused) else won if isinstance(won, list) else [won]
        return {"claims": self._hold(name, claims)}

    def _hold(self, name: str, claims: list[Claim]) -> list[Reply]:
        """Start each claim's keepalive and name it: ``name``, then ``name.1``, ``name.2`` ..."""
        held = []
        for index, claim in enumerate(claims):
            local = name if index == 0 else f"{name}.{index}"
            with self._names_lock:
                self._names[claim.task_id] = local
            self._claims[local] = claim.start()
            held.append(
                {
                    "as": local,
                    "task_id": claim.task_id,
                    "generation": claim.generation,
                    "input": decode(claim.input),
                    "checkpoint": decode(claim.previous_checkpoint),
                }
            )
        return held

    def _lost(self, reason: LostReason) -> None:
        """on_lost of every claim: the protocol's lost event, as soon as the SDK knows."""
        with self._names_lock:
            name = self._names.get(reason.task_id, reason.task_id)
        self._out.write({"event": "lost", "claim": name, "reason": reason_name(reason)})

    def checkpoint(self, args: dict[str, Any]) -> Reply:
        """checkpoint {claim, data} -> {} (the next renewal carries it)"""
        self._claims[args["claim"]].checkpoint(encode(args["data"]))
        return {}

    def commit(self, args: dict[str, Any]) -> Reply:
        """commit {claim, result, next_queue?} -> {outcome, reason?, next?}"""
        name, claim = args["claim"], self._claims[args["claim"]]
        if "next_queue" in args:
            outcome, more = claim.commit_and_next(
                encode(args["result"]), queue=args["next_queue"], ttl=TTL, on_lost=self._lost
            )
            reply = _outcome(outcome.outcome, outcome.reason)
            return {**reply, "next": self._hold(f"{name}.next", more)}
        outcome = claim.commit(encode(args["result"]))
        return _outcome(outcome.outcome, outcome.reason)

    def fail(self, args: dict[str, Any]) -> Reply:
        """fail {claim, error, retryable} -> {outcome, reason?}"""
        claim = self._claims[args["claim"]]
        failed = claim.fail(str(args["error"]), retryable=bool(args["retryable"]))
        return _outcome(failed.outcome, failed.reason)

    def release(self, args: dict[str, Any]) -> Reply:
        """release {claim} -> {outcome}"""
        released = self._claims[args["claim"]].release()
        return _outcome(released.outcome, released.reason)

    def effect(self, args: dict[str, Any]) -> Reply:
        """effect {claim, slot, payload, downstream_url} -> {outcome, sent, reconciled}"""
        claim = self._claims[args["claim"]]
        downstream = SlotDownstream(args["downstream_url"], args["slot"], claim.task_id)
        payload = encode(args["payload"])
        done = claim.effect("conformance", args["slot"], payload, downstream)
        outcome = Outcome.PAYLOAD_CONFLICT if done.conflict else done.outcome
        return {
            **_outcome(outcome, done.reason),
            "sent": done.sent,
            "reconciled": done.status is EffectStatus.RECONCILED,
        }

    def wait_lost(self, args: dict[str, Any]) -> Reply:
        """wait_lost {claim, timeout_s} -> {lost, reason?}"""
        claim = self._claims[args["claim"]]
        if not claim.wait_lost(args["timeout_s"]):
            return {"lost": False}
        reason = claim.lost_reason
        return {"lost": True, **({"reason": reason_name(reason)} if reason else {})}

    def held(self, args: dict[str, Any]) -> Reply:
        """held {} -> {claims: [names of the claims neither ended nor lost]}"""
        live = [name for name, claim in self._claims.items() if claim.keepalive_wanted()]
        return {"claims": sorted(live)}


def _outcome(outcome: Outcome, reason: FenceReason) -> Reply:
    return {"outcome": outcome.name, **({"reason": reason.name} if reason.value else {})}


def serve(lines: IO[str], out: Output, client: WorkerClient) -> None:
    """Answer requests until EOF or ``exit``; held claims are left as they are (not released)."""
    driver = Driver(client, out)
    for line in lines:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "exit":
            out.write({"id": request.get("id"), "ok": True})
            return
        out.write({"id": request.get("id"), **driver.handle(request)})


def main() -> int:
    """Run the driver on stdin/stdout; exit 0 on EOF or ``exit``."""
    # The SDK logs with structlog, whose default printer writes to stdout: the protocol keeps
    # stdout for replies and events.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    out = Output(sys.stdout)
    principal = os.environ.get("COORDINATOR_WORKER_ID") or f"conformance-py-{os.getpid()}"
    client = WorkerClient(principal=principal)
    try:
        serve(sys.stdin, out, client)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
