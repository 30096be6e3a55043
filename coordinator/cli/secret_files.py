"""Secrets from files: a secret option also reads the file a second variable names.

Kubernetes mounts a Secret as files; a secret in an environment variable shows in the pod
spec's env, in ``/proc/<pid>/environ`` and in crash reports, so the chart passes paths
(``COORDINATOR_CLIENT_TOKEN_FILE``, ``COORDINATOR_ETCD_PASSWORD_FILE``, ...). Precedence: the
flag, then the option's own variable, then the file, then a config file's value.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click
from click.core import ParameterSource

Callback = Callable[[click.Context, click.Parameter, "str | None"], "str | None"]


def secret_from_file(variable: str) -> Callback:
    """A click callback: the option's value as given (flag or its own variable), else the
    contents of the file the environment variable ``variable`` names (stripped), else the value
    from a config file or the default. An unreadable file is a usage error naming the variable
    and the path."""

    def read(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            return value
        path = os.environ.get(variable)  # an environment variable: it beats the config file
        if not path:
            return value
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise click.BadParameter(f"{variable}: cannot read {path!r}: {exc}", ctx=ctx) from exc

    return read
