"""The console's list pages on legal data (issue 25 item 4): with a hundred tasks holding the
largest input the server accepts, the queues, task-list and inbox pages answered 502 (their
ListTasks read passed the 4 MiB message limit). They read summaries now, and answer."""

from __future__ import annotations

import re

from coordinator.domain.validation import MAX_INPUT_BYTES
from coordinator.store import Store
from coordinator.store.types import TaskSpec
from tests.console.conftest import Stack
from tests.console.http_client import signed_in

LARGE = 100


def test_list_pages_answer_with_a_hundred_max_inputs(stack: Stack, store: Store) -> None:
    for n in range(LARGE):
        spec = TaskSpec(task_id=f"big-{n:03d}", queue="big", input=b"i" * MAX_INPUT_BYTES)
        store.tasks.create(spec, by="pm-1")
    store.tasks.create(TaskSpec(task_id="tiny-1", queue="tiny", input=b"x"), by="pm-1")
    client = signed_in(stack.url, stack.token("pm-1"))
    queues = client.get("/queues")
    assert queues.status_code == 200
    assert 'href="/tasks?queue=big"' in queues.text
    assert 'href="/tasks?queue=tiny"' in queues.text
    big = client.get("/tasks?queue=big")
    assert big.status_code == 200
    shown = re.findall(r'<a href="/tasks/(big-\d+)">', big.text)
    assert shown == [f"big-{n:03d}" for n in range(50)]  # one console page (page_size 50)
    tiny = client.get("/tasks?queue=tiny")
    assert re.findall(r'<a href="/tasks/([^"]+)">', tiny.text) == ["tiny-1"]
    assert client.get("/inbox").status_code == 200
