"""``coordinator tasks retry --queue`` against a real server: the bulk recovery after a bad
deploy, page by page, one line per task and a summary."""

from __future__ import annotations

from click.testing import CliRunner

from coordinator.cli import main
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2_grpc
from tests.workqueue.test_bulk_retry_rpc import dead_letter


def test_the_cli_retries_a_queue_page_by_page_and_reports_each_task(
    server: str, tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    for n in range(3):
        dead_letter(tasks, worker, f"o{n}", "KeyError")
    dead_letter(tasks, worker, "e0", "KeyError", queue="emails")
    base = ["tasks", "retry", "--target", server, "--insecure", "--principal", "pm-1"]

    dry = CliRunner().invoke(main, [*base, "--queue", "orders", "--dry-run", "--since", "1h"])
    assert dry.exit_code == 0, dry.output
    assert _lines(dry.output) == [
        "would retry o0",
        "would retry o1",
        "would retry o2",
        "would retry 3, skipped 0 of orders (4 tasks read)",
    ]
    some = CliRunner().invoke(main, [*base, "--queue", "orders", "--limit", "2"])
    assert some.exit_code == 0, some.output
    *report, resume = _lines(some.output)
    assert report == ["retried o0", "retried o1", "retried 2, skipped 0 of orders (3 tasks read)"]
    assert resume.startswith("more may match: resume with --page-token o1~")
    token = resume.rpartition(" ")[2]
    rest = CliRunner().invoke(main, [*base, "--queue", "orders", "--page-token", token])
    assert _lines(rest.output)[-2:] == [
        "retried o2",
        "retried 1, skipped 0 of orders (1 tasks read)",
    ]
    assert tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="e0")).task.state == (
        types_pb2.TASK_STATE_FAILED
    )
    both = CliRunner().invoke(main, [*base, "o0", "--queue", "orders"])
    assert both.exit_code == 2 and "give TASK_ID or --queue, not both" in both.output
    bad = CliRunner().invoke(main, [*base, "--queue", "orders", "--since", "yesterday"])
    assert bad.exit_code == 2 and "neither an ISO 8601 time" in bad.output


def _lines(output: str) -> list[str]:
    """The CLI's own lines (the in-process server's JSON log lines share the output)."""
    return [line for line in output.splitlines() if not line.startswith("{")]
