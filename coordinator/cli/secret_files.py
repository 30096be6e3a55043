"""Secrets from files: every secret option also reads the file its ``<ENVVAR>_FILE`` names.

Kubernetes mounts a Secret as files; a secret in an environment variable shows in the pod
spec's env, in ``/proc/<pid>/environ`` and in crash reports, so the chart passes paths
(``COORDINATOR_TOKEN_FILE``, ``COORDINATOR_ETCD_PASSWORD_FILE``, ...). Precedence: the flag,
then the variable itself, then the file its ``_FILE`` twin names, then a config file's value.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource


def secret_from_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: the option's value as given (flag or its own variable), else the
    contents of the file ``<ENVVAR>_FILE`` names (stripped), else the value from a config file
    or the default. An unreadable file is a usage error naming the variable and the path."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    given = source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    if given or not isinstance(param.envvar, str):
        return value
    variable = f"{param.envvar}_FILE"  # an environment variable: it beats the config file
    path = os.environ.get(variable)
    if not path:
        return value
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.BadParameter(f"{variable}: cannot read {path!r}: {exc}", ctx=ctx) from exc
