"""Where a command's setting came from (its flag, its environment variable, the config file), so
that a refusal can say so; and, in --help, which config file key sets it where one is read.

A setting can reach a command without being typed: ``eval "$(coordinator up --print-env)"``
leaves ``COORDINATOR_INSECURE=1`` in the shell, and a later ``serve --token-file`` was refused
"insecure cannot be combined with token_file" with nothing saying where "insecure" came from.
"""

from __future__ import annotations

import re

import click
from click.core import ParameterSource


def origin(ctx: click.Context, name: str) -> str | None:
    """Where the parameter ``name`` of ``ctx``'s command got its value; None when it is the
    default (or the command has no such parameter)."""
    param = next((p for p in ctx.command.params if p.name == name), None)
    source = ctx.get_parameter_source(name)
    if param is None or source is None:
        return None
    if source is ParameterSource.ENVIRONMENT and isinstance(param, click.Option):
        return f"the environment variable {_envvar(param)}"
    if source is ParameterSource.DEFAULT_MAP:
        return "the config file (--config)"
    if source is ParameterSource.COMMANDLINE:
        return param.opts[0]
    return None


def _envvar(param: click.Option) -> str:
    envvar = param.envvar
    return envvar if isinstance(envvar, str) else " or ".join(envvar or ())


def with_origins(message: str) -> str:
    """``message`` followed by where each setting it names came from (settings left at their
    default are not listed); the message alone outside a command."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return message
    found = []
    for param in ctx.command.params:
        # A setting's name as a word: "insecure", "token_file", not "etcd" in "etcd's".
        if param.name and re.search(rf"(?<![\w'-]){re.escape(param.name)}(?![\w'-])", message):
            where = origin(ctx, param.name)
            if where is not None:
                found.append(f"{param.name} from {where}")
    return f"{message} ({'; '.join(found)})" if found else message


def config_keys(command: click.Command) -> click.Command:
    """Name each option's config file key in its --help. Only here: ``up``, ``doctor`` and
    ``etcd-auth`` share these options but read no config file, so the key would mislead there."""
    for param in command.params:
        if isinstance(param, click.Option) and param.expose_value:
            param.help = f"{param.help} Config key: {param.name}."
    return command
