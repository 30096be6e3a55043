"""The console in a real browser against a real ``coordinator serve --token-file`` process:
what a reviewer, a worker and an operator see and do. Every outcome is also checked on the
coordinator itself."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coordinator.domain.digests import digest_of
from coordinator.sdk import Job, TaskState
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2
from tests.console.browser import (  # noqa: F401 (browser_fixture is the fixture)
    By,
    WebDriver,
    WebElement,
    browser_fixture,
    flash,
    press,
    screenshot,
    sign_in,
)
from tests.console.conftest import Stack
from tests.helpers import eventually


@pytest.fixture
def coordinator(served_coordinator: str) -> str:
    """The browser tests run against a real ``coordinator serve --token-file`` process."""
    return served_coordinator


def _button(driver: WebDriver, css: str, task_id: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'{css}[data-task="{task_id}"]')


def test_the_inbox_shows_a_review_and_accepting_it_makes_the_task_done(
    stack: Stack, browser: WebDriver
) -> None:
    stack.review_task("report-1", result=b"Q3 numbers: all green")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/inbox")
    card = browser.find_element(By.CSS_SELECTOR, '#reviews article[data-task="report-1"]')
    assert "Q3 numbers: all green" in card.text  # the reviewer reads what they accept
    assert "committed by\nworker-a" in card.text
    screenshot(browser, "inbox-review")
    screenshot(browser, "inbox-review-phone", size=(390, 844))

    press(browser, _button(browser, "button.accept", "report-1"))
    assert flash(browser) == "accepted revision 1 of report-1: now DONE"
    assert stack.state("report-1") == (TaskState.DONE, 1)
    assert "Nothing to review." in browser.find_element(By.ID, "reviews").text

    browser.get(f"{stack.url}/tasks/report-1")
    assert browser.find_element(By.ID, "task-state").text == "DONE"
    timeline = browser.find_element(By.ID, "attempts").text
    assert "#1 worker-a" in timeline and "COMMITTED" in timeline
    screenshot(browser, "task")
    browser.get(f"{stack.url}/queues")
    assert "No task is waiting, running, in review or failed." in browser.page_source


def test_accepting_a_revision_the_task_has_moved_past_is_refused_with_why(
    stack: Stack, browser: WebDriver
) -> None:
    stack.review_task("report-2")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/inbox")  # the page shows revision 1
    with stack.stubs("pm-2") as other:  # meanwhile another reviewer rejects it ...
        other.tasks.Reject(
            tasks_pb2.RejectRequest(task_id="report-2", revision=1, reason="wrong quarter"),
            metadata=other.metadata,
        )
    stack.commit("report-2", b"second round")  # ... and revision 2 is committed
    assert stack.state("report-2") == (TaskState.REVIEW, 2)

    press(browser, _button(browser, "button.accept", "report-2"))
    assert flash(browser) == (
        "FAILED_PRECONDITION: cannot accept revision 1 of task 'report-2': the task is at "
        "revision 2; a review of revision 1 does not apply to revision 2"
    )
    assert stack.state("report-2") == (TaskState.REVIEW, 2)
    screenshot(browser, "inbox-stale-accept")
    browser.get(f"{stack.url}/queues")  # queue, ready, claimed, waiting, review, approval, failed
    assert browser.find_element(By.ID, "queues").text.splitlines()[-1] == "q 0 0 0 0 1 0 0"
    screenshot(browser, "queues")


def _needs_approval(stack: Stack, task_id: str) -> str:
    """A non-replayable task whose first attempt left an effect PREPARED and gave the task
    back: the next claim parks it in NEEDS_APPROVAL. Returns the effect id."""
    with stack.client("pm-1") as pm:
        pm.create_task(task_id, queue="q", input=b"send it", non_replayable=True)
    with stack.stubs("worker-a") as worker:
        md = worker.metadata
        epoch = 1

        def claim() -> worker_pb2.ClaimResponse:
            request = worker_pb2.ClaimRequest(
                task_id=task_id, scheduler_epoch=epoch, ttl_seconds=30
            )
            return worker.worker.Claim(request, metadata=md)

        fence = claim().fence
        prepared = worker.worker.PrepareEffect(
            worker_pb2.PrepareEffectRequest(
                fence=fence, node_id="mail", effect_slot="send", payload_digest=digest_of(b"m")
            ),
            metadata=md,
        )
        worker.worker.Release(worker_pb2.ReleaseRequest(fence=fence), metadata=md)
        assert claim().outcome == types_pb2.OUTCOME_NEEDS_APPROVAL
    return str(prepared.effect_id)


def test_a_worker_sees_the_approve_button_and_the_server_refuses_it(
    stack: Stack, browser: WebDriver
) -> None:
    effect_id = _needs_approval(stack, "mail-1")
    sign_in(browser, stack.url, stack.token("worker-a"))
    browser.get(f"{stack.url}/inbox")
    listed = browser.find_element(By.CSS_SELECTOR, f'#effects article[data-effect="{effect_id}"]')
    assert "PREPARED" in listed.text
    press(browser, _button(browser, "button.approve", "mail-1"))
    assert flash(browser).startswith("PERMISSION_DENIED: ")
    assert "ApproveRetry" in flash(browser)
    assert stack.state("mail-1")[0] is TaskState.NEEDS_APPROVAL
    screenshot(browser, "inbox-worker-refused")

    press(browser, browser.find_element(By.CSS_SELECTOR, ".signout button"))
    sign_in(browser, stack.url, stack.token("admin-1"))
    browser.get(f"{stack.url}/inbox")
    press(browser, _button(browser, "button.approve", "mail-1"))
    assert flash(browser) == "approved a retry of mail-1: now READY, 1 effect(s) resolved"
    assert stack.state("mail-1")[0] is TaskState.READY


def test_the_claims_page_shows_a_claim_appear_and_disappear(
    stack: Stack, browser: WebDriver
) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("crunch-1", queue="q", input=b"numbers")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/claims")
    assert browser.find_element(By.ID, "no-claims").text == "No live claims."
    row = '#claims tr[data-task="crunch-1"]'
    with stack.client("worker-a") as worker:
        job = worker.claim("crunch-1", ttl=timedelta(seconds=30))
        assert isinstance(job, Job)
        with job:
            # No reload: the page refreshes its own table.
            shown = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, row))
            cells = shown[0].text
            assert "worker-a" in cells and str(job.generation) in cells
            eventually(lambda: browser.find_element(By.CSS_SELECTOR, f"{row} .since").text != "-")
            screenshot(browser, "claims")
        # Leaving the block released the claim.
    eventually(lambda: not browser.find_elements(By.CSS_SELECTOR, row))
    assert browser.find_element(By.ID, "no-claims").text == "No live claims."


def test_the_events_page_follows_new_events_live(stack: Stack, browser: WebDriver) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("early", queue="q", input=b"x")
        sign_in(browser, stack.url, stack.token("pm-1"))
        browser.get(f"{stack.url}/events")
        assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-position$="/early/0"]')
        eventually(lambda: browser.find_element(By.ID, "live-status").text.startswith("Live"))
        pm.create_task("late", queue="q", input=b"y")
    live = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, 'tr[data-position*="/late/"]'))
    assert "- → READY" in live[0].text and "pm-1" in live[0].text
    screenshot(browser, "events")
