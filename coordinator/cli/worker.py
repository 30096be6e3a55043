"""``coordinator worker module:function``: run a handler as a WorkerPool until SIGTERM.

The process a Kubernetes worker pool runs: one connection, ``--max-concurrent`` claims over
the ``--queue``s (``--slots N``: N claims at once, filled by one ClaimNext for all free slots,
each commit claiming its slot's next task in the same call), a readiness file (and optionally
an HTTP endpoint) while it claims. SIGTERM stops claiming at once, lets running handlers finish
for ``--grace`` seconds (default: the chart's ``COORDINATOR_SHUTDOWN_GRACE``), gives back what
is left and exits 0, so the pod's ``terminationGracePeriodSeconds`` must exceed the grace plus
GIVE_BACK_TIMEOUT (10 s).

Target and credentials are those of every remote verb (cli/remote.py); with ``--insecure``,
``--principal`` names the worker.
"""

from __future__ import annotations

import importlib
import os
import sys
from datetime import timedelta
from typing import Any

import click
import grpc
import structlog

from coordinator.cli.ready_http import ReadyEndpoint
from coordinator.cli.remote import channel_credentials, remote_options_as, remote_settings
from coordinator.errors import CoordinatorError
from coordinator.logging import LEVELS, configure_logging
from coordinator.sdk import WorkerClient
from coordinator.sdk.pool import (
    MAX_CLAIM_BATCH,
    MAX_CONCURRENT,
    Handler,
    MultiSlot,
    WorkerPool,
    stop_on_signals,
)
from coordinator.sdk.readiness import Readiness, ReadyFile

log = structlog.get_logger(__name__)


def load_handler(spec: str) -> Handler:
    """The function ``module:function`` names (the current directory is importable, as with
    ``python -m``); a usage error if it cannot be found or called."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise click.BadParameter(
            f"expected MODULE:FUNCTION, got {spec!r}", param_hint="MODULE:FUNCTION"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="MODULE:FUNCTION"
        ) from exc
    handler = getattr(module, name, None)
    if not callable(handler):
        raise click.BadParameter(
            f"{module_name!r} has no function {name!r}", param_hint="MODULE:FUNCTION"
        )
    return handler  # type: ignore[no-any-return]


@click.command()
@click.argument("handler", metavar="MODULE:FUNCTION")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    envvar="COORDINATOR_QUEUE",
    show_envvar=True,
    help="A queue to claim from (repeat for several; the env var: separated by spaces).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(1, MAX_CONCURRENT),
    default=1,
    show_default=True,
    help="Claims held at once by this process, each handler on its own thread.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    envvar="COORDINATOR_SHUTDOWN_GRACE",
    show_envvar=True,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help=(
        "After SIGTERM, how long running handlers may finish before their claims are given "
        "back (uncounted); a second SIGTERM or SIGINT gives them back at once."
    ),
)
@click.option(
    "--ttl",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    metavar="SECONDS",
    help="Lease TTL of each claim (renewed at a third of it while the handler runs).",
)
@click.option(
    "--ready-file",
    envvar="COORDINATOR_READY_FILE",
    show_envvar=True,
    default=None,
    metavar="PATH",
    help="A file that exists exactly while the worker claims (removed on SIGTERM, and while "
    "every slot is held by a handler that outlived its lost claim).",
)
@click.option(
    "--ready-listen",
    default=None,
    metavar="HOST:PORT",
    help="Also answer HTTP GETs here: 200 while claiming, 503 once stopping (or while every "
    "slot is held by a handler that outlived its lost claim).",
)
@click.option(
    "--claim-batch",
    type=click.IntRange(1, MAX_CLAIM_BATCH),
    default=1,
    show_default=True,
    help="Claim up to this many tasks in one call when as many claims are free.",
)
@click.option(
    "--commit-then-next",
    is_flag=True,
    help="Claim the next task in the same call as each commit (one call a task when busy).",
)
@click.option(
    "--slots",
    type=click.IntRange(1, MAX_CONCURRENT),
    default=None,
    help="Run this many tasks at once as a multi-slot worker: one ClaimNext claims for every "
    "free slot and each commit claims its slot's next task in the same call (sets "
    "--max-concurrent, --claim-batch and --commit-then-next; give those or this).",
)
@click.option(
    "--log-level",
    type=click.Choice(LEVELS),
    default="info",
    show_default=True,
    help="Lowest level written to stderr (JSON lines).",
)
@remote_options_as("worker")
def worker(
    handler: str,
    queues: tuple[str, ...],
    max_concurrent: int,
    grace: float,
    ttl: int,
    ready_file: str | None,
    ready_listen: str | None,
    claim_batch: int,
    commit_then_next: bool,
    slots: int | None,
    log_level: str,
    **settings: Any,
) -> None:
    """Run the handler MODULE:FUNCTION over the --queue(s) until SIGTERM, then shut down
    within --grace (a second signal: at once). It is called with the Claim and a Cancellation;
    what it returns is committed, an exception it raises reports a retryable failure."""
    configure_logging(log_level)
    options = _slot_options(slots, MultiSlot(max_concurrent, claim_batch, commit_then_next))
    function = load_handler(handler)
    if not queues:
        raise click.UsageError("give at least one --queue (or COORDINATOR_QUEUE)")
    remote = remote_settings(settings)
    credentials = _credentials(remote)
    readiness: list[Readiness] = [ReadyFile(ready_file)] if ready_file else []
    endpoint = ReadyEndpoint(ready_listen) if ready_listen else None
    if endpoint is not None:
        readiness.append(endpoint)
    try:
        with WorkerClient(
            remote["target"],
            principal=remote["principal"],
            credentials=credentials,
            token=remote["token"],
            channel_options=[("grpc.enable_http_proxy", 0)],
        ) as client:
            _kill_orphans(client)
            pool = WorkerPool(
                client,
                function,
                queues=queues,
                max_concurrent=options.max_concurrent,
                ttl=timedelta(seconds=ttl),
                grace=timedelta(seconds=grace),
                readiness=readiness,
                claim_batch=options.claim_batch,
                commit_then_next=options.commit_then_next,
            )
            restore = stop_on_signals(pool)
            try:
                pool.run()
            finally:
                restore()
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if endpoint is not None:
            endpoint.close()


def _kill_orphans(client: WorkerClient) -> None:
    """Kill what a predecessor killed while its managed jobs ran left running, once their
    attempts are superseded (a later start kills the rest). A coordinator not reachable yet
    does not stop the worker: its pool waits for one as it always did."""
    try:
        client.kill_orphans()
    except CoordinatorError as exc:
        log.warning("orphaned jobs not looked for", error=str(exc))


def _slot_options(slots: int | None, given: MultiSlot) -> MultiSlot:
    """The pool's options: ``--slots``' if given, else the three flags' (a usage error if both
    were given: which one meant what would be a guess)."""
    if slots is None:
        return given
    context = click.get_current_context()
    for name in ("max_concurrent", "claim_batch", "commit_then_next"):
        if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"--slots sets {flag} itself: give one or the other")
    return MultiSlot.of(slots)


def _credentials(remote: dict[str, Any]) -> grpc.ChannelCredentials | None:
    """The channel credentials the connection options ask for (None: plaintext)."""
    return channel_credentials(
        token=remote["token"],
        ca=remote["ca"],
        cert=remote["cert"],
        key=remote["key"],
        insecure=remote["insecure"],
    )
