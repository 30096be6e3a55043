"""``Abort`` (sdk/abort.py): a long poll ended from another thread, on the wire too, so the
coordinator claims nothing for it; an abort before the call refuses it unsent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import CallRetry, TaskState, WorkerClient
from coordinator.sdk.abort import Abort, CallAborted
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

TTL = timedelta(seconds=30)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


def test_an_aborted_long_poll_ends_at_once_and_claims_nothing(coordinator: Served) -> None:
    abort = Abort()
    raised: list[BaseException] = []

    def poll() -> None:
        with coordinator.client("w") as worker:
            try:
                worker.claim_next(QUEUE, ttl=TTL, wait=timedelta(seconds=20), abort=abort)
            except CallAborted as exc:
                raised.append(exc)

    store = coordinator.store
    thread = threading.Thread(target=poll)
    thread.start()
    eventually(lambda: store.long_poll.waiting() == 1, message="the poll is not waiting")
    abort.abort()
    thread.join(10)
    assert not thread.is_alive() and len(raised) == 1
    eventually(lambda: store.long_poll.waiting() == 0, message="the server still waits")
    with coordinator.client("producer") as producer:
        producer.create_task("t", queue=QUEUE)  # nobody waits for it any more
        assert producer.get_task("t").state is TaskState.READY
        with pytest.raises(CallAborted):  # aborted before: refused unsent
            producer.claim_next(QUEUE, ttl=TTL, abort=abort)
        assert producer.get_task("t").state is TaskState.READY


def test_an_abort_ends_a_call_that_meets_no_coordinator_between_its_tries() -> None:
    """A stopping pool whose poll met no coordinator slept out the retry backoff, in the epoch
    read before the claim too (the read took no abort): `coordinator worker` stopped 2 to 8 s
    after SIGTERM with nothing running. With a backoff of 60 s, only the abort can end it."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{probe.getsockname()[1]}"
    slow = CallRetry(initial_backoff=60, max_backoff=60, budget=300)
    abort, raised = Abort(), []

    def poll() -> None:
        with WorkerClient(target, principal="w", retry=slow) as worker:
            try:
                worker.claim_next(QUEUE, ttl=TTL, abort=abort)
            except CallAborted as exc:
                raised.append(exc)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    thread.join(1)  # the first try has failed by now: the call sleeps before its second
    assert thread.is_alive()
    abort.abort()
    thread.join(30)
    assert not thread.is_alive() and len(raised) == 1
