"""The actions a person takes, each one existing RPC made with their own credentials: accept or
reject a reviewed revision, approve a NEEDS_APPROVAL task's retry, resolve an uncertain effect,
preview or retry a queue's dead letters.

What the server answers is what the person sees: the typed outcome on success, the status code
and message on a refusal (an old revision's FAILED_PRECONDITION, a worker's PERMISSION_DENIED).
Each form carries an idempotency key, so a double submission applies once."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from starlette.requests import Request

from coordinator.console.session import Flash
from coordinator.console.views import name
from coordinator.domain.when import parse_since
from coordinator.errors import InvalidArgument
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2, worker_pb2

RETRY_PAGE = 100
"""Dead letters one press of the console's Retry sends back (press again for the next ones)."""
_NAMED = 20  # task ids a flash names before it says how many more

_RESOLUTIONS = {
    "absent": types_pb2.EFFECT_STATE_ABSENT,
    "committed": types_pb2.EFFECT_STATE_COMMITTED,
}


def _revision(form: Mapping[str, str]) -> int:
    text = form.get("revision", "")
    if not text.isdigit() or len(text) > 18:
        raise InvalidArgument(f"revision must be a positive number, got {text[:20]!r}")
    return int(text)


def _resolution(form: Mapping[str, str]) -> types_pb2.EffectState.ValueType:
    value = _RESOLUTIONS.get(form.get("resolution", ""))
    if value is None:
        raise InvalidArgument(
            "choose what happened downstream: committed (it happened: skip it) or absent "
            "(it did not: send again); nothing was changed"
        )
    return value


def accept(request: Request, form: Mapping[str, str], rpc: Rpc) -> Flash:
    """TaskService.Accept of the revision the form showed."""
    task_id, revision = request.path_params["task_id"], _revision(form)
    reply = rpc.call(
        rpc.tasks.Accept,
        tasks_pb2.AcceptRequest(task_id=task_id, revision=revision),
        idempotency_key=form.get("idem", ""),
    )
    return Flash(
        ok=True,
        text=f"accepted revision {revision} of {task_id}: now {name(reply.task.state, 'state')}",
    )


def reject(request: Request, form: Mapping[str, str], rpc: Rpc) -> Flash:
    """TaskService.Reject of the revision the form showed (a new round opens)."""
    task_id, revision = request.path_params["task_id"], _revision(form)
    reply = rpc.call(
        rpc.tasks.Reject,
        tasks_pb2.RejectRequest(task_id=task_id, revision=revision, reason=form.get("reason", "")),
        idempotency_key=form.get("idem", ""),
    )
    task = reply.task
    return Flash(
        ok=True,
        text=f"rejected revision {revision} of {task_id}: revision {task.revision} is "
        f"{name(task.state, 'state')}",
    )


def approve(request: Request, form: Mapping[str, str], rpc: Rpc) -> Flash:
    """AdminService.ApproveRetry: resolve the task's uncertain effects, READY again."""
    task_id = request.path_params["task_id"]
    reply = rpc.call(
        rpc.admin.ApproveRetry,
        admin_pb2.ApproveRetryRequest(
            task_id=task_id, resolution=_resolution(form), reason=form.get("reason", "")
        ),
        idempotency_key=form.get("idem", ""),
    )
    return Flash(
        ok=True,
        text=f"approved a retry of {task_id}: now {name(reply.task.state, 'state')}, "
        f"{len(reply.effects)} effect(s) resolved",
    )


def resolve(request: Request, form: Mapping[str, str], rpc: Rpc) -> Flash:
    """WorkerService.ResolveEffect (the reconciliation's owner, or an admin)."""
    effect_id = request.path_params["effect_id"]
    reply = rpc.call(
        rpc.worker.ResolveEffect,
        worker_pb2.ResolveEffectRequest(
            effect_id=effect_id,
            resolution=_resolution(form),
            external_ref=form.get("external_ref", ""),
            reason=form.get("reason", ""),
        ),
    )
    return Flash(
        ok=True, text=f"effect {effect_id[:16]}… is now {name(reply.effect.state, 'effect')}"
    )


def retry_failed(request: Request, form: Mapping[str, str], rpc: Rpc) -> Flash:
    """TaskService.RetryTasks on the queue's FAILED tasks that match the form's filters, one
    bounded page; with ``dry_run`` only what would be retried. Pressing again goes on: the
    retried tasks no longer match."""
    queue = request.path_params["queue"]
    dry_run = bool(form.get("dry_run"))
    retry = tasks_pb2.RetryTasksRequest(
        queue=queue,
        state=types_pb2.TASK_STATE_FAILED,
        error_code=form.get("error_code", "").strip(),
        limit=RETRY_PAGE,
        dry_run=dry_run,
        reason=form.get("reason", ""),
    )
    since = form.get("since", "").strip()
    if since:
        retry.failed_since.FromDatetime(parse_since(since, datetime.now(UTC)))
    # Only a real retry carries the form's key (a double submission applies once); a preview
    # writes nothing, and the page it leads to renders a fresh key for the Retry after it.
    key = "" if dry_run else form.get("idem", "")
    reply = rpc.call(rpc.tasks.RetryTasks, retry, idempotency_key=key)
    verb = "would retry" if dry_run else "retried"
    ids = list(reply.retried)
    named = ", ".join(ids[:_NAMED]) + (
        f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else ""
    )
    text = f"{verb} {len(ids)} dead letter(s) of {queue}" + (f": {named}" if ids else "")
    if reply.skipped:
        first = reply.skipped[0]
        text += f"; skipped {len(reply.skipped)} ({first.task_id}: {first.reason})"
    if reply.next_page_token:
        text += "; more may match: press again to go on"
    return Flash(ok=True, text=text)
