"""The event log: a page of past events, newest first (ListEvents; "older" pages back from the
oldest shown, "newest" returns to the top), and on the newest page a live server-sent-events
stream whose events the page's script puts on top as they happen.

The stream is WatchEvents with follow, made with the viewer's credentials. Each SSE message's
id is the event's position, so when a stream ends (the server closes it after
``stream_seconds``, the network drops) the browser reconnects with Last-Event-ID and the stream
resumes strictly after the last event it showed: nothing lost, nothing repeated."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from coordinator.console import session, views
from coordinator.console.routes.common import Console, Context, console_of
from coordinator.console.settings import ConsoleSettings
from coordinator.errors import CoordinatorError
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.types import TransportError
from coordinator.v1 import tasks_pb2


def _request(request: Request, *, follow: bool, after: str) -> tasks_pb2.WatchEventsRequest:
    """The WatchEvents request of the page's filters (InvalidArgument for a bad position)."""
    watch = tasks_pb2.WatchEventsRequest(
        task_id=request.query_params.get("task", "")[:128],
        queue=request.query_params.get("queue", "")[:64],
        follow=follow,
    )
    if after:
        watch.after.CopyFrom(views.parse_position(after))
    return watch


def events(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """One page of events newest first, before ``before`` (the newest without it)."""
    before = request.query_params.get("before", "")
    listed = tasks_pb2.ListEventsRequest(
        task_id=request.query_params.get("task", "")[:128],
        queue=request.query_params.get("queue", "")[:64],
        page_size=settings.page_size,
    )
    if before:
        listed.before.CopyFrom(views.parse_position(before))
    reply = rpc.call(rpc.tasks.ListEvents, listed)
    found = list(reply.events)
    return {
        "events": found,
        "older": views.position_text(reply.next_before) if reply.HasField("next_before") else "",
        "before": before,
        # The live stream starts after the newest event shown (the whole log when none is).
        "newest": views.position_text(found[0].position) if found else "",
        "task": listed.task_id,
        "queue": listed.queue,
    }


def event_data(event: tasks_pb2.TaskEvent) -> str:
    """One event as the JSON a live row is built from."""
    return json.dumps(
        {
            "at": views.when(event.at),
            "task_id": event.task_id,
            "op": event.op,
            "from": views.name(event.from_state, "state"),
            "to": views.name(event.to_state, "state"),
            "by": event.by,
            "generation": event.claim_generation,
            "epoch": event.scheduler_epoch,
            "detail": event.detail,
            "position": views.position_text(event.position),
        }
    )


def _no_room(console: Console, who: str, label: str) -> Response | None:
    """The 503 of a stream past the console's bound, or past one person's share of it."""
    if console.streams >= console.settings.max_streams:
        return PlainTextResponse("too many live streams open; retrying shortly", 503)
    if console.streams_of[who] >= console.settings.max_streams_per_user:
        return PlainTextResponse(
            f"{label} has {console.streams_of[who]} live streams open, the most one person may: "
            "close another tab's live view; retrying shortly",
            503,
        )
    return None


async def stream(request: Request) -> Response:
    """``text/event-stream`` of new events (resumes after Last-Event-ID or ``after``)."""
    credentials = session.current(request, console_of(request).signed_out)
    if credentials is None:
        return PlainTextResponse("sign in first", 401)
    console = console_of(request)
    after = request.headers.get("last-event-id") or request.query_params.get("after", "")
    try:
        watch = _request(request, follow=True, after=after)
    except CoordinatorError as exc:
        return PlainTextResponse(str(exc), 400)
    # One person: their token (a token's principal is the server's to know), else their name.
    who = credentials.token or credentials.principal
    full = _no_room(console, who, credentials.label)
    if full is not None:
        return full
    console.streams += 1
    console.streams_of[who] += 1

    async def messages() -> AsyncIterator[str]:
        try:
            # Tell the browser how soon to reconnect when the stream ends (it always does).
            yield "retry: 1000\n\n"
            gateway = console.gateway
            timeout = console.settings.stream_seconds
            with gateway.watch(credentials, watch, timeout=timeout) as events:
                while True:
                    try:
                        event = await anyio.to_thread.run_sync(
                            _next, events, abandon_on_cancel=True
                        )
                    except TransportError:
                        return  # the server went away: the browser reconnects and resumes
                    except CoordinatorError as exc:
                        # A refusal is final (no reconnect): the page shows it and stops.
                        yield f"event: refused\ndata: {json.dumps(str(exc))}\n\n"
                        return
                    if event is None:
                        return
                    position = views.position_text(event.position)
                    yield f"id: {position}\nevent: task\ndata: {event_data(event)}\n\n"
        finally:
            console.streams -= 1
            console.streams_of[who] -= 1
            if not console.streams_of[who]:
                del console.streams_of[who]

    return StreamingResponse(messages(), media_type="text/event-stream")


def _next(events: Iterator[tasks_pb2.TaskEvent]) -> tasks_pb2.TaskEvent | None:
    return next(events, None)
