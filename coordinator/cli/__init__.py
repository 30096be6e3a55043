"""The ``coordinator`` command line: ``serve``, ``up``, ``demo``, ``tasks``, ``worker``, operator
verbs.

Each command's module is imported only when that command runs (or when ``--help`` lists them
all): a remote verb such as ``coordinator tasks list`` loads the SDK and its own module, never
the server, the store or the demo, which cost about 1 s of CPU per call when every command was
imported up front (tests/test_cli_imports.py checks it).
"""

from __future__ import annotations

import importlib
from typing import cast

import click

COMMANDS = {
    "archive": "coordinator.cli.archive:archive",
    "claims": "coordinator.cli.rollback:claims",
    "console": "coordinator.cli.console:console",
    "demo": "coordinator.cli.demo:demo",
    "doctor": "coordinator.cli.doctor:doctor",
    "drain": "coordinator.cli.drain:drain",
    "effects": "coordinator.cli.effects:effects",
    "epoch": "coordinator.cli.rollback:epoch",
    "etcd-auth": "coordinator.cli.etcd_auth:etcd_auth",
    "events": "coordinator.cli.events:events",
    "jobs": "coordinator.cli.jobs:jobs",
    "serve": "coordinator.cli.serve:serve",
    "shadow": "coordinator.cli.shadow:shadow",
    "tasks": "coordinator.cli.tasks:tasks",
    "token": "coordinator.cli.tokens:token",
    "up": "coordinator.cli.up:up",
    "versions": "coordinator.cli.versions:versions",
    "worker": "coordinator.cli.worker:worker",
}
"""Every top-level command: its name and ``module:attribute``."""


class _LazyGroup(click.Group):
    """A group that imports a command's module when the command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, sorted as click lists them."""
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command named ``cmd_name``, its module imported now; None for an unknown name."""
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = COMMANDS[cmd_name].partition(":")
        return cast(click.Command, getattr(importlib.import_module(module), attribute))


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="New here? `coordinator demo` shows the fencing story in ten seconds; "
    "`coordinator up` starts a local playground (the README's quickstart goes on from there). "
    "Every command takes --help.",
)
@click.version_option(package_name="coordinator", prog_name="coordinator")
def main() -> None:
    """An etcd-backed, fenced task-claim coordinator (claim.v1)."""


__all__ = ["COMMANDS", "main"]
