"""The ``coordinator`` command line: ``serve``, ``up``, ``demo``, ``tasks``, ``worker``, operator
verbs."""

from __future__ import annotations

import click

from coordinator.cli.archive import archive
from coordinator.cli.console import console
from coordinator.cli.demo import demo
from coordinator.cli.doctor import doctor
from coordinator.cli.drain import drain
from coordinator.cli.effects import effects
from coordinator.cli.etcd_auth import etcd_auth
from coordinator.cli.events import events
from coordinator.cli.jobs import jobs
from coordinator.cli.rollback import claims, epoch
from coordinator.cli.serve import serve
from coordinator.cli.shadow import shadow
from coordinator.cli.tasks import tasks
from coordinator.cli.tokens import token
from coordinator.cli.up import up
from coordinator.cli.versions import versions
from coordinator.cli.worker import worker


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="New here? `coordinator demo` shows the fencing story in ten seconds; "
    "`coordinator up` starts a local playground (the README's quickstart goes on from there). "
    "Every command takes --help.",
)
@click.version_option(package_name="coordinator", prog_name="coordinator")
def main() -> None:
    """An etcd-backed, fenced task-claim coordinator (claim.v1)."""


main.add_command(serve)
main.add_command(up)
main.add_command(demo)
main.add_command(events)
main.add_command(doctor)
main.add_command(claims)
main.add_command(epoch)
main.add_command(drain)
main.add_command(token)
main.add_command(versions)
main.add_command(shadow)
main.add_command(effects)
main.add_command(jobs)
main.add_command(etcd_auth)
main.add_command(tasks)
main.add_command(console)
main.add_command(archive)
main.add_command(worker)

__all__ = ["main"]
