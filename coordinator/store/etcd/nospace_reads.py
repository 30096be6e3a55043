"""A txn that writes nothing, answered by Range reads when etcd refuses it for NOSPACE.

etcd 3.5.0 to 3.5.6 refuse every Txn while the NOSPACE alarm is raised, even one that only
compares and reads (etcd issue 13429, fixed in 3.5.7 and 3.4.23), and the coordinator reads
through compare-less txns and checks fences through compare-only ones: on those versions a full
etcd would stop every read and every renewal, not only the writes the space guard refuses. A
Range is never refused, so ``answer_by_ranges`` runs such a txn as Range reads at one revision
and evaluates its compares here, as etcd's ``applyCompare`` does: the same answer, read at the
same single revision, in more round trips (only while the alarm is up). A txn that puts or
deletes anything, at any depth, is not answered (None): it stays refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etcd3 import etcdrpc

from coordinator.store.etcd.ops import op_kinds

Range = Callable[[Any], Any]
"""Send one RangeRequest, return etcd's RangeResponse."""

_PAGE = 1000
"""Keys a compare's range is read in at once."""


def answer_by_ranges(request: Any, send_range: Range) -> Any | None:
    """etcd's TxnResponse to ``request`` (a TxnRequest) built from Range reads at one revision,
    or None if the request writes."""
    if any(kind != "request_range" for kind in op_kinds(request)):
        return None  # it puts or deletes somewhere
    header = send_range(etcdrpc.RangeRequest(key=b"\0", count_only=True)).header
    return _evaluate(request, int(header.revision), send_range, header)


def _evaluate(request: Any, revision: int, send_range: Range, header: Any) -> Any:
    succeeded = all(_holds(c, revision, send_range) for c in request.compare)
    responses = []
    for op in request.success if succeeded else request.failure:
        if op.WhichOneof("request") == "request_txn":
            inner = _evaluate(op.request_txn, revision, send_range, header)
            responses.append(etcdrpc.ResponseOp(response_txn=inner))
        else:
            read = etcdrpc.RangeRequest()
            read.CopyFrom(op.request_range)
            read.revision = read.revision or revision  # a txn's reads are at its revision
            responses.append(etcdrpc.ResponseOp(response_range=send_range(read)))
    return etcdrpc.TxnResponse(header=header, succeeded=succeeded, responses=responses)


def _holds(compare: Any, revision: int, send_range: Range) -> bool:
    """etcd's ``applyCompare``: every key of the compare's range satisfies it; a missing key
    compares as zeros, except that a value compare on a missing key fails. A range is read in
    pages of ``_PAGE`` keys (values only for a value compare), so no answer outgrows a message."""
    keys_only = compare.target != etcdrpc.Compare.VALUE
    start, seen = compare.key, False
    while True:
        page = send_range(
            etcdrpc.RangeRequest(
                key=start,
                range_end=compare.range_end,
                revision=revision,
                limit=_PAGE,
                keys_only=keys_only,
            )
        )
        if not all(_compares(compare, kv) for kv in page.kvs):
            return False
        seen = seen or bool(page.kvs)
        if not page.more:
            break
        start = page.kvs[-1].key + b"\0"
    return seen or (keys_only and _compares(compare, None))


def _compares(compare: Any, kv: Any | None) -> bool:
    target = compare.target
    if target == etcdrpc.Compare.VALUE:
        order = _order(kv.value if kv is not None else b"", compare.value)
    else:
        field, wanted = {
            etcdrpc.Compare.VERSION: ("version", compare.version),
            etcdrpc.Compare.CREATE: ("create_revision", compare.create_revision),
            etcdrpc.Compare.MOD: ("mod_revision", compare.mod_revision),
            etcdrpc.Compare.LEASE: ("lease", compare.lease),
        }[target]
        order = _order(getattr(kv, field) if kv is not None else 0, wanted)
    return {
        etcdrpc.Compare.EQUAL: order == 0,
        etcdrpc.Compare.NOT_EQUAL: order != 0,
        etcdrpc.Compare.GREATER: order > 0,
        etcdrpc.Compare.LESS: order < 0,
    }[compare.result]


def _order(mine: Any, theirs: Any) -> int:
    return int(mine > theirs) - int(mine < theirs)
