"""``coordinator console``: serve the web console for a coordinator.

The console is a gRPC client of ``--target`` (found like the other remote verbs: the running
``coordinator up`` when no target is given). It has no credentials of its own to act with:
each person signs in with their own token, which every call made for them carries. ``--ca``,
``--cert`` and ``--key`` only secure the channel (a token, when sent, decides who the caller
is; give the console's certificate no roles). Needs the ``console`` extra.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import click
import grpc

from coordinator.cli.local_up import discover
from coordinator.cli.remote import DEFAULT_TARGET
from coordinator.config import is_loopback
from coordinator.errors import CoordinatorError
from coordinator.sdk import environment as env
from coordinator.sdk.auth import tls_credentials

# uvicorn's bounds: requests handled at once (past it: 503), and how long an idle keep-alive
# connection is held.
_CONCURRENCY = 64
_KEEP_ALIVE = 5


def _bind(listen: str) -> socket.socket:
    """A listening socket on ``listen`` (HOST:PORT; port 0 picks a free one)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise click.UsageError(f"cannot listen on {listen}: {exc.strerror}") from exc
    sock.listen(128)
    return sock


def _loopback_if_insecure(insecure: bool, listen: str) -> None:
    """Refuse (exit 2) an insecure console off loopback: without tokens, anyone who reaches
    the port signs in as any principal with every role."""
    if insecure and not is_loopback(listen):
        raise click.UsageError(
            f"--insecure serves a console anyone can sign in to as anyone: listen on loopback "
            f"(e.g. 127.0.0.1:8080), not {listen}"
        )


def _secret(path: str | None) -> str:
    if path is None:
        # Sessions then last as long as this process: a restart signs everyone out.
        return secrets.token_urlsafe(48)
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise click.UsageError(f"cannot read --secret-file: {exc}") from exc


@click.command()
@click.option(
    "--target",
    envvar=env.TARGET,
    show_envvar=True,
    default=None,
    metavar="HOST:PORT",
    help=f"The coordinator [default: the running `coordinator up`; else {DEFAULT_TARGET}].",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the console serves HTTP (port 0: any free port; the URL is printed).",
)
@click.option(
    "--insecure",
    is_flag=True,
    envvar=env.INSECURE,
    show_envvar=True,
    help="The coordinator runs --insecure: people sign in by naming a principal.",
)
@click.option("--ca", envvar=env.CA, default=None, metavar="FILE", help="PEM CA (TLS).")
@click.option(
    "--cert",
    envvar=env.CLIENT_CERT,
    default=None,
    metavar="FILE",
    help="PEM client certificate for mutual TLS (with --key); it only secures the channel.",
)
@click.option(
    "--key",
    envvar=env.CLIENT_KEY,
    default=None,
    metavar="FILE",
    help="PEM key of --cert.",
)
@click.option(
    "--secret-file",
    envvar="COORDINATOR_CONSOLE_SECRET_FILE",
    show_envvar=True,
    default=None,
    metavar="FILE",
    help="Key that signs session cookies (>= 32 characters) [default: random per process].",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="COORDINATOR_CONSOLE_ALLOWED_HOSTS",
    show_envvar=True,
    metavar="NAME",
    help="A host name the console answers to (repeat; others get 400) [default: any; with "
    "--insecure only localhost, 127.0.0.1 and ::1].",
)
@click.option(
    "--secure-cookie",
    is_flag=True,
    help="Mark the session cookie Secure (serve it over HTTPS, e.g. behind a TLS proxy).",
)
def console(
    target: str | None,
    listen: str,
    insecure: bool,
    ca: str | None,
    cert: str | None,
    key: str | None,
    secret_file: str | None,
    allowed_hosts: tuple[str, ...],
    secure_cookie: bool,
) -> None:
    """Serve the web console: queues, live claims, tasks, the review inbox, live events."""
    try:
        import uvicorn

        from coordinator.console import ConsoleSettings, build_app
    except ImportError as exc:
        raise click.UsageError(
            f"the console needs its extra: pip install 'coordinator[console]' ({exc})"
        ) from exc
    if target is None:
        local = discover(flag="--target (or COORDINATOR_TARGET)")
        target = local.target if local is not None else DEFAULT_TARGET
        insecure = insecure or local is not None
    _loopback_if_insecure(insecure, listen)
    settings = ConsoleSettings(
        target=target,
        secret_key=_secret(secret_file),
        insecure=insecure,
        allowed_hosts=allowed_hosts,
        channel_credentials=_credentials(ca, cert, key),
        secure_cookie=secure_cookie,
    )
    try:
        app = build_app(settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    sock = _bind(listen)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"console for {target} on http://{shown}:{port}/")
    if not is_loopback(listen) and not secure_cookie:
        click.echo(
            "warning: not on loopback and without --secure-cookie: serve it behind HTTPS",
            err=True,
        )
    config = uvicorn.Config(
        app,
        log_level="warning",
        limit_concurrency=_CONCURRENCY,
        timeout_keep_alive=_KEEP_ALIVE,
        proxy_headers=False,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _credentials(
    ca: str | None, cert: str | None, key: str | None
) -> grpc.ChannelCredentials | None:
    """TLS to the coordinator from --ca/--cert/--key (None: plaintext); unreadable files are a
    usage error."""
    if not (ca or cert):
        return None
    try:
        return tls_credentials(ca=ca, cert=cert, key=key)
    except (OSError, CoordinatorError) as exc:
        raise click.UsageError(f"TLS files: {exc}") from exc
