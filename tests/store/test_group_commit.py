"""Group commit: concurrent txns share etcd round trips, and a batch behaves exactly as its txns
would one after another (store/etcd/group_commit.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd3 import etcdrpc

from coordinator.errors import CoordinatorError
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV
from coordinator.store.etcd.group_commit import GroupCommit, TxnOutcome, in_order_runs
from coordinator.store.etcd.ops import (
    create_revision_is,
    delete,
    delete_prefix,
    get,
    get_prefix,
    put,
    range_empty,
)
from tests.helpers import eventually


class _Wire:
    """The batcher's send, counted, with the first round trip held until released."""

    def __init__(self, kv: EtcdKV) -> None:
        self._kv = kv
        self.sent: list[int] = []  # txns per round trip (1: sent alone, not nested)
        self.hold = threading.Event()
        self.holding = threading.Event()

    def send(self, request: Any) -> Any:
        nested = [op for op in request.success if op.WhichOneof("request") == "request_txn"]
        self.sent.append(len(nested) if nested and not request.compare else 1)
        if len(self.sent) == 1:
            self.holding.set()
            self.hold.wait(10)
        return self._kv._send_txn(request)


@pytest.fixture
def kv(etcd: EtcdProcess) -> Iterator[EtcdKV]:
    client = EtcdKV.connect([etcd.endpoint])
    yield client
    client.close()


def _request(compare: list[Any] = (), success: list[Any] = ()) -> Any:  # type: ignore[assignment]
    return etcdrpc.TxnRequest(compare=list(compare), success=list(success))


def _queued(batcher: GroupCommit, count: int) -> Callable[[], bool]:
    return lambda: len(batcher._queue) == count


def _submit(
    batcher: GroupCommit, request: Any, into: dict[str, TxnOutcome | Exception], name: str
) -> threading.Thread:
    def run() -> None:
        try:
            into[name] = batcher.txn(request)
        except Exception as exc:  # the test inspects it
            into[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _blocked(
    kv: EtcdKV, prefix: str
) -> tuple[_Wire, GroupCommit, dict[str, TxnOutcome | Exception], threading.Thread]:
    """A one-slot batcher whose first round trip (a blocker txn) is held until ``wire.hold``
    is set, so that the txns submitted meanwhile queue up."""
    wire = _Wire(kv)
    batcher = GroupCommit(wire.send, max_in_flight=1)
    answers: dict[str, TxnOutcome | Exception] = {}
    blocker = _submit(batcher, _request(success=[put(f"{prefix}/x", b"0")]), answers, "x")
    assert wire.holding.wait(5)
    return wire, batcher, answers, blocker


def test_concurrent_txns_share_one_round_trip_and_one_revision(kv: EtcdKV, prefix: str) -> None:
    wire, batcher, answers, first = _blocked(kv, prefix)
    threads = [
        _submit(
            batcher,
            _request([create_revision_is(f"{prefix}/k{i}", 0)], [put(f"{prefix}/k{i}", b"v")]),
            answers,
            f"k{i}",
        )
        for i in range(20)
    ]
    eventually(_queued(batcher, 20), timeout=5)
    wire.hold.set()
    for thread in [first, *threads]:
        thread.join(10)

    assert wire.sent == [1, 20]  # the first alone, then all twenty in one nested txn
    outcomes = [answers[f"k{i}"] for i in range(20)]
    assert all(isinstance(o, TxnOutcome) and o.succeeded for o in outcomes)
    revisions = {o.revision for o in outcomes if isinstance(o, TxnOutcome)}
    assert len(revisions) == 1
    (revision,) = revisions
    assert [kv.get(f"{prefix}/k{i}").mod_revision for i in range(20)] == [revision] * 20  # type: ignore[union-attr]


def test_a_txn_that_compares_a_key_written_earlier_in_the_round_waits_for_the_next(
    kv: EtcdKV, prefix: str
) -> None:
    """etcd evaluates every nested compare before any nested write applies: were B batched
    after A, B would see the key absent and succeed, which no serial order allows."""
    wire, batcher, answers, blocker = _blocked(kv, prefix)
    key = f"{prefix}/k"
    a = _submit(batcher, _request(success=[put(key, b"a")]), answers, "a")
    eventually(_queued(batcher, 1), timeout=5)
    b = _submit(
        batcher,
        _request([create_revision_is(key, 0)], [put(f"{prefix}/b", b"b")]),
        answers,
        "b",
    )
    eventually(_queued(batcher, 2), timeout=5)
    wire.hold.set()
    for thread in (blocker, a, b):
        thread.join(10)

    assert wire.sent == [1, 1, 1]
    a_out, b_out = answers["a"], answers["b"]
    assert isinstance(a_out, TxnOutcome) and a_out.succeeded
    assert isinstance(b_out, TxnOutcome) and not b_out.succeeded
    assert b_out.revision == a_out.revision  # B read the state A left
    assert kv.get(f"{prefix}/b") is None


def test_a_batch_etcd_refuses_is_retried_txn_by_txn(kv: EtcdKV, prefix: str) -> None:
    wire, batcher, answers, blocker = _blocked(kv, prefix)
    good = _submit(batcher, _request(success=[put(f"{prefix}/good", b"1")]), answers, "good")
    eventually(_queued(batcher, 1), timeout=5)
    bad_key = f"{prefix}/bad"  # etcd refuses two puts of one key in one txn
    bad = _submit(
        batcher, _request(success=[put(bad_key, b"1"), put(bad_key, b"2")]), answers, "bad"
    )
    eventually(_queued(batcher, 2), timeout=5)
    wire.hold.set()
    for thread in (blocker, good, bad):
        thread.join(10)

    assert wire.sent == [1, 2, 1, 1]  # the pair refused, then each alone
    assert isinstance(answers["good"], TxnOutcome) and answers["good"].succeeded
    assert isinstance(answers["bad"], CoordinatorError)
    assert "etcd refused txn: INVALID_ARGUMENT" in str(answers["bad"])
    assert kv.get(f"{prefix}/good") is not None and kv.get(bad_key) is None


def test_the_adapter_batches_by_default(kv: EtcdKV, prefix: str) -> None:
    """EtcdKV.txn goes through the batcher: many threads, fewer round trips than txns."""
    calls: list[int] = []
    send = kv._send_txn

    def counted(request: Any) -> Any:
        calls.append(1)
        return send(request)

    kv._batcher._send = counted
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(20):
            kv.txn([create_revision_is(f"{prefix}/{i}/{j}", 0)], [put(f"{prefix}/{i}/{j}", b"v")])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert kv.read(get_prefix(f"{prefix}/", count_only=True)).range_count(0) == 320
    assert len(calls) < 320


# --- the admission rule, without etcd ---------------------------------------------------------


def _admits(first: Any, second: Any) -> bool:
    from coordinator.store.etcd.group_commit import _Batch, _Pending

    batch = _Batch()
    assert batch.admit(_Pending(first))
    return batch.admit(_Pending(second))


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        # disjoint keys share a round
        (_request(success=[put("/a", b"")]), _request(success=[put("/b", b"")]), True),
        (_request([create_revision_is("/a", 0)]), _request([create_revision_is("/a", 0)]), True),
        (_request(success=[get("/a")]), _request(success=[get("/a")]), True),
        # a write and anything else on the same key do not
        (_request(success=[put("/a", b"")]), _request(success=[put("/a", b"")]), False),
        (_request(success=[put("/a", b"")]), _request([create_revision_is("/a", 0)]), False),
        (_request([create_revision_is("/a", 0)]), _request(success=[put("/a", b"")]), False),
        (_request(success=[put("/a", b"")]), _request(success=[get("/a")]), False),
        (_request(success=[get("/a")]), _request(success=[delete("/a")]), False),
        # ranges: a prefix read against a write inside it, a prefix delete against a read
        (_request(success=[put("/p/x", b"")]), _request(success=[get_prefix("/p/")]), False),
        (_request(success=[get_prefix("/p/")]), _request(success=[put("/p/x", b"")]), False),
        (_request(success=[get_prefix("/p/")]), _request(success=[put("/q/x", b"")]), True),
        (
            _request(success=[get("/p/x")]),
            _request(
                success=[
                    etcdrpc.RequestOp(
                        request_delete_range=etcdrpc.DeleteRangeRequest(
                            key=b"/p/", range_end=b"/p0"
                        )
                    )
                ]
            ),
            False,
        ),
        # a range compare against a write inside it, the range's first key included
        (_request([range_empty("/p/")]), _request(success=[put("/p/x", b"")]), False),
        (_request(success=[put("/p/", b"")]), _request([range_empty("/p/")]), False),
        (_request([range_empty("/p/")]), _request(success=[put("/p0", b"")]), True),
        # two ranges: overlapping ones do not share, disjoint ones do
        (_request(success=[delete_prefix("/p/")]), _request(success=[get_prefix("/p/q/")]), False),
        (_request(success=[delete_prefix("/p/")]), _request(success=[get_prefix("/q/")]), True),
        # range_end "\0": every key from ``key`` on
        (
            _request(success=[put("/z/z", b"")]),
            _request(
                success=[
                    etcdrpc.RequestOp(
                        request_range=etcdrpc.RangeRequest(key=b"/y", range_end=b"\0")
                    )
                ]
            ),
            False,
        ),
        # a txn of its own that nests txns never shares
        (
            _request(success=[put("/a", b"")]),
            _request(success=[etcdrpc.RequestOp(request_txn=_request(success=[put("/b", b"")]))]),
            False,
        ),
    ],
)
def test_admission(first: Any, second: Any, shared: bool) -> None:
    assert _admits(first, second) is shared


def test_a_txn_alone_in_the_queue_is_sent_without_reading_its_footprint(
    kv: EtcdKV, prefix: str
) -> None:
    """At low load the leader's own txn is all there is to send: the batcher skips the conflict
    check (and the walk over the request it needs), and answers the txn as it would in a batch."""
    from coordinator.store.etcd.group_commit import _Pending

    seen: list[_Pending] = []
    batcher = GroupCommit(kv._send_txn, max_in_flight=1)
    take = batcher._take

    def spy(mine: _Pending) -> Any:
        seen.append(mine)
        return take(mine)

    batcher._take = spy  # type: ignore[method-assign]
    key = f"{prefix}/alone"
    outcome = batcher.txn(_request([create_revision_is(key, 0)], [put(key, b"v")]))
    assert outcome.succeeded and outcome.revision == kv.get(key).mod_revision  # type: ignore[union-attr]
    assert len(seen) == 1 and seen[0]._footprint is None
    assert (batcher._in_flight, batcher._queue) == (0, [])


def test_every_slot_comes_back_under_contention(kv: EtcdKV, prefix: str) -> None:
    """Leaders hand their slot to a waiting txn or give it back, never to a thread that holds
    one already: a leaked slot stays taken forever, and with every slot leaked no txn of the
    replica is ever sent again."""
    send = kv._send_txn
    batcher = GroupCommit(send, max_in_flight=2)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(40):
                key = f"{prefix}/{i}/{j}"
                batcher.txn(_request([create_revision_is(key, 0)], [put(key, b"v")]))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert (batcher._in_flight, batcher._queue) == (0, [])
    assert kv.read(get_prefix(f"{prefix}/", count_only=True)).range_count(0) == 24 * 40


def test_no_write_skew_under_contention(kv: EtcdKV, prefix: str) -> None:
    """Serial equivalence end to end, against the anomaly a batch could allow: in each round
    two txns race, one "create x if y does not exist", the other "create y if x does not
    exist". Run one after the other, exactly one of them succeeds. In one batch both would
    (etcd checks every nested compare before any nested write), leaving x and y both."""
    batcher = GroupCommit(kv._send_txn, max_in_flight=2)
    pairs, rounds = 8, 25

    def work(pair: int, side: int, barrier: threading.Barrier) -> None:
        for r in range(rounds):
            mine, other = (f"{prefix}/{pair}/{r}/{s}" for s in ("xy"[side], "xy"[1 - side]))
            barrier.wait()
            batcher.txn(_request([create_revision_is(other, 0)], [put(mine, b"1")]))

    threads = []
    for pair in range(pairs):
        barrier = threading.Barrier(2)
        threads += [threading.Thread(target=work, args=(pair, side, barrier)) for side in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    created = kv.read(get_prefix(f"{prefix}/", keys_only=True)).range_kvs(0)
    per_round: dict[str, int] = {}
    for item in created:
        round_key = item.key.rsplit("/", 1)[0]
        per_round[round_key] = per_round.get(round_key, 0) + 1
    assert len(per_round) == pairs * rounds
    assert set(per_round.values()) == {1}


# --- txns in order, several per round trip (the pruner's page) -------------------------------


def test_in_order_runs_cut_where_a_txn_touches_an_earlier_ones_keys() -> None:
    requests = [
        _request(success=[put("/a", b"")]),
        _request(success=[put("/b", b"")]),
        _request([create_revision_is("/a", 0)], [put("/c", b"")]),  # reads what the first wrote
        _request(success=[put("/d", b"")]),
        _request(success=[put("/d", b"")]),  # writes what the fourth wrote
    ]
    assert in_order_runs(requests) == [[0, 1], [2, 3], [4]]
    assert in_order_runs([]) == []


def test_txns_in_order_act_one_after_another_and_share_round_trips(kv: EtcdKV, prefix: str) -> None:
    slots: list[int] = []
    paced = kv.paced(lambda: slots.append(1))
    a, b, c = f"{prefix}/a", f"{prefix}/b", f"{prefix}/c"
    results = paced.txn_in_order(
        [
            ([create_revision_is(a, 0)], [put(a, b"1")]),
            ([create_revision_is(b, 0)], [put(b, b"1")]),
            # alone, before the first, it would succeed; after it, it must not
            ([create_revision_is(a, 0)], [put(c, b"from the third")]),
            ([create_revision_is(f"{prefix}/d", 0)], [put(f"{prefix}/d", b"1")]),
        ]
    )
    assert [r.succeeded for r in results] == [True, True, False, True]
    assert results[0].revision == results[1].revision  # one request, one revision
    assert results[2].revision == results[3].revision > results[1].revision
    assert kv.get(c) is None
    assert len(slots) == 4  # a slot of the pacer per txn, as if each were sent alone
