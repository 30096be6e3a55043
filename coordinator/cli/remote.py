"""How the remote verbs (``claims``, ``epoch``, ``drain``, ``tasks``, ...) reach a coordinator.

Options shared by every remote verb: ``--target``, then one way to authenticate: a bearer
token (``--token`` / ``COORDINATOR_TOKEN``), a client certificate (``--cert``/``--key``), or
``--insecure`` for a server started with ``--insecure`` (``coordinator up``). TLS is used when
``--ca`` or ``--cert`` is given. Calls go through the SDK's transport (deadlines, retries on
UNAVAILABLE only, one exception per gRPC status).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import click
import grpc

from coordinator.cli.local_up import discover
from coordinator.cli.origins import origin
from coordinator.cli.secret_files import secret_from_file
from coordinator.errors import CoordinatorError, NotFound
from coordinator.sdk import CallRetry
from coordinator.sdk import environment as env
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.auth import BearerToken, tls_credentials

F = TypeVar("F", bound=Callable[..., Any])
Req = TypeVar("Req")
Resp = TypeVar("Resp")

DEFAULT_TARGET = env.DEFAULT_TARGET


def remote_options(func: F) -> F:
    """Add the connection options; the command receives them as one ``remote`` dict."""
    return remote_options_as("operator")(func)


def remote_options_as(principal: str) -> Callable[[F], F]:
    """``remote_options`` whose --principal (insecure mode) defaults to ``principal``: a
    worker's claims should not read "by operator" in the events."""

    def add(func: F) -> F:
        for option in reversed(_options(principal)):
            func = option(func)
        return func

    return add


def _options(principal: str) -> list[Callable[[F], F]]:
    return [
        click.option(
            "--target",
            envvar=env.TARGET,
            show_envvar=True,
            default=None,
            metavar="HOST:PORT",
            help=f"The coordinator to talk to [default: the running `coordinator up`, with "
            f"--insecure; else {DEFAULT_TARGET}].",
        ),
        click.option(
            "--token",
            envvar=env.TOKEN,
            show_envvar=True,
            default=None,
            callback=secret_from_file(env.CLIENT_TOKEN_FILE),
            help=f"Bearer token (prefer the env var, or {env.CLIENT_TOKEN_FILE} naming a file"
            " that holds it: a flag shows in ps).",
        ),
        click.option(
            "--ca",
            envvar=env.CA,
            show_envvar=True,
            default=None,
            metavar="FILE",
            help="PEM CA of the server certificate (enables TLS).",
        ),
        click.option(
            "--cert",
            envvar=env.CLIENT_CERT,
            show_envvar=True,
            default=None,
            metavar="FILE",
            help="PEM client certificate for mutual TLS (with --key).",
        ),
        click.option(
            "--key",
            envvar=env.CLIENT_KEY,
            show_envvar=True,
            default=None,
            metavar="FILE",
            help="PEM private key of --cert.",
        ),
        click.option(
            "--insecure",
            is_flag=True,
            envvar=env.INSECURE,
            show_envvar=True,
            help="Send no credentials, only --principal (servers started with --insecure).",
        ),
        click.option(
            "--principal",
            default=principal,
            show_default=True,
            help="With --insecure: the principal to act as.",
        ),
    ]


def remote_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Pop the connection options out of a command's keyword arguments. Without a target, the
    running ``coordinator up`` (cli/local_up.py) is the target, insecure like it, unless
    credentials were given. With neither a target, nor credentials, nor an ``up`` running, a
    usage error (exit 2) says so: most likely ``up`` is not (or no longer) running; with several
    running, a usage error names them and asks for --target."""
    names = ("target", "token", "ca", "cert", "key", "insecure", "principal")
    remote = {name: settings.pop(name) for name in names}
    if remote["target"] is None:
        local = discover(flag="--target (or COORDINATOR_TARGET)")
        credentials = remote["token"] or remote["cert"]
        if local is None and not credentials and not remote["insecure"]:
            raise click.UsageError(NOTHING_TO_TALK_TO)
        remote["target"] = local.target if local is not None else DEFAULT_TARGET
        remote["insecure"] = remote["insecure"] or (local is not None and not credentials)
    return remote


NOTHING_TO_TALK_TO = (
    "no coordinator to talk to: no `coordinator up` is running (start one in another "
    "terminal); for another server give --target (or COORDINATOR_TARGET) and --token, "
    "--cert/--key or --insecure"
)


class Remote:
    """A connection to one coordinator with the chosen credentials."""

    def __init__(self, rpc: Rpc) -> None:
        self._rpc = rpc

    @property
    def rpc(self) -> Rpc:
        """The connection itself: its ``call`` raises the coordinator's errors as they are."""
        return self._rpc

    @property
    def admin(self) -> Any:
        """AdminService stub."""
        return self._rpc.admin

    @property
    def tasks(self) -> Any:
        """TaskService stub."""
        return self._rpc.tasks

    @property
    def worker(self) -> Any:
        """WorkerService stub."""
        return self._rpc.worker

    def call(self, method: Callable[..., Resp], request: Any, *, idempotency_key: str = "") -> Resp:
        """One call; any refusal becomes a CLI error (exit 1) with the server's message. An
        ``idempotency_key`` goes with every try, so a retried change applies once."""
        try:
            return self._rpc.call(
                method,  # type: ignore[arg-type]
                request,
                idempotency_key=idempotency_key,
            )
        except CoordinatorError as exc:
            raise click.ClickException(str(exc)) from exc

    def call_or_none(self, method: Callable[..., Resp], request: Any) -> Resp | None:
        """Like ``call``, but None when the server answers NOT_FOUND."""
        try:
            return self._rpc.call(method, request)  # type: ignore[arg-type]
        except NotFound:
            return None
        except CoordinatorError as exc:
            raise click.ClickException(str(exc)) from exc


def channel_credentials(
    *, token: str | None, ca: str | None, cert: str | None, key: str | None, insecure: bool
) -> grpc.ChannelCredentials | None:
    """The TLS credentials the options ask for (None: plaintext); a usage error (exit 2) if
    the options do not add up, naming for each whether it came from its flag or from its
    environment variable (a COORDINATOR_INSECURE left by ``up --print-env``, say)."""
    settings = env.ClientSettings(
        token=_given("token", token),
        cert=_given("cert", cert),
        key=_given("key", key),
        insecure=_given("insecure", "1" if insecure else None),
    )
    problem = settings.problem()
    if problem is not None:
        raise click.UsageError(problem)
    if not insecure and not token and not cert:
        raise click.UsageError(
            "no credentials: give --token (or COORDINATOR_TOKEN), --cert/--key, or --insecure "
            "for a server running without authentication"
        )
    if not (ca or cert):
        return None
    try:
        return tls_credentials(ca=ca, cert=cert, key=key)
    except OSError as exc:
        raise click.UsageError(f"cannot read a TLS file: {exc}") from exc


def _given(name: str, value: str | None) -> env.Setting | None:
    """A connection option's value as a Setting: its flag, or the environment variable it was
    read from (click knows which)."""
    if not value:
        return None
    ctx = click.get_current_context(silent=True)
    where = origin(ctx, name) if ctx is not None else None
    return env.Setting(value, where or f"--{name}")


@contextmanager
def connect(
    *,
    target: str,
    token: str | None,
    ca: str | None,
    cert: str | None,
    key: str | None,
    insecure: bool,
    principal: str,
    timeout: float = 10.0,
) -> Iterator[Remote]:
    """Open a Remote; a usage error (exit 2) if the credentials do not add up."""
    credentials = channel_credentials(token=token, ca=ca, cert=cert, key=key, insecure=insecure)
    try:
        rpc = Rpc(
            target,
            principal=principal,
            retry=CallRetry(timeout=timedelta(seconds=timeout), attempts=3),
            credentials=credentials,
            channel_options=[("grpc.enable_http_proxy", 0)],
            interceptors=[BearerToken(token)] if token else (),
        )
    except CoordinatorError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        yield Remote(rpc)
    finally:
        rpc.close()
