"""Stream abuse for the ``abuse`` scenario: a flood of WatchEvents follow streams, and a
consumer that never reads.

The flood opens follow streams on the run's queue from a few principals - one of them asking
for more than its per-principal cap - and opens each again whenever it ends (the replicas run
with a short maximum stream age), so the caps are contended all through the flood. Every open
is recorded (``OpKind.WATCH``): OK once its first event arrived (admitted), REFUSED with the
status code when the server refused it, ABANDONED when the flood stopped while it waited. The
checker holds every refusal to RESOURCE_EXHAUSTED (``stream_refusals``).

The non-reading consumer opens one follow stream of the whole log and reads nothing until the
heal: the server must not let it hold more than its one slot and thread, and must end it - at
its maximum age, or once its buffer stayed full (coordinator/server/streams.py). At the heal it
reads what its stream holds, to its end, and records how the server ended it
(``OpKind.UNREAD``: ENDED with ``max_age`` or ``behind``); the checker holds it to that
(``unread_streams``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import grpc

from chaos.history import End, Observed, OpKind, Recorder
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc

Metadata = tuple[tuple[str, str | bytes], ...]

REOPEN_DELAY = 0.2
"""Seconds between a flood stream's end (or refusal) and its next open."""


class StreamFlood:
    """``streams[principal]`` follow streams per principal, each reopened until ``stop()``."""

    def __init__(
        self,
        channel: grpc.Channel,
        queue: str,
        streams: Mapping[str, int],
        metadata: Callable[[str], Metadata],
        rec: Recorder,
    ) -> None:
        self._stub = tasks_pb2_grpc.TaskServiceStub(channel)
        self._queue = queue
        self._metadata = metadata
        self._rec = rec
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._calls: set[grpc.Call] = set()
        self._threads = [
            threading.Thread(target=self._slot, args=(principal,), daemon=True)
            for principal, n in streams.items()
            for _ in range(n)
        ]

    def start(self) -> StreamFlood:
        """Open every stream (a thread each: each reads what it is sent)."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Cancel every open stream and end the threads."""
        self._stopping.set()
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            call.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
        for thread in self._threads:
            thread.join(timeout=10)

    def _slot(self, principal: str) -> None:
        while not self._stopping.is_set():
            self._open_once(principal)
            self._stopping.wait(REOPEN_DELAY)

    def _open_once(self, principal: str) -> None:
        request = tasks_pb2.WatchEventsRequest(queue=self._queue, follow=True)
        op = self._rec.invoke(OpKind.WATCH, task="", principal=principal)
        with self._rec.bound(op):
            call = self._stub.WatchEvents(request, metadata=self._metadata(principal))
        with self._lock:
            self._calls.add(call)
        admitted = False
        try:
            if self._stopping.is_set():  # stop() came before this call was registered
                call.cancel()  # type: ignore[no-untyped-call]
            for _ in call:
                if not admitted:
                    admitted = True
                    self._rec.complete(op, End.OK, Observed.OK)
        except grpc.RpcError as exc:
            if not admitted:
                self._refused(op, exc)
        finally:
            with self._lock:
                self._calls.discard(call)

    def _refused(self, op: str, exc: grpc.RpcError) -> None:
        if self._stopping.is_set() and exc.code() is grpc.StatusCode.CANCELLED:
            self._rec.complete(op, End.FAIL, Observed.ABANDONED)
            return
        message = (exc.details() or "")[:200]
        self._rec.complete(op, End.FAIL, Observed.REFUSED, reason=exc.code().name, message=message)


DRAIN_SECONDS = 15.0
"""How long the non-reader may take, at the heal, to read its stream to the server's end of it:
an ended stream holds at most a flow-control window of events, read in well under a second."""


class NonReader:
    """One follow stream of the whole log whose caller reads nothing until ``finish()``."""

    def __init__(
        self, channel: grpc.Channel, queue: str, metadata: Metadata, rec: Recorder
    ) -> None:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        request = tasks_pb2.WatchEventsRequest(queue=queue, follow=True)
        self._rec = rec
        self._op = rec.invoke(OpKind.UNREAD, task="")
        # gRPC Python receives a message only when the iterator is advanced: not advancing it
        # leaves the server's sends to fill the flow-control window and then block.
        with rec.bound(self._op):
            self._call = stub.WatchEvents(request, metadata=metadata)

    def finish(self) -> None:
        """Read the stream to its end and record how the server ended it; a stream still open
        ``DRAIN_SECONDS`` later is cancelled and recorded as such (the checker reports it)."""
        ended: list[grpc.RpcError] = []

        def drain() -> None:
            try:
                for _ in self._call:
                    pass
            except grpc.RpcError as exc:
                ended.append(exc)

        reader = threading.Thread(target=drain, name="chaos-non-reader", daemon=True)
        reader.start()
        reader.join(DRAIN_SECONDS)
        if reader.is_alive():
            self._call.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
            reader.join(5)
            self._rec.complete(self._op, End.FAIL, Observed.ABANDONED, reason="still open")
            return
        how = ended_by(ended[0]) if ended else "OK"
        message = (ended[0].details() or "")[:200] if ended else ""
        self._rec.complete(self._op, End.OK, Observed.ENDED, reason=how, message=message)


def ended_by(exc: grpc.RpcError) -> str:
    """Which bound ended a stream, from its status: ``max_age`` (UNAVAILABLE), ``behind``
    (RESOURCE_EXHAUSTED), else the status code's name."""
    details = exc.details() or ""
    if exc.code() is grpc.StatusCode.UNAVAILABLE and "maximum age" in details:
        return "max_age"
    if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "behind" in details:
        return "behind"
    return exc.code().name
