"""``coordinator effects list|show|resolve|approve``: what a human does about an uncertain effect.

``list`` prints the effects (of one task, or all; ``--open``: only the uncertain ones) a page at
a time. ``show`` prints one effect with its owned reconciliation (owner, opened-at, deadline,
whether it is still open or escalated). ``resolve`` settles an uncertain effect without a claim
(WorkerService.ResolveEffect: the reconciliation's owner, or an admin for any uncertain effect,
e.g. one of a cancelled task). ``approve`` puts a NEEDS_APPROVAL task back to READY, resolving
its uncertain effects (AdminService.ApproveRetry, admin only).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.cli import task_views as views
from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.cli.task_options import json_option
from coordinator.cli.task_views import shown
from coordinator.v1 import admin_pb2, types_pb2, worker_pb2

_RESOLUTIONS = {
    "absent": types_pb2.EFFECT_STATE_ABSENT,
    "committed": types_pb2.EFFECT_STATE_COMMITTED,
}


@click.group()
def effects() -> None:
    """Inspect and settle uncertain side effects (UNKNOWN / PREPARED)."""


def _when(ts: Timestamp) -> str:
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC).isoformat()


def _state(effect: types_pb2.Effect) -> str:
    return types_pb2.EffectState.Name(effect.state).removeprefix("EFFECT_STATE_")


def _echo(effect: types_pb2.Effect) -> None:
    click.echo(f"effect_id {effect.effect_id}")
    click.echo(f"task {effect.task_id} revision {effect.task_revision}")
    click.echo(f"slot {effect.node_id}/{effect.effect_slot}")
    click.echo(f"state {_state(effect)}")
    click.echo(shown(f"external_ref {effect.external_ref or '-'}"))
    if effect.reconcile_owner:
        status = "open" if effect.reconcile_open else "closed"
        if effect.HasField("reconcile_escalated_at"):
            status = f"escalated at {_when(effect.reconcile_escalated_at)}"
        named = " (named)" if effect.reconcile_named else ""
        click.echo(shown(f"reconcile_owner {effect.reconcile_owner}{named}"))
        click.echo(f"reconcile_opened_at {_when(effect.reconcile_opened_at)}")
        click.echo(f"reconcile_deadline {_when(effect.reconcile_deadline)}")
        click.echo(f"reconcile {status}; escalation {effect.reconcile_escalation}")
    if effect.detail:
        click.echo(shown(f"detail {effect.detail}"))


_LIST_PAGE = 1000  # ListEffects' largest page
_HEADERS = ("EFFECT", "TASK", "REV", "SLOT", "STATE", "EXTERNAL_REF", "RECONCILE")


def _row(effect: types_pb2.Effect) -> tuple[str, ...]:
    reconcile = "-"
    if effect.reconcile_owner:
        reconcile = f"{effect.reconcile_owner} ({'open' if effect.reconcile_open else 'closed'})"
    return (
        effect.effect_id,
        effect.task_id,
        str(effect.task_revision),
        f"{effect.node_id}/{effect.effect_slot}",
        _state(effect),
        effect.external_ref or "-",
        reconcile,
    )


def _list_json(effect: types_pb2.Effect) -> str:
    return json.dumps(
        {
            "effect_id": effect.effect_id,
            "task_id": effect.task_id,
            "task_revision": effect.task_revision,
            "node_id": effect.node_id,
            "effect_slot": effect.effect_slot,
            "state": _state(effect),
            "external_ref": effect.external_ref,
            "reconcile_owner": effect.reconcile_owner,
            "reconcile_open": effect.reconcile_open,
        }
    )


@effects.command("list")
@click.option("--task", "task_id", default="", help="Only this task's effects.")
@click.option(
    "--open", "only_open", is_flag=True, help="Only the uncertain ones (PREPARED / UNKNOWN)."
)
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Print at most this many (a note on stderr says when more follow).",
)
@json_option
@remote_options
def list_effects(task_id: str, only_open: bool, limit: int, as_json: bool, **settings: Any) -> None:
    """List effects by task, then effect id, whatever their state (or --open ones only)."""
    found: list[types_pb2.Effect] = []
    token = ""
    with connect(**remote_settings(settings)) as remote:
        method = remote.worker.ListOpenEffects if only_open else remote.worker.ListEffects
        kind = worker_pb2.ListOpenEffectsRequest if only_open else worker_pb2.ListEffectsRequest
        while len(found) < limit:
            size = min(_LIST_PAGE, limit - len(found))
            reply = remote.call(method, kind(task_id=task_id, page_size=size, page_token=token))
            found.extend(reply.effects)
            token = reply.next_page_token
            if not token:
                break
    if as_json:
        for effect in found:
            click.echo(_list_json(effect))
    elif found:
        views.print_table(_HEADERS, (_row(e) for e in found))
    else:
        click.echo("no effects" + (" open" if only_open else ""), err=True)
    if token:
        click.echo(f"more effects than --limit {limit}: raise it or filter by --task", err=True)


@effects.command()
@click.argument("effect_id")
@remote_options
def show(effect_id: str, **settings: Any) -> None:
    """Print one effect and its reconciliation."""
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(
            remote.worker.GetEffect, worker_pb2.GetEffectRequest(effect_id=effect_id)
        )
    _echo(reply.effect)


@effects.command()
@click.argument("effect_id")
@click.option(
    "--resolution",
    type=click.Choice(sorted(_RESOLUTIONS)),
    required=True,
    help="absent: it did not happen (the next holder sends with the same key); committed: it "
    "did (the next holder skips it).",
)
@click.option("--external-ref", default="", help="What the downstream produced (committed).")
@click.option("--reason", default="", help="Why (kept on the effect).")
@remote_options
def resolve(
    effect_id: str, resolution: str, external_ref: str, reason: str, **settings: Any
) -> None:
    """Settle an uncertain effect without a claim (reconcile owner or admin)."""
    request = worker_pb2.ResolveEffectRequest(
        effect_id=effect_id,
        resolution=_RESOLUTIONS[resolution],
        external_ref=external_ref,
        reason=reason,
    )
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.worker.ResolveEffect, request)
    _echo(reply.effect)


@effects.command()
@click.argument("task_id")
@click.option(
    "--resolution",
    type=click.Choice(sorted(_RESOLUTIONS)),
    required=True,
    help="What became of the task's uncertain effects: absent (they did not happen) or "
    "committed (they did).",
)
@click.option("--reason", default="", help="Why (in the event and on every resolved effect).")
@remote_options
def approve(task_id: str, resolution: str, reason: str, **settings: Any) -> None:
    """Approve a retry of a NEEDS_APPROVAL task: resolve its effects, READY again (admin)."""
    request = admin_pb2.ApproveRetryRequest(
        task_id=task_id, resolution=_RESOLUTIONS[resolution], reason=reason
    )
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.admin.ApproveRetry, request)
    state = types_pb2.TaskState.Name(reply.task.state).removeprefix("TASK_STATE_")
    click.echo(f"task {reply.task.task_id} {state}")
    for effect in reply.effects:
        click.echo(f"resolved {effect.effect_id}")
