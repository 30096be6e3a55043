"""Group commit: the concurrent transactions of one replica share one etcd round trip.

Under load, many handler threads each send a small txn (a claim, a commit, a fenced read).
etcd (>= 3.3) accepts a txn whose success branch holds other txns, applies it as one raft entry
at one revision, and evaluates the compares of every nested txn against the state *before* any
of them applies. So a batch behaves exactly as if its txns ran alone one after another, as long
as no txn in it writes a key that another one compares, reads or writes: the batcher admits a
txn into a batch only then, and the rest wait for the next round. Every txn of a batch therefore
sees the state it would have seen alone, and the revision it reports (the batch's) is the
revision of the state it saw: the claim generation stays the revision of the claim's own write.

Leader/follower, no timer: a thread that finds fewer than ``max_in_flight`` batches on the wire
sends a batch itself (at low load: its own txn, alone, with no hand-off); the others wait on
their own gate and are answered by the leader that carried their txn, or handed a freed slot.
The conflict check is paid only when there is company: single keys are sets (an intersection
in C), ranges (prefix reads, prunes) are compared apart, and a txn alone in the queue goes
without its keys ever being read.
A batch etcd refuses (an operator's lower ``--max-txn-ops``, a request too large) is retried one
txn at a time, so a refusal reaches only the txn that caused it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from etcd3 import etcdrpc

from coordinator.errors import CoordinatorError, StoreUnavailable

TxnRequest = Any  # etcdrpc.TxnRequest (generated, untyped)
TxnResponse = Any  # etcdrpc.TxnResponse

MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: the operations of one branch, where a nested txn's branches
get what its parent's branch leaves (``checkTxnRequest``)."""
MAX_BATCH = 32
"""Txns per batch; with an inner txn of at most MAX_TXN_OPS - MAX_BATCH operations."""
MAX_BATCH_BYTES = 1 << 20
"""Below etcd's default ``--max-request-bytes`` (1.5 MiB)."""

_INFINITY = b"\xff" * 64  # above every key the coordinator writes; stands for range_end "\0"
_Span = tuple[bytes, bytes]  # [start, end)


@dataclass(frozen=True)
class TxnOutcome:
    """One txn's answer out of a batch."""

    succeeded: bool
    revision: int
    responses: list[Any]


class _Pending:
    """One caller's txn waiting for a batch.

    A waiting caller blocks on ``gate`` (a lock taken at creation, cheaper than an Event), which
    is released exactly once: when a leader answers the txn, or when a leader hands it the lead.
    A queued txn with ``lead`` set belongs to a thread that leads: only that thread takes it
    into a batch, so a txn is never both answered by one leader and made the heir of another.
    Its footprint is read only when the txn may share a batch (see ``GroupCommit._take``).
    """

    __slots__ = ("_footprint", "error", "gate", "lead", "outcome", "request")

    def __init__(self, request: TxnRequest) -> None:
        self.request = request
        self._footprint: _Footprint | None = None
        self.gate = threading.Lock()
        self.gate.acquire()
        self.lead = False
        self.outcome: TxnOutcome | None = None
        self.error: CoordinatorError | None = None

    @property
    def footprint(self) -> _Footprint:
        """The keys the txn touches, read from its request once (two threads racing to read
        it first compute the same value)."""
        fp = self._footprint
        if fp is None:
            fp = self._footprint = footprint(self.request)
        return fp

    @property
    def answered(self) -> bool:
        return self.outcome is not None or self.error is not None

    def answer(self, outcome: TxnOutcome | None, error: CoordinatorError | None) -> None:
        self.outcome, self.error = outcome, error
        if not self.lead:  # a leader's own txn: its thread is not waiting
            self.gate.release()


class _Footprint:
    """The keys a txn may read (compares and ranges) and write: single keys as sets (a batch's
    conflict check is then a set intersection, in C), key ranges as ``[start, end)`` intervals;
    ``alone`` when it must not share a batch (it is large, or nests txns itself)."""

    __slots__ = (
        "alone",
        "nbytes",
        "read_keys",
        "read_ranges",
        "size",
        "write_keys",
        "write_ranges",
    )

    def __init__(
        self,
        reads: tuple[frozenset[bytes], tuple[_Span, ...]],
        writes: tuple[frozenset[bytes], tuple[_Span, ...]],
        size: int,
        nbytes: int,
        alone: bool,
    ) -> None:
        self.read_keys, self.read_ranges = reads
        self.write_keys, self.write_ranges = writes
        self.size, self.nbytes, self.alone = size, nbytes, alone


class _Batch:
    """The txns chosen for one round trip and the keys they touch."""

    def __init__(self) -> None:
        self.items: list[_Pending] = []
        self._read_keys: set[bytes] = set()
        self._write_keys: set[bytes] = set()
        self._read_ranges: list[_Span] = []
        self._write_ranges: list[_Span] = []
        self._largest = 0
        self._bytes = 0

    def admit(self, item: _Pending) -> bool:
        """Add ``item`` if it conflicts with nothing already in the batch and fits."""
        fp = item.footprint
        if fp.alone:
            if self.items:
                return False
            self.items.append(item)
            return True
        if self.items and (
            self.items[0].footprint.alone
            or len(self.items) + 1 + max(self._largest, fp.size) > MAX_TXN_OPS
            or self._bytes + fp.nbytes > MAX_BATCH_BYTES
        ):
            return False
        writes, written = (fp.write_keys, fp.write_ranges), (self._write_keys, self._write_ranges)
        if (
            _meets((fp.read_keys, fp.read_ranges), written)
            or _meets(writes, written)
            or _meets(writes, (self._read_keys, self._read_ranges))
        ):
            return False
        self._read_keys |= fp.read_keys
        self._write_keys |= fp.write_keys
        self._read_ranges += fp.read_ranges
        self._write_ranges += fp.write_ranges
        self._largest = max(self._largest, fp.size)
        self._bytes += fp.nbytes
        self.items.append(item)
        return True


class GroupCommit:
    """Send txns for many threads, several per etcd round trip (see the module docstring)."""

    def __init__(
        self, send: Callable[[TxnRequest], TxnResponse], *, max_in_flight: int = 2
    ) -> None:
        # Two batches on the wire, so one slow txn (a large range read) does not hold up every
        # claim; at 32 workers 1, 2 and 4 measured alike (bench.compare, 3 rounds), with fewer
        # and larger batches the fewer the slots.
        self._send = send
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._in_flight = 0

    def txn(self, request: TxnRequest) -> TxnOutcome:
        """Run ``request`` (a TxnRequest) in some batch; its own outcome, or its error."""
        item = _Pending(request)
        with self._lock:
            self._queue.append(item)
            if self._in_flight < self._max_in_flight:
                self._in_flight += 1
                item.lead = True
        if not item.lead:
            item.gate.acquire()  # answered, or handed the lead (see _lead)
        if item.lead:
            self._lead(item)
        if item.error is not None:
            raise item.error
        assert item.outcome is not None
        return item.outcome

    def _lead(self, mine: _Pending) -> None:
        """Send batches until ``mine`` is answered, then pass this slot to the oldest txn that
        waits (not to one whose thread leads already: that would leak the slot), or free it.
        ``mine`` is only ever taken by this thread, so each round sends something."""
        try:
            while not mine.answered:
                with self._lock:
                    batch = self._take(mine)
                self._run(batch)
        finally:
            with self._lock:
                heir = next((item for item in self._queue if not item.lead), None)
                if heir is None:
                    self._in_flight -= 1
                else:
                    heir.lead = True
                    heir.gate.release()

    def _take(self, mine: _Pending) -> _Batch:
        """The oldest txns that can share a batch with ``mine`` or before it, other leaders'
        own txns left to them (called with the lock held)."""
        batch = _Batch()
        if len(self._queue) == 1:  # ``mine`` alone: no company, so no footprint to read
            batch.items.append(self._queue.pop())
            return batch
        kept: list[_Pending] = []
        for item in self._queue:
            if (
                (item.lead and item is not mine)
                or len(batch.items) >= MAX_BATCH
                or not batch.admit(item)
            ):
                kept.append(item)
        self._queue = kept
        return batch

    def _run(self, batch: _Batch) -> None:
        try:
            self._send_batch(batch.items)
        except BaseException as exc:  # a bug or an interrupt: nobody may wait forever
            for item in batch.items:
                if not item.answered:
                    item.answer(None, CoordinatorError(f"etcd txn not sent: {exc!r}"))
            raise

    def _send_batch(self, items: list[_Pending]) -> None:
        if len(items) == 1:
            self._run_alone(items[0])
            return
        request = etcdrpc.TxnRequest(
            success=[etcdrpc.RequestOp(request_txn=item.request) for item in items]
        )
        try:
            response = self._send(request)
        except StoreUnavailable as exc:  # indefinite for every txn in it, as each alone would be
            for item in items:
                item.answer(None, exc)
            return
        except CoordinatorError:  # etcd refused the batch itself: let each txn speak for itself
            for item in items:
                self._run_alone(item)
            return
        revision = int(response.header.revision)
        for item, op in zip(items, response.responses, strict=True):
            inner = op.response_txn
            item.answer(TxnOutcome(bool(inner.succeeded), revision, list(inner.responses)), None)

    def _run_alone(self, item: _Pending) -> None:
        try:
            response = self._send(item.request)
        except CoordinatorError as exc:
            item.answer(None, exc)
            return
        item.answer(
            TxnOutcome(
                bool(response.succeeded), int(response.header.revision), list(response.responses)
            ),
            None,
        )


def in_order_runs(requests: list[TxnRequest]) -> list[list[int]]:
    """``requests`` (indexes into it) cut into consecutive runs that may each share one batch
    by the batcher's own rule: sent run after run, they do what the txns would do one after
    another in their order."""
    runs: list[list[int]] = []
    batch = _Batch()
    for i, request in enumerate(requests):
        item = _Pending(request)
        if runs and batch.admit(item):
            runs[-1].append(i)
        else:
            batch = _Batch()
            batch.admit(item)
            runs.append([i])
    return runs


def footprint(request: TxnRequest) -> _Footprint:
    """The keys ``request`` compares, reads and writes."""
    read_keys: set[bytes] = set()
    write_keys: set[bytes] = set()
    read_ranges: list[_Span] = []
    write_ranges: list[_Span] = []
    for c in request.compare:
        _note(c.key, c.range_end, read_keys, read_ranges)
    alone = False
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            write_keys.add(op.request_put.key)
        elif kind == "request_delete_range":
            deletion = op.request_delete_range
            _note(deletion.key, deletion.range_end, write_keys, write_ranges)
        elif kind == "request_range":
            rng = op.request_range
            _note(rng.key, rng.range_end, read_keys, read_ranges)
        else:  # a nested txn of its own
            alone = True
    size = max(len(request.compare), len(request.success), len(request.failure))
    nbytes = request.ByteSize()
    alone = alone or size > MAX_TXN_OPS - MAX_BATCH or nbytes > MAX_BATCH_BYTES // 2
    return _Footprint(
        (frozenset(read_keys), tuple(read_ranges)),
        (frozenset(write_keys), tuple(write_ranges)),
        size,
        nbytes,
        alone,
    )


def _note(key: bytes, range_end: bytes, keys: set[bytes], ranges: list[_Span]) -> None:
    """etcd's key/range_end pair: one key into ``keys``, a range as a half-open interval."""
    if not range_end:
        keys.add(key)
    elif range_end == b"\0":
        ranges.append((key, _INFINITY))
    else:
        ranges.append((key, range_end))


def _meets(
    mine: tuple[frozenset[bytes] | set[bytes], Sequence[_Span]],
    theirs: tuple[frozenset[bytes] | set[bytes], Sequence[_Span]],
) -> bool:
    """Whether two sets of keys and ranges share a key: keys with keys by set intersection, the
    rest (ranges are rare on the hot path: prefix reads, prunes) by comparing bounds."""
    keys, ranges = mine
    other_keys, other_ranges = theirs
    if not keys.isdisjoint(other_keys):
        return True
    if other_ranges and any(s <= k < e for s, e in other_ranges for k in keys):
        return True
    if ranges and any(s <= k < e for s, e in ranges for k in other_keys):
        return True
    return any(s < o_end and o_start < e for s, e in ranges for o_start, o_end in other_ranges)
