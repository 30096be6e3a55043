"""The options several commands share, and the helpers every setting's option is built with.

Each option is a flag (``--max-ttl``), an environment variable (``COORDINATOR_MAX_TTL``) and, for
``serve``, a key of its TOML config file; ``serve`` lists them all (cli/serve_options.py),
``up`` the claim bounds, ``doctor`` and ``etcd-auth`` the etcd connection's security.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from coordinator.cli.secret_files import secret_from_file
from coordinator.config import Config
from coordinator.logging import LEVELS

F = TypeVar("F", bound=Callable[..., Any])

DEFAULTS = Config()
"""Every setting's default, shown by --help."""


def option(name: str, *, help: str, **kwargs: Any) -> Callable[[F], F]:
    """``--name``, also read from ``COORDINATOR_NAME`` (--help shows both; ``serve`` adds its
    config key, see ``config_keys``)."""
    key = name.replace("-", "_")
    envvar = "COORDINATOR_" + key.upper()
    kwargs.setdefault("show_default", kwargs.get("default") not in (None, False))
    return click.option(
        f"--{name}",
        key,
        envvar=envvar,
        show_envvar=True,
        help=help,
        **kwargs,
    )


def file_option(name: str, help: str) -> Callable[[F], F]:
    """``--name FILE`` (a path; default: none)."""
    return option(name, default=None, metavar="FILE", help=help)


def seconds_option(name: str, default: float, help: str, *, zero: bool = False) -> Callable[[F], F]:
    """``--name SECONDS``, > 0 (``zero``: >= 0)."""
    return option(
        name,
        type=click.FloatRange(min=0, min_open=not zero),
        default=default,
        metavar="SECONDS",
        help=help,
    )


def apply(func: F, options: Sequence[Callable[[F], F]]) -> F:
    """``func`` with ``options`` applied bottom-up, so --help lists them top-down in order."""
    for decorate in reversed(options):
        func = decorate(func)
    return func


_LIMIT_OPTIONS: list[Callable[[F], F]] = [
    option(
        "min-ttl",
        type=click.IntRange(min=1),
        default=DEFAULTS.min_ttl,
        metavar="SECONDS",
        help="Smallest lease TTL granted to a claim.",
    ),
    option(
        "max-ttl",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_ttl,
        metavar="SECONDS",
        help="Largest lease TTL granted to a claim.",
    ),
    seconds_option(
        "max-claim-duration",
        DEFAULTS.max_claim_duration,
        "No renewal past claim start + this.",
    ),
    seconds_option(
        "stall-timeout",
        DEFAULTS.stall_timeout,
        "Refuse renewal when progress has not moved for this long (0: off).",
        zero=True,
    ),
    option(
        "log-level",
        type=click.Choice(LEVELS),
        default=DEFAULTS.log_level,
        help="Lowest level written to stderr (JSON lines).",
    ),
]
"""The claim bounds and logging."""


def limit_options(func: F) -> F:
    """The claim-bound and logging options, shared by ``serve`` and ``up``."""
    return apply(func, _LIMIT_OPTIONS)


_ETCD_SECURITY_OPTIONS: list[Callable[[F], F]] = [
    file_option("etcd-ca-cert", "PEM CA of etcd's server certificates (TLS to etcd)."),
    file_option("etcd-cert", "PEM client certificate for etcd (with --etcd-key)."),
    file_option("etcd-key", "PEM private key of --etcd-cert."),
    option(
        "etcd-user",
        default=None,
        callback=secret_from_file("COORDINATOR_ETCD_USER_FILE"),
        help="etcd user name (etcd auth); or COORDINATOR_ETCD_USER_FILE naming a file.",
    ),
    option(
        "etcd-password",
        default=None,
        callback=secret_from_file("COORDINATOR_ETCD_PASSWORD_FILE"),
        help="etcd password; set it by environment variable (or COORDINATOR_ETCD_PASSWORD_FILE"
        " naming a file holding it), not on the command line.",
    ),
]
"""TLS and credentials of the etcd connection."""


def etcd_security_options(func: F) -> F:
    """TLS and credentials of the etcd connection, shared by ``serve`` and ``doctor``."""
    return apply(func, _ETCD_SECURITY_OPTIONS)
