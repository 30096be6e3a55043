"""``Abort`` (sdk/abort.py): a long poll ended from another thread, on the wire too, so the
coordinator claims nothing for it; an abort before the call refuses it unsent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import TaskState
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
