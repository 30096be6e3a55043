"""The ``coordinator`` command line: ``serve``, ``up`` and ``demo``."""

from __future__ import annotations

import click

from coordinator.cli.demo import demo
from coordinator.cli.serve import serve
from coordinator.cli.up import up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="coordinator", prog_name="coordinator")
def main() -> None:
    """An etcd-backed, fenced task-claim coordinator (claim.v1)."""


main.add_command(serve)
main.add_command(up)
main.add_command(demo)

__all__ = ["main"]
