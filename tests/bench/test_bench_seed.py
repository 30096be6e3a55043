"""bench/seed.py against a real etcd: a transient StoreUnavailable while seeding is retried,
also when etcd applied the batch before its answer was lost; a real duplicate is not, and an etcd
that stays unavailable fails the seeding after a bounded number of tries."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from bench.seed import SEED_ATTEMPTS, TaskSeeder, task_id
from coordinator.domain.keys import Keyspace
from coordinator.errors import StoreUnavailable
from coordinator.etcd_process import EtcdProcess
from coordinator.store.etcd import Compare, EtcdKV, RequestOp, TxnResult

# Three batches of 40: the failure hits the second one, so the first and third are untouched.
COUNT = 100
TIMED_OUT = "etcd txn failed: UNAVAILABLE: etcdserver: request timed out"


class _TimesOutOnce(EtcdKV):
    """The real connection, whose second txn fails once with etcd's timeout: before it reaches
    etcd (``applied=False``) or after etcd applied it, its answer lost (``applied=True``)."""

    applied = False
    txns = 0
    injected = 0

    def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[RequestOp] = (),
        failure: Iterable[RequestOp] = (),
        **kwargs: Any,
    ) -> TxnResult:
        self.txns += 1
        if self.txns != 2:
            return super().txn(compare, success, failure, **kwargs)
        if self.applied:
            assert super().txn(compare, success, failure, **kwargs).succeeded
        self.injected += 1
        raise StoreUnavailable(TIMED_OUT)


@pytest.fixture
def flaky(etcd: EtcdProcess) -> Iterator[_TimesOutOnce]:
    kv = _TimesOutOnce.connect([etcd.endpoint], timeout=10)
    assert isinstance(kv, _TimesOutOnce)  # connect() builds the class it is called on
    try:
        yield kv
    finally:
        kv.close()


def _ready(etcd_client: Any, keys: Keyspace, queue: str) -> int:
    return sum(1 for _ in etcd_client.get_prefix(keys.ready_prefix(queue), keys_only=True))


@pytest.mark.parametrize("applied", [False, True], ids=["lost-request", "lost-answer"])
def test_a_timed_out_batch_is_retried_and_every_task_is_seeded_once(
    flaky: _TimesOutOnce, etcd_client: Any, prefix: str, applied: bool
) -> None:
    flaky.applied = applied
    keys = Keyspace(prefix)
    TaskSeeder(flaky, keys).seed("q", COUNT)
    assert flaky.injected == 1
    assert _ready(etcd_client, keys, "q") == COUNT
    for i in (0, 40, 79, COUNT - 1):
        assert flaky.get(keys.task(task_id("q", i))) is not None


def test_a_task_that_already_exists_on_the_first_try_is_an_error(
    flaky: _TimesOutOnce, etcd_client: Any, prefix: str
) -> None:
    keys = Keyspace(prefix)
    seeder = TaskSeeder(flaky, keys)
    seeder.seed("q", 1)
    flaky.txns = 2  # no failure injected: only a real duplicate
    with pytest.raises(RuntimeError, match=r"seeding failed: a task of the batch from .* exists"):
        seeder.seed("q", 1)
    assert _ready(etcd_client, keys, "q") == 1


class _Unavailable(EtcdKV):
    """The real connection, whose every txn fails with etcd's timeout before reaching it."""

    txns = 0

    def txn(self, *args: Any, **kwargs: Any) -> TxnResult:
        self.txns += 1
        raise StoreUnavailable(TIMED_OUT)


def test_an_etcd_that_stays_unavailable_fails_the_seeding_after_the_bounded_tries(
    etcd: EtcdProcess, etcd_client: Any, prefix: str
) -> None:
    kv = _Unavailable.connect([etcd.endpoint], timeout=10)
    assert isinstance(kv, _Unavailable)
    keys = Keyspace(prefix)
    try:
        with pytest.raises(StoreUnavailable, match="request timed out"):
            TaskSeeder(kv, keys, backoff=0.0).seed("q", COUNT)
        assert kv.txns == SEED_ATTEMPTS  # the first batch only, then it gave up
        with pytest.raises(StoreUnavailable):
            TaskSeeder(kv, keys, backoff=0.0).drop("q")
        assert kv.txns == 2 * SEED_ATTEMPTS
    finally:
        kv.close()
    assert _ready(etcd_client, keys, "q") == 0
