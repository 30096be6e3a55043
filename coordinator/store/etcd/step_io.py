"""The etcd calls a hot store operation awaits, so that one coroutine serves both servers.

A claim, a commit and a renewal are written once, as coroutines that await each etcd call
through a ``StepIO`` (``ClaimStore.aclaim``, ``AcceptancePoints.acommit``,
``Renewals.arenew_many``). The sync server drives them
with ``SyncStepIO``: each call runs at once on the calling thread and hands back an awaitable
that is already done (``Done``), and ``run_now`` takes the coroutine to its end without an
event loop: the same lines, the same order of I/O, no thread hand-off. An asyncio server will
await the same coroutines with a ``StepIO`` whose calls really wait (docs/architecture.md, "The
hot path on one event loop"), so no decision is written twice.

A coroutine that ``run_now`` drives must await nothing but a ``SyncStepIO``'s calls (and other
such coroutines): anything that would suspend it is a bug, and ``run_now`` raises instead of
hanging.
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Generator, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from coordinator.domain.space import WriteKind
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.leases import ClaimLease, ClaimLeases
from coordinator.store.etcd.ops import KV, Compare, NestedTxn, RequestOp, TxnResult

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class StepIO(Protocol):
    """The etcd calls a store operation awaits (each as ``EtcdKV``'s or ``ClaimLeases``')."""

    def read(self, *ops: RequestOp) -> Awaitable[TxnResult]:
        """Several reads at one revision."""
        ...

    def get(self, key: str) -> Awaitable[KV | None]:
        """One key, or None."""
        ...

    def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[RequestOp] = (),
        failure: Iterable[RequestOp] = (),
        *,
        kind: WriteKind = WriteKind.DRAIN,
    ) -> Awaitable[TxnResult]:
        """One txn, through group commit and the space guard."""
        ...

    def range_page(
        self, start: str, end: str, *, limit: int = 0, revision: int = 0
    ) -> Awaitable[tuple[list[KV], int]]:
        """Keys in ``[start, end)`` and the revision they were read at."""
        ...

    def txn_many(self, txns: Sequence[NestedTxn]) -> Awaitable[list[TxnResult]]:
        """Independent txns in as few round trips as etcd's limits allow."""
        ...

    def keepalive_many(self, lease_ids: Iterable[int]) -> Awaitable[dict[int, int]]:
        """Several leases refreshed over one keepalive stream; each one's TTL (0: gone)."""
        ...

    def lease(self, ttl: int) -> Awaitable[ClaimLease]:
        """A lease for a claim: from the replica's pool, or granted."""
        ...

    def release(self, lease_id: int) -> Awaitable[None]:
        """A claim's lease whose key a txn deleted: back to the pool, or revoked."""
        ...


class Done(Generic[T_co]):
    """An awaitable whose value is already there: awaiting it never suspends."""

    __slots__ = ("_value",)

    def __init__(self, value: T_co) -> None:
        self._value = value

    def __await__(self) -> Generator[Any, None, T_co]:
        return self._value
        yield  # unreachable: it makes this a generator, which ``await`` needs


class SyncStepIO:
    """``StepIO`` over the sync etcd client: every call made at once, on the caller's thread."""

    __slots__ = ("_kv", "_leases")

    def __init__(self, kv: EtcdKV, leases: ClaimLeases) -> None:
        self._kv = kv
        self._leases = leases

    def read(self, *ops: RequestOp) -> Done[TxnResult]:
        """``EtcdKV.read``, made now."""
        return Done(self._kv.read(*ops))

    def get(self, key: str) -> Done[KV | None]:
        """``EtcdKV.get``, made now."""
        return Done(self._kv.get(key))

    def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[RequestOp] = (),
        failure: Iterable[RequestOp] = (),
        *,
        kind: WriteKind = WriteKind.DRAIN,
    ) -> Done[TxnResult]:
        """``EtcdKV.txn``, made now."""
        return Done(self._kv.txn(compare, success, failure, kind=kind))

    def range_page(
        self, start: str, end: str, *, limit: int = 0, revision: int = 0
    ) -> Done[tuple[list[KV], int]]:
        """``EtcdKV.range_page``, made now."""
        return Done(self._kv.range_page(start, end, limit=limit, revision=revision))

    def txn_many(self, txns: Sequence[NestedTxn]) -> Done[list[TxnResult]]:
        """``EtcdKV.txn_many``, made now."""
        return Done(self._kv.txn_many(txns))

    def keepalive_many(self, lease_ids: Iterable[int]) -> Done[dict[int, int]]:
        """``EtcdKV.keepalive_many``, made now."""
        return Done(self._kv.keepalive_many(lease_ids))

    def lease(self, ttl: int) -> Done[ClaimLease]:
        """``ClaimLeases.acquire``, made now."""
        return Done(self._leases.acquire(ttl))

    def release(self, lease_id: int) -> Done[None]:
        """``ClaimLeases.release``, made now."""
        self._leases.release(lease_id)
        return Done(None)


def run_now(step: Coroutine[Any, Any, T]) -> T:
    """Drive ``step`` to its end on this thread; its awaits must all be ``Done``."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    step.close()
    raise RuntimeError(
        "a store step awaited something that waits; run_now drives only SyncStepIO's calls"
    )
