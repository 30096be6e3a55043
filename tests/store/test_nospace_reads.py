"""A write-free txn answered by Range reads (store/etcd/nospace_reads.py) answers what etcd's own
Txn answers: every compare target and result, on present and missing keys and over ranges, reads
with their options, the failure branch, nested txns. Checked against the session etcd, request
by request; a txn that writes anything is not answered."""

from __future__ import annotations

from typing import Any

import pytest
from etcd3 import etcdrpc

from coordinator.store.etcd import nospace_reads
from coordinator.store.etcd.nospace_reads import answer_by_ranges

C = etcdrpc.Compare


@pytest.fixture
def keys(etcd_client: Any, prefix: str) -> dict[str, bytes]:
    """Three keys under ``prefix`` (``b`` written twice, ``c`` on a lease) and the prefix's end."""
    lease = etcd_client.lease(60)
    etcd_client.put(f"{prefix}/a", b"1")
    etcd_client.put(f"{prefix}/b", b"2")
    etcd_client.put(f"{prefix}/b", b"3")
    etcd_client.put(f"{prefix}/c", b"4", lease=lease)
    etcd_client.put(b"\xfe" + prefix.encode(), b"5")
    got = {k: etcd_client.get(f"{prefix}/{k}")[1] for k in "abc"}
    return {
        "a": f"{prefix}/a".encode(),
        "b": f"{prefix}/b".encode(),
        "c": f"{prefix}/c".encode(),
        "none": f"{prefix}/none".encode(),
        "end": f"{prefix}0".encode(),  # just past "{prefix}/"
        "past": b"\xfe" + prefix.encode(),  # after it only other tests' keys of this kind
        "a_mod": str(got["a"].mod_revision).encode(),
        "c_lease": str(got["c"].lease_id).encode(),
    }


def _compare(key: bytes, target: int, result: int, value: Any, range_end: bytes = b"") -> Any:
    field = {C.VERSION: "version", C.CREATE: "create_revision", C.MOD: "mod_revision"}.get(
        target, {C.VALUE: "value", C.LEASE: "lease"}.get(target)
    )
    assert field is not None
    return etcdrpc.Compare(
        key=key, target=target, result=result, range_end=range_end, **{field: value}
    )


def _get(key: bytes, **options: Any) -> Any:
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, **options))


def _requests(k: dict[str, bytes]) -> list[Any]:
    a_mod, c_lease = int(k["a_mod"]), int(k["c_lease"])
    compares = [
        _compare(k["a"], C.MOD, C.EQUAL, a_mod),
        _compare(k["a"], C.MOD, C.EQUAL, a_mod + 1),
        _compare(k["a"], C.MOD, C.LESS, a_mod + 1),
        _compare(k["a"], C.MOD, C.GREATER, a_mod),
        _compare(k["b"], C.VERSION, C.EQUAL, 2),
        _compare(k["b"], C.VERSION, C.NOT_EQUAL, 2),
        _compare(k["b"], C.CREATE, C.GREATER, a_mod),
        _compare(k["b"], C.VALUE, C.EQUAL, b"3"),
        _compare(k["b"], C.VALUE, C.LESS, b"4"),
        _compare(k["c"], C.LEASE, C.EQUAL, c_lease),
        _compare(k["c"], C.LEASE, C.EQUAL, 0),
        _compare(k["none"], C.CREATE, C.EQUAL, 0),  # a missing key compares as zeros
        _compare(k["none"], C.VERSION, C.GREATER, 0),
        _compare(k["none"], C.VALUE, C.EQUAL, b""),  # a value on a missing key: always false
        _compare(k["none"], C.VALUE, C.NOT_EQUAL, b"x"),
        _compare(k["a"], C.VERSION, C.GREATER, 0, k["end"]),  # every key of the range
        _compare(k["a"], C.VALUE, C.LESS, b"4", k["end"]),  # c's "4" is not
        _compare(k["none"], C.VERSION, C.EQUAL, 0, k["none"] + b"\xff"),  # an empty range
        _compare(k["past"], C.MOD, C.GREATER, 0, b"\0"),  # range_end "\0": every key from it on
    ]
    reads = [
        _get(k["a"]),
        _get(k["none"]),
        _get(k["a"], range_end=k["end"], limit=2),
        _get(k["a"], range_end=k["end"], keys_only=True),
        _get(k["a"], range_end=k["end"], count_only=True),
    ]
    requests = [
        etcdrpc.TxnRequest(compare=[c], success=reads[:2], failure=reads[2:]) for c in compares
    ]
    requests.append(etcdrpc.TxnRequest(success=reads))  # a compare-less read
    requests.append(etcdrpc.TxnRequest(compare=compares[:1]))  # a compare-only fence check
    requests.append(etcdrpc.TxnRequest(compare=compares[:2], failure=reads[:1]))
    nested = [etcdrpc.RequestOp(request_txn=r) for r in requests[:3]]
    requests.append(etcdrpc.TxnRequest(success=nested))  # a group commit batch of reads
    return requests


def _same(mine: Any, theirs: Any) -> None:
    assert mine.succeeded == theirs.succeeded
    assert len(mine.responses) == len(theirs.responses)
    for got, want in zip(mine.responses, theirs.responses, strict=True):
        assert got.WhichOneof("response") == want.WhichOneof("response")
        if got.WhichOneof("response") == "response_txn":
            _same(got.response_txn, want.response_txn)
            continue
        got_range, want_range = got.response_range, want.response_range
        assert (got_range.count, got_range.more) == (want_range.count, want_range.more)
        assert list(got_range.kvs) == list(want_range.kvs)


@pytest.mark.parametrize("page", [1000, 2])  # 2: every range compare read in pages
def test_each_write_free_txn_is_answered_as_etcd_answers_it(
    etcd_client: Any, keys: dict[str, bytes], page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nospace_reads, "_PAGE", page)
    requests = _requests(keys)
    assert len(requests) == 23
    outcomes = []
    for request in requests:
        theirs = etcd_client.kvstub.Txn(request, 10)
        mine = answer_by_ranges(request, lambda r: etcd_client.kvstub.Range(r, 10))
        assert mine is not None
        assert mine.header.revision == theirs.header.revision
        _same(mine, theirs)
        outcomes.append(theirs.succeeded)
    # Both branches were exercised, so the comparison could tell them apart.
    assert outcomes.count(True) == 14 and outcomes.count(False) == 9


def test_a_txn_that_writes_at_any_depth_is_not_answered(
    etcd_client: Any, keys: dict[str, bytes]
) -> None:
    put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=keys["none"], value=b"v"))
    delete = etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=keys["a"]))
    nested_put = etcdrpc.RequestOp(request_txn=etcdrpc.TxnRequest(failure=[put]))
    sent: list[Any] = []
    for request in (
        etcdrpc.TxnRequest(success=[put]),
        etcdrpc.TxnRequest(failure=[_get(keys["a"]), delete]),
        etcdrpc.TxnRequest(success=[_get(keys["a"]), nested_put]),
    ):
        assert answer_by_ranges(request, sent.append) is None
    assert sent == []  # refused before reading anything
    assert etcd_client.get(keys["a"].decode())[0] == b"1"
