"""Several ``coordinator up`` at once, and an ``up`` that is SIGKILLed.

Each ``up`` has a record of its own: a second one never hides or deletes the first's, the CLI
verbs and ``--print-env`` use the only one or refuse naming every choice, and ``--target``
picks one. A SIGKILLed ``up`` leaves nothing running and nothing on disk: its etcd dies and its
temporary data directory goes (coordinator/lifeline.py), and its record is dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coordinator.cli import local_up, main
from coordinator.cli.local_up import LocalUp, SeveralUps, discover, publish, record_file
from tests.helpers import eventually
from tests.test_cli import Process, processes

__all__ = ["processes"]  # the fixture, used by name


def _start_up(tmp_path: Path, name: str, processes: list[Process]) -> tuple[Process, str, str]:
    """A running ``up`` on a free port: the process, its address and its etcd endpoint."""
    up = Process(["up", "--listen", "127.0.0.1:0"], tmp_path / f"{name}.log")
    processes.append(up)
    return up, up.expect(r"listening on (\S+)")[1], up.expect(r"etcd at (\S+)")[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: only its parent (gone here) could reap it.
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_two_ups_run_at_once_and_the_cli_asks_which_one(
    tmp_path: Path, processes: list[Process]
) -> None:
    first, first_at, first_etcd = _start_up(tmp_path, "first", processes)
    second, second_at, _ = _start_up(tmp_path, "second", processes)
    assert record_file(first.proc.pid).exists() and record_file(second.proc.pid).exists()

    for verb in (["epoch", "show"], ["doctor", "--json"], ["up", "--print-env"]):
        asked = CliRunner().invoke(main, verb)
        assert asked.exit_code == 2, (verb, asked.output)
        said = " ".join(asked.stderr.split())
        assert "2 `coordinator up` are running: " in said and "Give --" in said, said
        for up, at in ((first, first_at), (second, second_at)):
            assert f"{at} (etcd " in said and f"pid {up.proc.pid}, from {sys.prefix})" in said
    picked = CliRunner().invoke(main, ["up", "--print-env", "--target", first_at])
    assert picked.exit_code == 0, picked.output
    assert picked.output == (
        f"export COORDINATOR_TARGET={first_at} COORDINATOR_INSECURE=1 "
        f"COORDINATOR_ETCD={first_etcd}\n"
    )
    shown = CliRunner().invoke(main, ["epoch", "show", "--target", second_at, "--insecure"])
    assert shown.exit_code == 0, shown.output

    # The second one stops: the first is found again, by itself, its record untouched.
    assert second.terminate() == 0, second.logs()
    assert not record_file(second.proc.pid).exists()
    assert record_file(first.proc.pid).exists()
    alone = CliRunner().invoke(main, ["up", "--print-env"])
    assert (alone.exit_code, alone.output) == (0, picked.output)
    assert first.terminate() == 0, first.logs()


def test_a_sigkilled_up_leaves_no_etcd_no_data_and_no_record(
    tmp_path: Path, processes: list[Process]
) -> None:
    up, _, etcd_endpoint = _start_up(tmp_path, "up", processes)
    ((etcd_pid, etcd_args),) = [
        (pid, args)
        for pid, args in _children(up.proc.pid).items()
        if f"--listen-client-urls=http://{etcd_endpoint}" in args
    ]
    data_dir = Path(next(a for a in etcd_args if a.startswith("--data-dir=")).split("=", 1)[1])
    scratch = data_dir.parent  # the temporary directory: data and etcd's log
    assert scratch.name.startswith("coordinator-etcd-") and data_dir.exists()

    up.proc.kill()  # SIGKILL: `up` runs no cleanup of its own
    up.proc.wait()
    eventually(lambda: not scratch.exists(), timeout=30, message="etcd's data stayed")
    # Killed, and waited for, before its data went (an etcd left running would soon die of the
    # missing directory anyway: checking it after would prove nothing).
    assert not _alive(etcd_pid), "etcd outlived its `up`"
    # Its record names a process that is gone: ignored, and dropped by the next reader.
    assert record_file(up.proc.pid).exists()
    gone = CliRunner().invoke(main, ["up", "--print-env"])
    assert gone.exit_code == 1 and "no `coordinator up` is running" in gone.stderr
    assert not record_file(up.proc.pid).exists()


def test_an_up_whose_etcd_dies_under_it_says_so_and_exits(
    tmp_path: Path, processes: list[Process]
) -> None:
    """Its etcd killed (out of memory, by hand), an ``up`` used to serve on for ever, NOT_SERVING
    and logging reconnects, the dead etcd unreaped. Now it says why and stops, exit 1."""
    up, _, etcd_endpoint = _start_up(tmp_path, "up", processes)
    ((etcd_pid, _),) = [
        (pid, args)
        for pid, args in _children(up.proc.pid).items()
        if f"--listen-client-urls=http://{etcd_endpoint}" in args
    ]
    os.kill(etcd_pid, signal.SIGKILL)
    assert up.proc.wait(timeout=60) == 1, up.logs()
    assert "coordinator: its etcd exited (code -9) under it: stopping." in up.logs()
    assert not record_file(up.proc.pid).exists()  # withdrawn as on any stop


def _children(pid: int) -> dict[int, list[str]]:
    """The command lines of ``pid``'s child processes, by pid (from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                command = (stat.parent / "cmdline").read_bytes().decode().split("\0")[:-1]
                found[int(stat.parent.name)] = command
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def test_of_several_ups_a_terminal_finds_the_one_of_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two clones' `up`s: a terminal of either once got "2 are running" (or, with one running,
    # silently the other clone's target).
    monkeypatch.setenv(local_up.STATE_DIR_ENV, str(tmp_path))
    ours = LocalUp("127.0.0.1:50051", "http://127.0.0.1:2379", os.getpid(), home=sys.prefix)
    theirs = LocalUp("127.0.0.1:50061", "http://127.0.0.1:2389", os.getppid(), home="/other/.venv")
    publish(ours)
    publish(theirs)
    assert discover() == ours
    older = LocalUp("127.0.0.1:50071", "http://127.0.0.1:2399", 1)  # a record without a home
    publish(older)
    assert discover() == ours
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:  # a second `up` of this environment: nothing picks one
            publish(LocalUp("127.0.0.1:50081", "http://127.0.0.1:2409", other.pid, sys.prefix))
            with pytest.raises(SeveralUps, match=f"pid {other.pid}, from {sys.prefix}"):
                discover()
        finally:
            other.kill()


def test_a_killed_up_not_yet_reaped_is_not_running() -> None:
    # kill(pid, 0) finds a zombie: an `up` started right after a kill -9 was refused.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    eventually(lambda: Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] == "Z")
    assert not local_up._alive(child.pid)
    child.wait()
    assert local_up._alive(os.getpid())
