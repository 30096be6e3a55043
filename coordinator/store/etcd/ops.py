"""What a transaction is made of, built without I/O: the compares (create and mod revisions, a
value, a whole range unchanged), the request ops (put, delete, get, ranges), nested txns, and
the records a read returns (``KV``, ``TxnResult``). ``kv.py``'s ``EtcdKV`` sends them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from etcd3 import etcdrpc, utils

Compare = Any  # etcdrpc.Compare (generated, untyped)
RequestOp = Any  # etcdrpc.RequestOp


@dataclass(frozen=True)
class KV:
    """One key as read from etcd."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def kv_of(raw: Any) -> KV:
    """The ``KV`` of one of etcd's ``mvccpb.KeyValue`` messages."""
    return KV(
        key=raw.key.decode(),
        value=bytes(raw.value),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        lease=int(raw.lease),
    )


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held, the revision the txn ran at, and its raw responses."""

    succeeded: bool
    revision: int
    responses: Sequence[Any]

    def range_kvs(self, index: int) -> list[KV]:
        """The keys returned by the range operation at position ``index``."""
        return [kv_of(kv) for kv in self.responses[index].response_range.kvs]

    def range_one(self, index: int) -> KV | None:
        """The single key of the range operation at ``index``, or None."""
        kvs = self.range_kvs(index)
        return kvs[0] if kvs else None

    def range_count(self, index: int) -> int:
        """The count of the range operation at ``index``."""
        return int(self.responses[index].response_range.count)

    def range_more(self, index: int) -> bool:
        """Whether the range operation at ``index`` stopped at its limit with keys left."""
        return bool(self.responses[index].response_range.more)


@dataclass(frozen=True)
class NestedTxn:
    """A txn ready to nest in a batch (``EtcdKV.txn_many``): built once, it can be sent again
    as it is (a renewal's fence check is the same txn every round)."""

    op: RequestOp  # a RequestOp holding the TxnRequest
    ops: int  # its largest branch (compares, success, failure)
    nbytes: int


def nested_txn(compare: Sequence[Compare], success: Sequence[RequestOp] = ()) -> NestedTxn:
    """``compare`` then ``success`` as a txn to nest."""
    op = etcdrpc.RequestOp(
        request_txn=etcdrpc.TxnRequest(compare=list(compare), success=list(success))
    )
    return NestedTxn(op, max(len(compare), len(success)), op.ByteSize())


# --- compares: the only ways the coordinator conditions a write -------------------------------


def create_revision_is(key: str, revision: int) -> Compare:
    """The key was created at ``revision`` (0: the key does not exist)."""
    return etcdrpc.Compare(
        key=key.encode(),
        result=etcdrpc.Compare.EQUAL,
        target=etcdrpc.Compare.CREATE,
        create_revision=revision,
    )


def mod_revision_is(key: str, revision: int) -> Compare:
    """The key was last written at ``revision`` (0: the key does not exist)."""
    return etcdrpc.Compare(
        key=key.encode(),
        result=etcdrpc.Compare.EQUAL,
        target=etcdrpc.Compare.MOD,
        mod_revision=revision,
    )


def value_is(key: str, value: bytes) -> Compare:
    """The key exists and holds exactly ``value``."""
    return etcdrpc.Compare(
        key=key.encode(),
        result=etcdrpc.Compare.EQUAL,
        target=etcdrpc.Compare.VALUE,
        value=value,
    )


# --- operations ------------------------------------------------------------------------------


def put(key: str, value: bytes, lease: int = 0) -> RequestOp:
    """Write ``key``; with ``lease`` the key dies with the lease."""
    return etcdrpc.RequestOp(
        request_put=etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease)
    )


def delete(key: str) -> RequestOp:
    """Delete one key."""
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key.encode()))


def get(key: str, *, revision: int = 0, keys_only: bool = False) -> RequestOp:
    """Read one key (inside a txn: at the txn's revision, or at ``revision`` if given);
    ``keys_only``: its revisions and no value."""
    return etcdrpc.RequestOp(
        request_range=etcdrpc.RangeRequest(key=key.encode(), revision=revision, keys_only=keys_only)
    )


def get_prefix(
    prefix: str,
    *,
    count_only: bool = False,
    keys_only: bool = False,
    limit: int = 0,
    last_first: bool = False,
) -> RequestOp:
    """Read (or count, or list the keys of) every key under ``prefix`` (at most ``limit``;
    0: all), in key order or, ``last_first``, from the last key down."""
    return etcdrpc.RequestOp(
        request_range=etcdrpc.RangeRequest(
            key=prefix.encode(),
            range_end=utils.prefix_range_end(prefix.encode()),
            count_only=count_only,
            keys_only=keys_only,
            limit=limit,
            sort_order=etcdrpc.RangeRequest.DESCEND if last_first else etcdrpc.RangeRequest.NONE,
            sort_target=etcdrpc.RangeRequest.KEY,
        )
    )


def get_newest(prefix: str) -> RequestOp:
    """Read the key under ``prefix`` created last (etcd sorts by create revision, then
    limits: one key comes back, however many there are)."""
    return etcdrpc.RequestOp(
        request_range=etcdrpc.RangeRequest(
            key=prefix.encode(),
            range_end=utils.prefix_range_end(prefix.encode()),
            limit=1,
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
        )
    )


def delete_prefix(prefix: str) -> RequestOp:
    """Delete every key under ``prefix`` (one operation)."""
    return etcdrpc.RequestOp(
        request_delete_range=etcdrpc.DeleteRangeRequest(
            key=prefix.encode(), range_end=utils.prefix_range_end(prefix.encode())
        )
    )


def range_empty(prefix: str) -> Compare:
    """No key exists under ``prefix`` (etcd compares every key of the range; an empty range
    compares as one absent key, whose create_revision is 0)."""
    return etcdrpc.Compare(
        key=prefix.encode(),
        range_end=utils.prefix_range_end(prefix.encode()),
        result=etcdrpc.Compare.LESS,
        target=etcdrpc.Compare.CREATE,
        create_revision=1,
    )


def range_unchanged_since(prefix: str, revision: int) -> Compare:
    """No key under ``prefix`` was written after ``revision`` (etcd compares every key in the
    range; an empty range passes). Deletions are not seen."""
    return etcdrpc.Compare(
        key=prefix.encode(),
        range_end=utils.prefix_range_end(prefix.encode()),
        result=etcdrpc.Compare.LESS,
        target=etcdrpc.Compare.MOD,
        mod_revision=revision + 1,
    )


def op_kinds(request: Any) -> Iterator[str]:
    """The kind of every operation of a TxnRequest's two branches ("request_put",
    "request_delete_range", "request_range"), a nested txn's own operations in its place, at any
    depth."""
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_txn":
            yield from op_kinds(op.request_txn)
        else:
            yield kind
