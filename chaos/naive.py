"""The naive baseline the seeds warn about; never part of the coordinator.

A claim is an ``ownerId`` + ``expiresAt`` record on an etcd lease; the holder checks its own
``expiresAt`` before committing and then writes the result with no fence at all. A pause between
that check and the write (GC, SIGSTOP) lets a late owner overwrite its successor's result. The
checker must catch it, on the same history format as the coordinator's workers:

    python -m chaos.naive --etcd HOST:PORT --name W --task T --history FILE [--pause]
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import click
import etcd3

from chaos.checker import FinalTask
from chaos.cluster import GRPC_OPTIONS
from chaos.history import End, Observed, OpKind, Recorder
from coordinator.domain.states import TaskState

PREFIX = "/naive"
TTL = 2


def _keys(task: str) -> tuple[str, str, str]:
    return f"{PREFIX}/owner/{task}", f"{PREFIX}/state/{task}", f"{PREFIX}/result/{task}"


def create(client: Any, task: str) -> None:
    """A READY task."""
    client.put(_keys(task)[1], TaskState.READY.name)


def final(client: Any, task: str) -> FinalTask | None:
    """The task as etcd holds it (None: it is not there)."""
    _, state_key, result_key = _keys(task)
    state, _ = client.get(state_key)
    result, _ = client.get(result_key)
    if state is None:
        return None
    return FinalTask(task, TaskState[state.decode()], 0, (result or b"").decode())


def claim(client: Any, name: str, task: str) -> tuple[int, float] | None:
    """Owner record on a lease, if nobody holds the task; (claim revision, expiresAt)."""
    owner_key, state_key, _ = _keys(task)
    lease = client.lease(TTL)
    expires_at = time.time() + TTL
    record = json.dumps({"ownerId": name, "expiresAt": expires_at})
    ok, _ = client.transaction(
        compare=[
            client.transactions.version(owner_key) == 0,
            client.transactions.value(state_key) == "READY",
        ],
        success=[client.transactions.put(owner_key, record, lease)],
        failure=[],
    )
    if not ok:
        lease.revoke()
        return None
    _, meta = client.get(owner_key)  # its create revision: a fencing token nobody checks
    return int(meta.create_revision), expires_at


def run(client: Any, rec: Recorder, name: str, task: str, pause: bool) -> None:
    """Claim the task (retrying), check expiresAt, (pause,) then write the result unfenced."""
    while True:
        op = rec.invoke(OpKind.CLAIM, task=task)
        got = claim(client, name, task)
        if got is not None:
            break
        rec.complete(op, End.FAIL, Observed.ALREADY_CLAIMED)
        time.sleep(0.1)
    generation, expires_at = got
    attempt_id = f"{name}-{generation}"
    fields = {"task": task, "attempt_id": attempt_id, "generation": generation}
    rec.complete(op, End.OK, Observed.CLAIMED, **fields)
    if time.time() >= expires_at:  # the naive guard: my own clock says I still own it
        return
    if pause:
        os.kill(os.getpid(), signal.SIGSTOP)  # the pause lands between the check and the write
    commit = rec.invoke(OpKind.COMMIT, **fields)
    _, state_key, result_key = _keys(task)
    client.put(result_key, f"{attempt_id}@{generation}")
    client.put(state_key, TaskState.DONE.name)
    rec.complete(commit, End.OK, Observed.COMMITTED)


@click.command()
@click.option("--etcd", "endpoint", required=True)
@click.option("--name", required=True)
@click.option("--task", required=True)
@click.option("--history", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--pause", is_flag=True)
def main(endpoint: str, name: str, task: str, history: Path, pause: bool) -> None:
    """Run one naive worker on one task."""
    host, port = endpoint.rsplit(":", 1)
    client = etcd3.client(host, int(port), timeout=5, grpc_options=GRPC_OPTIONS)
    rec = Recorder(history, name)
    try:
        run(client, rec, name, task, pause)
    finally:
        rec.close()
        client.close()


if __name__ == "__main__":
    main()
