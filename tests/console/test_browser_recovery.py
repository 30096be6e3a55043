"""The console in a real browser (as tests/console/test_browser.py): the recovery views of
issue 29. The events page newest first, paged back and forward, live events on top and long
details wrapped at laptop and phone width; the dead-letter view's preview and bulk retry."""

from __future__ import annotations

import pytest

from coordinator.sdk import TaskRetryPolicy, TaskState
from coordinator.v1 import types_pb2, worker_pb2
from tests.console.browser import (  # noqa: F401 (browser_fixture is the fixture)
    PHONE,
    By,
    WebDriver,
    browser_fixture,
    flash,
    overflow,
    press,
    screenshot,
    sign_in,
)
from tests.console.conftest import Stack
from tests.helpers import eventually

S = types_pb2


@pytest.fixture
def coordinator(served_coordinator: str) -> str:
    """The browser tests run against a real ``coordinator serve --token-file`` process."""
    return served_coordinator


def _shown(browser: WebDriver) -> list[str]:
    """The task id of each event row, top to bottom."""
    rows = browser.find_elements(By.CSS_SELECTOR, "#event-rows tr")
    return [str(r.get_attribute("data-position")).split("/")[1] for r in rows]


def test_the_events_page_shows_the_newest_first_and_puts_live_ones_on_top(
    stack: Stack, browser: WebDriver
) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("early", queue="q", input=b"x")
        pm.create_task("later", queue="q", input=b"x")
        sign_in(browser, stack.url, stack.token("pm-1"))
        browser.get(f"{stack.url}/events")
        ids = _shown(browser)
        assert ids.index("later") < ids.index("early")
        eventually(lambda: browser.find_element(By.ID, "live-status").text.startswith("Live"))
        pm.create_task("late", queue="q", input=b"y")
    top = '#event-rows tr:first-child[data-position*="/late/"]'
    live = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, top))
    assert "- → READY" in live[0].text and "pm-1" in live[0].text
    screenshot(browser, "events")


def test_the_events_page_pages_back_to_older_events_and_forward_to_the_newest(
    stack: Stack, browser: WebDriver
) -> None:
    """The console's page holds 50 events: 55 creations make two pages."""
    with stack.client("pm-1") as pm:
        for n in range(55):
            pm.create_task(f"ev-{n:02d}", queue="paging", input=b"x")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/events?queue=paging")

    assert _shown(browser) == [f"ev-{n:02d}" for n in range(54, 4, -1)]
    assert not browser.find_elements(By.ID, "newest-events")
    press(browser, browser.find_element(By.ID, "older-events"))
    assert _shown(browser) == [f"ev-{n:02d}" for n in range(4, -1, -1)]
    assert browser.find_element(By.ID, "log-start").text == "That is the start of the log."
    assert not browser.find_elements(By.ID, "live-status")  # live only on the newest page
    press(browser, browser.find_element(By.ID, "newest-events"))
    assert _shown(browser)[0] == "ev-54"


def test_a_long_event_detail_wraps_on_a_laptop_and_on_a_phone(
    stack: Stack, browser: WebDriver
) -> None:
    detail = "why: " + "x" * 300 + " " + "a long reason that goes on " * 8
    with stack.client("pm-1") as pm:
        pm.create_task("wordy", queue="q", input=b"x")
        pm.cancel_task("wordy", reason=detail[:1000])
    sign_in(browser, stack.url, stack.token("pm-1"))
    for name, size in (("events-long-detail", None), ("events-long-detail-phone", PHONE)):
        if size is not None:
            browser.set_window_size(*size)
        browser.get(f"{stack.url}/events?task=wordy")
        cell = browser.find_element(By.CSS_SELECTOR, "#event-rows tr:first-child td.detail")
        assert cell.text.replace("\n", "").rstrip().endswith("goes on")
        assert overflow(browser) == 0, name
        right = browser.execute_script("return arguments[0].getBoundingClientRect().right", cell)
        assert right <= browser.execute_script("return window.innerWidth"), name
        screenshot(browser, name, size=None)


def _dead_letter(stack: Stack, task_id: str, code: str) -> None:
    """A task of queue "dl" whose one attempt failed with ``code``: FAILED."""
    with stack.client("pm-1") as pm:
        pm.create_task(
            task_id, queue="dl", input=b"x", retry_policy=TaskRetryPolicy(max_attempts=1)
        )
    with stack.stubs("worker-a") as worker:
        fence = worker.claim(task_id).fence
        fail = worker_pb2.FailRequest(fence=fence, retryable=True, error_code=code)
        assert worker.worker.Fail(fail, metadata=worker.metadata).state == S.TASK_STATE_FAILED


def test_the_dead_letter_view_previews_then_retries_a_queues_failed_tasks(
    stack: Stack, browser: WebDriver
) -> None:
    for task_id, code in (("d0", "KeyError"), ("d1", "KeyError"), ("d2", "Timeout")):
        _dead_letter(stack, task_id, code)
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/tasks?queue=dl&state=FAILED")
    form = browser.find_element(By.ID, "retry-failed")
    form.find_element(By.NAME, "error_code").send_keys("KeyError")
    form.find_element(By.NAME, "since").send_keys("1h")
    screenshot(browser, "dead-letters")
    press(browser, form.find_element(By.CSS_SELECTOR, "button.preview"))
    assert flash(browser) == "would retry 2 dead letter(s) of dl: d0, d1"
    assert [stack.state(t)[0] for t in ("d0", "d1")] == [TaskState.FAILED] * 2  # a preview

    form = browser.find_element(By.ID, "retry-failed")
    form.find_element(By.NAME, "error_code").send_keys("KeyError")
    form.find_element(By.NAME, "reason").send_keys("fixed in 1.4.2")
    press(browser, form.find_element(By.CSS_SELECTOR, "button.retry-all"))
    assert flash(browser) == "retried 2 dead letter(s) of dl: d0, d1"
    assert [stack.state(t)[0] for t in ("d0", "d1", "d2")] == [
        TaskState.READY,
        TaskState.READY,
        TaskState.FAILED,
    ]
    rows = [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert rows == ["d2"]  # the page shows what is left
    # Pressing again finds nothing more of that code: a retried task is not FAILED.
    form = browser.find_element(By.ID, "retry-failed")
    form.find_element(By.NAME, "error_code").send_keys("KeyError")
    press(browser, form.find_element(By.CSS_SELECTOR, "button.retry-all"))
    assert flash(browser) == "retried 0 dead letter(s) of dl"
