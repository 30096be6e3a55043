"""A thin, typed adapter over the ``etcd3`` client: transactions that report their revision.

The library's ``transaction()`` hides the response header, and the claim generation *is* that
header's revision, so transactions go through the client's generated KV stub directly: a call
the client lacks is made through its stubs, never through a client of our own. Every gRPC error
is translated here, once: an outage into StoreUnavailable, a request etcd refused into
StoreRefused; callers never see grpc or etcd3 exceptions. What a txn is built of (compares,
ops, nested txns) is ``ops.py``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import etcd3
import grpc
from etcd3 import etcdrpc, utils

from coordinator.domain.live_claims import LeaseReading
from coordinator.domain.space import SpaceState, WriteKind
from coordinator.errors import LeaseGone, StoreRefused, StoreUnavailable
from coordinator.store.etcd.group_commit import (
    MAX_BATCH_BYTES,
    MAX_TXN_OPS,
    GroupCommit,
    in_order_runs,
)
from coordinator.store.etcd.keepalive import LeaseKeepalives
from coordinator.store.etcd.nospace_reads import answer_by_ranges
from coordinator.store.etcd.ops import KV, Compare, NestedTxn, RequestOp, TxnResult, get, kv_of
from coordinator.store.etcd.space_guard import SpaceGuard
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent


class EtcdKV:
    """The coordinator's view of etcd: txns, ranges, leases and watches."""

    def __init__(
        self, client: Any, *, timeout: float = 5.0, space: SpaceGuard | None = None
    ) -> None:
        self._client = client
        self._timeout = timeout
        # Every txn passes the space guard on its way out (_send_txn), nested or not.
        self.space = space if space is not None else SpaceGuard()
        # Concurrent txns of this process share round trips (store/etcd/group_commit.py).
        self._batcher = GroupCommit(self._send_txn)
        self._keepalives = LeaseKeepalives()
        self._before: Callable[[], None] | None = None

    @classmethod
    def connect(
        cls,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> EtcdKV:
        """Connect to one or more ``host:port`` endpoints, failing over between them."""
        creds = None
        if ca_cert:
            creds = etcd3.MultiEndpointEtcd3Client.get_secure_creds(ca_cert, cert_key, cert_cert)
        eps = []
        for endpoint in endpoints:
            host, _, port = endpoint.rpartition(":")
            eps.append(
                etcd3.Endpoint(
                    host or "127.0.0.1",
                    int(port),
                    secure=creds is not None,
                    creds=creds,
                    time_retry=2.0,
                    # etcd is reached directly; an $http_proxy meant for the web must not apply.
                    opts=[("grpc.enable_http_proxy", 0)],
                )
            )
        try:
            client = etcd3.MultiEndpointEtcd3Client(
                endpoints=eps, timeout=timeout, user=user, password=password, failover=True
            )
        except grpc.RpcError as exc:
            raise StoreUnavailable(
                f"cannot connect to etcd at {','.join(endpoints)}: {exc}"
            ) from exc
        return cls(client, timeout=timeout)

    def close(self) -> None:
        """Close the channels."""
        self._keepalives.close()
        self._client.close()

    def paced(self, take: Callable[[], None]) -> EtcdKV:
        """This connection (same channels, same group commit), every txn and range made
        through the copy first calling ``take`` (a Pacer's: background work's share of etcd)."""
        twin = copy.copy(self)
        twin._before = take
        return twin

    def txn(
        self,
        compare: Iterable[Compare],
        success: Iterable[RequestOp] = (),
        failure: Iterable[RequestOp] = (),
        *,
        kind: WriteKind = WriteKind.DRAIN,
    ) -> TxnResult:
        """Run one etcd transaction; a ``kind`` of GROWTH (it only adds data) is refused above
        the space guard's high-water mark (SpaceRefused, nothing sent)."""
        request = etcdrpc.TxnRequest(
            compare=list(compare), success=list(success), failure=list(failure)
        )
        if kind is not WriteKind.DRAIN:
            self.space.admit(kind)
        return self._batched(request)

    def _batched(self, request: Any) -> TxnResult:
        """``request`` (a TxnRequest), paced, through group commit."""
        if self._before is not None:
            self._before()
        outcome = self._batcher.txn(request)
        return TxnResult(outcome.succeeded, outcome.revision, outcome.responses)

    def txn_many(self, txns: Sequence[NestedTxn]) -> list[TxnResult]:
        """Run independent txns (the caller's promise: none writes a key another compares, reads
        or writes) in as few round trips as etcd's limits allow, each nested in a batch txn as
        group commit nests them (store/etcd/group_commit.py) and answered as if it ran alone."""
        results: list[TxnResult] = []
        for chunk in _chunks(txns):
            results += self._send_nested([txn.op for txn in chunk])
        return results

    def txn_in_order(
        self, txns: Sequence[tuple[Sequence[Compare], Sequence[RequestOp]]]
    ) -> list[TxnResult]:
        """Run ``txns`` (compares, success ops) with the effect of one after another in their
        order, in as few round trips as group commit's conflict rule and etcd's limits allow:
        the background work of a page (the pruner's prunes) in one request, not one each. Each
        txn takes its own pacing slot, as it would alone."""
        requests = [etcdrpc.TxnRequest(compare=list(c), success=list(ops)) for c, ops in txns]
        results: list[TxnResult] = []
        for run in in_order_runs(requests):
            if len(run) == 1:
                results.append(self._batched(requests[run[0]]))
                continue
            for _ in run:
                if self._before is not None:
                    self._before()
            results += self._send_nested([etcdrpc.RequestOp(request_txn=requests[i]) for i in run])
        return results

    def _send_nested(self, txns: list[RequestOp]) -> list[TxnResult]:
        """``txns`` (RequestOps each holding a txn) nested in one batch txn."""
        if len(txns) == 1:
            return [self._one(txns[0].request_txn)]
        batch = etcdrpc.TxnRequest(success=txns)
        try:
            response = self._send_txn(batch)
        except StoreRefused:  # etcd refused the batch (a lower --max-txn-ops): one by one
            return [self._one(txn.request_txn) for txn in txns]
        revision = int(response.header.revision)
        return [
            TxnResult(bool(op.response_txn.succeeded), revision, list(op.response_txn.responses))
            for op in response.responses
        ]

    def _one(self, request: Any) -> TxnResult:
        response = self._send_txn(request)
        return TxnResult(
            bool(response.succeeded), int(response.header.revision), list(response.responses)
        )

    def _send_txn(self, request: Any) -> Any:
        # The one door to etcd's Txn: at NOSPACE nothing that puts goes through, however deeply
        # nested (etcd's own quota check prices top-level puts only); what only compares and
        # reads is answered by Range reads if etcd refuses it (etcd 3.5.0-3.5.6 refuse every
        # txn at NOSPACE: store/etcd/nospace_reads.py).
        self.space.admit_txn(request)
        return self._call(
            "txn",
            lambda: self._client.kvstub.Txn(request, self._timeout, **self._auth()),
            nospace=lambda: answer_by_ranges(request, self._send_range),
        )

    def _send_range(self, request: Any) -> Any:
        return self._call(
            "range", lambda: self._client.kvstub.Range(request, self._timeout, **self._auth())
        )

    def read(self, *ops: RequestOp) -> TxnResult:
        """Several reads at one consistent revision (a compare-less txn)."""
        return self.txn((), ops)

    def get(self, key: str) -> KV | None:
        """One key, or None."""
        return self.read(get(key)).range_one(0)

    def range_page(
        self, start: str, end: str, *, limit: int = 0, revision: int = 0, keys_only: bool = False
    ) -> tuple[list[KV], int]:
        """Keys in ``[start, end)`` in key order (at most ``limit``; 0: all), read at
        ``revision`` (0: the latest). Returns the keys and the revision they were read at."""
        request = etcdrpc.RangeRequest(
            key=start.encode(),
            range_end=end.encode(),
            limit=limit,
            revision=revision,
            keys_only=keys_only,
        )
        if self._before is not None:
            self._before()
        response = self._send_range(request)
        read_at = revision or int(response.header.revision)
        return [kv_of(kv) for kv in response.kvs], read_at

    def prefix_end(self, prefix: str) -> str:
        """The end of the range that covers every key starting with ``prefix``."""
        return str(utils.prefix_range_end(prefix.encode()).decode())

    def grant(self, ttl: int) -> tuple[int, int]:
        """Grant a lease of ``ttl`` seconds; returns its id and the TTL etcd actually granted
        (etcd raises TTLs below its own minimum, about 2 s with default election settings)."""
        self.space.admit(WriteKind.DRAIN, puts=True)  # etcd refuses grants at NOSPACE too
        request = etcdrpc.LeaseGrantRequest(TTL=ttl, ID=0)
        response = self._call(
            "lease grant",
            lambda: self._client.leasestub.LeaseGrant(request, self._timeout, **self._auth()),
        )
        return int(response.ID), int(response.TTL)

    def keepalive_many(self, lease_ids: Iterable[int]) -> dict[int, int]:
        """Refresh several leases over one LeaseKeepAlive stream (etcd answers each request in
        turn, store/etcd/keepalive.py); each lease's new TTL, 0 for a lease that is gone."""
        ids = list(dict.fromkeys(lease_ids))
        if not ids:
            return {}
        endpoint = self._client.endpoint_in_use

        def call() -> dict[int, int]:
            return self._keepalives.refresh(
                endpoint.netloc,
                endpoint.credentials,
                ids,
                timeout=self._timeout,
                metadata=self._client.metadata,
                call_credentials=self._client.call_credentials,
            )

        try:
            ttls: dict[int, int] = self._call("lease keepalive", call)
        except TimeoutError as exc:  # the stream's own deadline passed without a status
            message = f"etcd lease keepalive timed out after {self._timeout} s"
            raise StoreUnavailable(message) from exc
        return {lease_id: ttls.get(lease_id, 0) for lease_id in ids}

    def lease_readings(self, lease_ids: Sequence[int]) -> list[LeaseReading | None]:
        """etcd's LeaseTimeToLive of each lease, asked all at once (one round trip's time for
        a page of claims): granted TTL and whole seconds left, None for a lease etcd no longer
        has."""
        pending = [
            self._client.leasestub.LeaseTimeToLive.future(
                etcdrpc.LeaseTimeToLiveRequest(ID=lease_id, keys=False),
                self._timeout,
                **self._auth(),
            )
            for lease_id in lease_ids
        ]
        return [self._call("lease time-to-live", _reading(call)) for call in pending]

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys are deleted); a lease already gone is not an error."""
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self._client.leasestub.LeaseRevoke(request, self._timeout, **self._auth())
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            self._translate("lease revoke", exc)

    def db_size(self) -> int:
        """The database size (bytes) of the etcd member this client talks to (Status RPC:
        ``dbSize``, what ``--quota-backend-bytes`` is compared with)."""
        return self.db_status()[0]

    def db_status(self) -> tuple[int, int, str]:
        """The member's database size (bytes), the cluster's current revision and the member's
        etcd version (Status)."""
        request = etcdrpc.StatusRequest()
        response = self._call(
            "status",
            lambda: self._client.maintenancestub.Status(request, self._timeout, **self._auth()),
        )
        return int(response.dbSize), int(response.header.revision), str(response.version)

    def compact(self, revision: int) -> bool:
        """Compact etcd's history up to ``revision`` (old values of keys become free pages that
        new writes reuse); False if etcd had already compacted past it. StoreRefused when etcd
        will not let this user compact (an etcd with auth keeps it to root)."""
        request = etcdrpc.CompactionRequest(revision=revision, physical=False)
        try:
            self._call(
                "compact",
                lambda: self._client.kvstub.Compact(request, self._timeout, **self._auth()),
            )
        except StoreRefused as exc:
            if "compacted" in str(exc):
                return False
            raise
        return True

    def nospace_alarm(self) -> bool:
        """Whether etcd's NOSPACE alarm is raised (on any member: etcd keeps one alarm list)."""
        request = etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET, memberID=0)
        response = self._call(
            "alarm list",
            lambda: self._client.maintenancestub.Alarm(request, self._timeout, **self._auth()),
        )
        return any(alarm.alarm == etcdrpc.NOSPACE for alarm in response.alarms)

    def watch_prefix(
        self,
        prefix: str,
        *,
        start_revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_compacted: Callable[[], None],
        deletes_only: bool = False,
        range_end: str = "",
    ) -> PrefixWatch:
        """Follow every change (or, with ``deletes_only``, every deletion) under ``prefix`` (or,
        with ``range_end``, in [prefix, range_end)) from ``start_revision`` (see
        store/etcd/watch.py)."""
        return PrefixWatch(
            self._client,
            prefix,
            start_revision=start_revision,
            on_events=on_events,
            on_compacted=on_compacted,
            deletes_only=deletes_only,
            range_end=range_end,
        ).start()

    def _auth(self) -> dict[str, Any]:
        return {"credentials": self._client.call_credentials, "metadata": self._client.metadata}

    def _call(
        self, what: str, fn: Callable[[], Any], *, nospace: Callable[[], Any] | None = None
    ) -> Any:
        """``fn()``, etcd's errors as ours; on etcd's NOSPACE refusal, ``nospace()``'s answer
        instead if it has one (not None)."""
        try:
            return fn()
        except grpc.RpcError as exc:
            if nospace is not None and _is_nospace(exc):
                answer = nospace()
                if answer is not None:
                    self.space.observe(SpaceState.NOSPACE)
                    return answer
            self._translate(what, exc)
        except etcd3.exceptions.NoServerAvailableError as exc:
            # The client's own words ("No endpoint available and not failed") read as if all
            # were well: every endpoint it knows is marked failed after an error.
            raise StoreUnavailable(
                f"etcd {what} failed: no etcd endpoint is reachable (etcd is down, or not "
                "reachable from this replica)"
            ) from exc
        except etcd3.exceptions.Etcd3Exception as exc:
            raise StoreUnavailable(f"etcd {what} failed: {type(exc).__name__}: {exc}") from exc

    def _translate(self, what: str, exc: grpc.RpcError) -> None:
        code = exc.code()
        if code is grpc.StatusCode.NOT_FOUND and "lease not found" in (exc.details() or ""):
            raise LeaseGone(f"etcd refused {what}: {exc.details()}") from exc
        if _is_nospace(exc):
            # The alarm went up between two readings: trip the guard now, answer typed.
            raise self.space.tripped() from exc
        if code not in _TRANSIENT:
            # etcd refused the request itself (a malformed txn, auth, quota): retrying the same
            # request cannot help, so it must not look like an outage.
            raise StoreRefused(f"etcd refused {what}: {code.name}: {exc.details()}") from exc
        # The client's own handler marks the endpoint failed, so the next call fails over to
        # another member; it then raises its own exception, which we replace with ours.
        with contextlib.suppress(Exception):
            self._client._manage_grpc_errors(exc)
        raise StoreUnavailable(f"etcd {what} failed: {code.name}: {exc.details()}") from exc


_NOSPACE = "database space exceeded"  # etcd's ErrNoSpace ("etcdserver: mvcc: ...")


def _is_nospace(exc: grpc.RpcError) -> bool:
    return exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and _NOSPACE in (exc.details() or "")


_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def _chunks(txns: Sequence[NestedTxn]) -> Iterator[list[NestedTxn]]:
    """``txns`` in runs that fit one nested txn: a run of n txns leaves each of them
    MAX_TXN_OPS - n operations per branch (etcd's ``checkTxnRequest``), and the whole stays
    below MAX_BATCH_BYTES."""
    run: list[NestedTxn] = []
    largest = size = 0
    for txn in txns:
        if run and (
            len(run) + 1 + max(largest, txn.ops) > MAX_TXN_OPS
            or size + txn.nbytes > MAX_BATCH_BYTES
        ):
            yield run
            run, largest, size = [], 0, 0
        run.append(txn)
        largest, size = max(largest, txn.ops), size + txn.nbytes
    if run:
        yield run


def _reading(call: Any) -> Callable[[], LeaseReading | None]:
    """The answer of a pending LeaseTimeToLive (TTL -1, or NOT_FOUND: the lease is gone)."""

    def result() -> LeaseReading | None:
        try:
            response = call.result()
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise
        if int(response.TTL) < 0:
            return None
        return LeaseReading(granted=int(response.grantedTTL), remaining=int(response.TTL))

    return result
