"""TaskService: producers create, inspect, list, cancel and change tasks; reviewers accept or
reject them; producers shape the dependency graph; anyone follows the event log.

Thin like the other servicers: validate the whole request, call the store (``tasks``,
``results``, ``review``, ``dependencies``, ``events``), convert the records. The contract is in
protos/coordinator/v1/tasks.proto. Roles (who may call what) are the auth interceptor's; the
business rule that a reviewer is not the executor is the domain's (domain/review.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from coordinator.domain.positions import StreamBehind
from coordinator.domain.records import TaskRecord
from coordinator.logging import note
from coordinator.server.identity import principal_of
from coordinator.server.interceptors import stream_interceptor
from coordinator.server.status import rpc, stream_rpc
from coordinator.server.wire import (
    claim_wire,
    event_wire,
    page_tokens,
    queue_wire,
    task_wire,
)
from coordinator.server.wire import task_requests as requests
from coordinator.store import Store
from coordinator.store.lifecycle.task_list import PAGE_BYTES
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2

GET_TASK_ATTEMPTS = 20
"""Attempts GetTask returns at most (the latest): it must answer within gRPC's message limit
whatever a task's history (12,000 attempts did not)."""


class TaskService(tasks_pb2_grpc.TaskServiceServicer):
    """Producer-side calls onto ``store.tasks`` (method names are the proto's: noqa N802)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _answered(self, task: TaskRecord) -> types_pb2.Task:
        """A task an answer carries, with its input (schema 2 keeps it in a key of its own)."""
        return task_wire.task_to_proto(self._store.tasks.with_input(task))

    @rpc
    def CreateTask(  # noqa: N802
        self, request: tasks_pb2.CreateTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.CreateTaskResponse:
        """Create a task: READY, or WAITING on its dependencies."""
        spec = requests.parse_create_task(request, now=time.time())
        principal = principal_of(context)
        task = self._store.tasks.create(spec, by=principal)
        note(
            task_id=task.task_id,
            queue=task.queue,
            input_digest=task.input_digest,
            state=task.state.name,
            root=task.root_task_id,
            depends_on=list(task.depends_on),
        )
        return tasks_pb2.CreateTaskResponse(task=task_wire.task_to_proto(task))

    @rpc
    def GetTask(  # noqa: N802
        self, request: tasks_pb2.GetTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.GetTaskResponse:
        """The task and its latest attempts (bounded: ListAttempts pages through all)."""
        tid = requests.parse_get_task(request)
        task = self._store.tasks.get(tid)
        first = max(1, task.attempt - GET_TASK_ATTEMPTS + 1)
        attempts = self._store.tasks.attempts(tid, first=first, count=GET_TASK_ATTEMPTS)
        return tasks_pb2.GetTaskResponse(
            task=task_wire.task_with_attempts_to_proto(task, attempts),
            attempts=[task_wire.attempt_to_proto(a) for a in attempts],
            attempt_count=task.attempt,
        )

    @rpc
    def ListAttempts(  # noqa: N802
        self, request: tasks_pb2.ListAttemptsRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListAttemptsResponse:
        """One page of a task's attempts, oldest first."""
        page = requests.parse_list_attempts(request)
        tid = page.task_id
        task = self._store.tasks.get(tid)
        attempts, following = self._store.tasks.attempts_page(
            tid, first=page.first, count=page.page_size, max_bytes=PAGE_BYTES
        )
        position = str(following) if following <= task.attempt else ""
        return tasks_pb2.ListAttemptsResponse(
            attempts=[task_wire.attempt_to_proto(a) for a in attempts],
            next_page_token=page_tokens.issue("ListAttempts", {"task_id": tid}, position),
        )

    @rpc
    def ListTasks(  # noqa: N802
        self, request: tasks_pb2.ListTasksRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListTasksResponse:
        """One page of tasks in id order (summaries without inputs unless asked)."""
        page = requests.parse_list_tasks(request)
        tasks, position = self._store.tasks.list(
            queue=page.queue,
            state=page.state,
            root=page.root,
            parent=page.parent,
            thread=page.thread,
            blocked=page.blocked,
            overdue=page.overdue,
            page_size=page.page_size,
            page_token=page.page_token,
            include_input=page.include_input,
        )
        return tasks_pb2.ListTasksResponse(
            tasks=[task_wire.task_to_proto(t) for t in tasks],
            next_page_token=page_tokens.issue("ListTasks", page.filters, position),
        )

    @rpc
    def GetResult(  # noqa: N802
        self, request: tasks_pb2.GetResultRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.GetResultResponse:
        """The canonical result of one revision (0: the current one)."""
        tid, revision = requests.parse_get_result(request)
        result = self._store.results.get(tid, revision)
        return tasks_pb2.GetResultResponse(result=task_wire.result_to_proto(result))

    @rpc
    def CancelTask(  # noqa: N802
        self, request: tasks_pb2.CancelTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.CancelTaskResponse:
        """Cancel the task (with cascade, its WAITING graph too); a live claim's next
        acceptance point gets CANCELLED."""
        args = requests.parse_cancel_task(request)
        tid, reason = args.task_id, args.reason
        principal = principal_of(context)
        cascaded: list[str] = []
        if args.cascade:
            task, cascaded = self._store.cascade.cancel(tid, by=principal, reason=reason)
        else:
            task = self._store.tasks.cancel(tid, by=principal, reason=reason)
        note(
            task_id=tid,
            cancel_generation=task.cancel_generation,
            reason=reason,
            cascaded=len(cascaded),
        )
        return tasks_pb2.CancelTaskResponse(task=self._answered(task), cascaded=cascaded)

    @rpc
    def UpdateInput(  # noqa: N802
        self, request: tasks_pb2.UpdateInputRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.UpdateInputResponse:
        """Replace the input (revision + 1); a live claim's commit gets STALE_INPUT."""
        args = requests.parse_update_input(request)
        principal = principal_of(context)
        task = self._store.tasks.update_input(
            args.task_id,
            data=args.data,
            input_digest=args.input_digest,
            expected_revision=args.expected_revision,
            by=principal,
        )
        note(task_id=args.task_id, revision=task.revision, input_digest=args.input_digest)
        return tasks_pb2.UpdateInputResponse(task=task_wire.task_to_proto(task))

    @rpc
    def RetryTask(  # noqa: N802
        self, request: tasks_pb2.RetryTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.RetryTaskResponse:
        """Send a FAILED task back to READY with a fresh attempt budget."""
        args = requests.parse_retry_task(request)
        principal = principal_of(context)
        task = self._store.dead_letters.retry(
            args.task_id,
            by=principal,
            reason=args.reason,
            schedule_to_close=args.schedule_to_close,
        )
        note(task_id=args.task_id, state=task.state.name, attempt=task.attempt, reason=args.reason)
        return tasks_pb2.RetryTaskResponse(task=self._answered(task))

    @rpc
    def RetryTasks(  # noqa: N802
        self, request: tasks_pb2.RetryTasksRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.RetryTasksResponse:
        """Retry a queue's matching dead letters, one bounded page in id order."""
        args = requests.parse_retry_tasks(request)
        page = self._store.dead_letters.retry_many(
            args.picked,
            limit=args.limit,
            page_token=args.page_token,
            dry_run=args.dry_run,
            by=principal_of(context),
            reason=args.reason,
            schedule_to_close=args.schedule_to_close,
        )
        note(
            queue=args.picked.queue,
            retried=len(page.retried),
            skipped=len(page.skipped),
            dry_run=args.dry_run,
            next_page_token=page.next_page_token,
        )
        return queue_wire.bulk_retry_to_proto(page, args.filters)

    @rpc
    def Accept(  # noqa: N802
        self, request: tasks_pb2.AcceptRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.AcceptResponse:
        """Accept the committed result of one revision: REVIEW -> DONE."""
        tid, revision = requests.parse_accept(request)
        principal = principal_of(context)
        task = self._store.review.accept(tid, revision=revision, reviewer=principal)
        note(task_id=tid, revision=revision, state=task.state.name)
        return tasks_pb2.AcceptResponse(task=self._answered(task))

    @rpc
    def Reject(  # noqa: N802
        self, request: tasks_pb2.RejectRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.RejectResponse:
        """Reject the committed result of one revision: a new round, READY at revision + 1."""
        args = requests.parse_reject(request)
        tid, revision, reason = args.task_id, args.revision, args.reason
        principal = principal_of(context)
        task = self._store.review.reject(tid, revision=revision, reviewer=principal, reason=reason)
        note(task_id=tid, revision=revision, new_revision=task.revision, reason=reason)
        return tasks_pb2.RejectResponse(task=self._answered(task))

    @rpc
    def SetDependencies(  # noqa: N802
        self, request: tasks_pb2.SetDependenciesRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.SetDependenciesResponse:
        """Replace a READY or WAITING task's upstreams (cycle-checked atomically)."""
        args = requests.parse_set_dependencies(request)
        principal = principal_of(context)
        task = self._store.dependencies.set_dependencies(
            args.task_id,
            args.depends_on,
            expected_state_version=args.expected_state_version,
            by=principal,
        )
        note(task_id=args.task_id, depends_on=list(args.depends_on), state=task.state.name)
        return tasks_pb2.SetDependenciesResponse(task=self._answered(task))

    @rpc
    def ListClaims(  # noqa: N802
        self, request: tasks_pb2.ListClaimsRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListClaimsResponse:
        """One page of live claims with their leases as etcd reports them (read-only)."""
        args = requests.parse_list_claims(request)
        page = self._store.live_claims.page(
            queue=args.queue, page_size=args.page_size, page_token=args.page_token
        )
        return claim_wire.claims_page_to_proto(page, args.queue)

    @rpc
    def ListEvents(  # noqa: N802
        self, request: tasks_pb2.ListEventsRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListEventsResponse:
        """One page of the event log, newest first."""
        page = requests.parse_list_events(request)
        found = self._store.events.newest(page.filter, before=page.before, count=page.page_size)
        reply = tasks_pb2.ListEventsResponse(events=[event_wire.event_to_proto(e) for e in found])
        if len(found) == page.page_size:
            reply.next_before.CopyFrom(event_wire.position_to_proto(found[-1].position))
        return reply

    @rpc
    def ListDependencies(  # noqa: N802
        self, request: tasks_pb2.ListDependenciesRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListDependenciesResponse:
        """A task's upstreams and one page of its dependents, with their states."""
        page = requests.parse_list_dependencies(request)
        found = self._store.dependencies.neighbours(
            page.task_id, page_size=page.page_size, page_token=page.page_token
        )
        return task_wire.neighbours_to_proto(found, page.task_id)

    @stream_rpc
    def WatchEvents(  # noqa: N802
        self, request: tasks_pb2.WatchEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[tasks_pb2.TaskEvent]:
        """The event log from a revision, then (with follow) live."""
        watch = requests.parse_watch_events(request)
        flt, after = watch.filter, watch.after
        events, principal = self._store.events, principal_of(context)
        if not watch.follow:
            for event in events.history(flt, after=after, principal=principal):
                yield event_wire.event_to_proto(event)
            return
        # The last event whose send completed: grpc's sync server asks for the next event only
        # once the previous one left, so the caller has every event up to it.
        delivered = [after]
        followed = events.follow(
            flt,
            after=after,
            alive=stream_interceptor.stream_alive(context),
            on_behind=stream_interceptor.cut_when_stuck(
                lambda: str(StreamBehind(delivered[0], events.inbox_events))
            ),
            principal=principal,
        )
        try:
            for event in followed:
                yield event_wire.event_to_proto(event)
                delivered[0] = event.position
        except StreamBehind as exc:
            context.set_trailing_metadata(event_wire.resume_after_to_metadata(exc.position))
            raise
