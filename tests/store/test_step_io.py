"""The claim, commit and renewal written once as coroutines (store/etcd/step_io.py).

The sync server runs them with ``run_now`` over ``SyncStepIO``; an asyncio server will await
them with a ``StepIO`` that really waits. These tests pin both halves: ``run_now`` drives only
what never suspends, and the coroutines, awaited on an event loop through an IO that yields to
the loop before every call, make every etcd call of a claim, a commit and a RenewMany through
that IO and answer as the sync path does.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.space import WriteKind
from coordinator.domain.states import FenceReason, Outcome, TaskState
from coordinator.errors import NotFound
from coordinator.store import RenewResult, Store
from coordinator.store.attempts.acceptance import CommitWrite
from coordinator.store.attempts.renew_plans import Renewal
from coordinator.store.etcd.leases import ClaimLease
from coordinator.store.etcd.ops import KV, Compare, NestedTxn, RequestOp, TxnResult, get
from coordinator.store.etcd.step_io import Done, run_now
from tests.store.support import RESULT, RESULT_DIGEST, StoreFactory, create, raw


async def _two_done() -> int:
    first = await Done(1)
    return first + await Done(2)


async def _suspends() -> int:
    await asyncio.sleep(0)
    return 1


async def _raises() -> int:
    await Done(None)
    raise NotFound("task 't9' does not exist")


def test_run_now_drives_awaits_of_done_values_and_passes_exceptions_through() -> None:
    assert run_now(_two_done()) == 3
    with pytest.raises(NotFound, match="t9"):
        run_now(_raises())


def test_run_now_refuses_a_coroutine_that_would_suspend() -> None:
    step = _suspends()
    with pytest.raises(RuntimeError, match="awaited something that waits"):
        run_now(step)
    # Closed: no "never awaited" warning, nothing left running.
    assert inspect.getcoroutinestate(step) == inspect.CORO_CLOSED


class _Suspending:
    """A StepIO that yields to the event loop before every call, then makes it with the
    replica's own kv and leases (bound before the test forbids the sync path)."""

    def __init__(self, store: Store) -> None:
        kv, leases = store.ctx.kv, store.ctx.leases
        self._txn, self._range = kv.txn, kv.range_page
        self._txn_many, self._keepalive_many = kv.txn_many, kv.keepalive_many
        self._acquire, self._release = leases.acquire, leases.release
        self.calls: list[str] = []

    async def _turn(self, call: str) -> None:
        await asyncio.sleep(0)
        self.calls.append(call)

    async def read(self, *ops: RequestOp) -> TxnResult:
        await self._turn("read")
        return self._txn((), ops)

    async def get(self, key: str) -> KV | None:
        await self._turn("get")
        return self._txn((), [get(key)]).range_one(0)

    async def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[RequestOp] = (),
        failure: Iterable[RequestOp] = (),
        *,
        kind: WriteKind = WriteKind.DRAIN,
    ) -> TxnResult:
        await self._turn("txn")
        return self._txn(compare, success, failure, kind=kind)

    async def range_page(
        self, start: str, end: str, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KV], int]:
        await self._turn("range")
        return self._range(start, end, limit=limit, revision=revision)

    async def txn_many(self, txns: Sequence[NestedTxn]) -> list[TxnResult]:
        await self._turn("txns")
        return self._txn_many(txns)

    async def keepalive_many(self, lease_ids: Iterable[int]) -> dict[int, int]:
        await self._turn("keepalive")
        return self._keepalive_many(lease_ids)

    async def lease(self, ttl: int) -> ClaimLease:
        await self._turn("lease")
        return self._acquire(ttl)

    async def release(self, lease_id: int) -> None:
        await self._turn("release")
        self._release(lease_id)


def _forbid_sync_calls(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync kv and leases refuse this thread (the event loop's); the store's background
    loops, on their own threads, go on using them."""
    loop_thread = threading.get_ident()

    def forbidden(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == loop_thread:
                raise AssertionError("a store coroutine called etcd around its StepIO")
            return original(*args, **kwargs)

        return call

    for owner, names in (
        (store.ctx.kv, ("txn", "read", "get", "range_page", "txn_many", "keepalive_many")),
        (store.ctx.leases, ("acquire", "release")),
    ):
        for name in names:
            monkeypatch.setattr(owner, name, forbidden(getattr(owner, name)))


def test_claim_next_and_commit_awaited_on_a_loop_make_every_etcd_call_through_their_io(
    make_store: StoreFactory, etcd_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    create(store, "t1")
    io = _Suspending(store)
    _forbid_sync_calls(store, monkeypatch)
    write = CommitWrite("w1", digest_of(b"input of t1"), RESULT_DIGEST, RESULT, "", ())

    async def cycle() -> tuple[Any, Any, list[str], int]:
        claimed = await store.claims.aclaim_next(io, "default", principal="w1", epoch=1, ttl=30)
        assert claimed.fence is not None
        claim_key = raw(etcd_client, store.ctx.keys.claim("t1")).create_revision
        claim_calls = list(io.calls)
        io.calls.clear()
        committed = await store.acceptance.acommit(io, claimed.fence, write)
        return claimed, committed, claim_calls, claim_key

    claimed, committed, claim_calls, claim_key = asyncio.run(cycle())
    monkeypatch.undo()

    assert claimed.verdict.outcome is Outcome.CLAIMED
    # The generation is the claim txn's revision: the claim key's create_revision.
    assert claimed.fence.claim_generation == claim_key
    assert claim_calls == ["read", "lease", "txn"]
    # The claiming replica commits on what its claim txn wrote: no read, one txn, the lease back.
    assert io.calls == ["txn", "release"]
    assert committed.verdict.outcome is Outcome.COMMITTED
    assert committed.state is TaskState.DONE
    assert store.tasks.get("t1").state is TaskState.DONE


def test_a_retried_commit_awaited_on_a_loop_replays_from_a_read(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    create(store, "t1")
    claimed = store.claims.claim("t1", principal="w1", epoch=1, ttl=30)
    assert claimed.fence is not None
    write = CommitWrite("w1", digest_of(b"input of t1"), RESULT_DIGEST, RESULT, "", ())
    first = store.acceptance.commit(
        claimed.fence,
        principal="w1",
        input_digest=write.input_digest,
        result_digest=RESULT_DIGEST,
        result=RESULT,
        result_ref="",
    )
    io = _Suspending(store)
    _forbid_sync_calls(store, monkeypatch)
    again = asyncio.run(store.acceptance.acommit(io, claimed.fence, write))
    monkeypatch.undo()

    assert first.verdict.outcome is Outcome.COMMITTED and first.result_commit_id
    # The view and the canonical result's keys in one read, then the result itself; no txn.
    assert io.calls == ["read", "read"]
    assert (again.verdict.outcome, again.result_commit_id) == (
        Outcome.COMMITTED,
        first.result_commit_id,
    )


def test_renew_many_awaited_on_a_loop_makes_every_etcd_call_through_its_io(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    for name in ("t1", "t2"):
        create(store, name)
    fences = []
    for name in ("t1", "t2"):
        fence = store.claims.claim(name, principal="w1", epoch=1, ttl=30).fence
        assert fence is not None
        fences.append(fence)
    ghost = replace(fences[0], task_id="ghost", claim_generation=10**9)  # beyond etcd's revision
    io = _Suspending(store)
    _forbid_sync_calls(store, monkeypatch)
    renewals = [Renewal(f) for f in (*fences, ghost)]
    answers = asyncio.run(store.renewals.arenew_many(io, renewals, principal="w1"))
    monkeypatch.undo()

    verdicts = [a.verdict for a in answers if isinstance(a, RenewResult)]
    assert [v.outcome for v in verdicts] == [Outcome.OK, Outcome.OK, Outcome.FENCED]
    assert verdicts[2].reason is FenceReason.NONE  # screened: it named no claim
    # The screen's one read of etcd's revision; the claims' views are the ones this replica's
    # claims wrote (no read); their txns together, the keepalive stream, the fences again.
    assert io.calls == ["read", "txns", "keepalive", "txns"]
