"""The console in a real browser against a real ``coordinator serve --token-file`` process:
what a reviewer, a worker, an admin and an operator see and do. Every outcome is also checked
on the coordinator itself."""

from __future__ import annotations

import re

import pytest

from coordinator.sdk import TaskState
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2, worker_pb2
from tests.console.browser import (  # noqa: F401 (browser_fixture is the fixture)
    PHONE,
    By,
    WebDriver,
    WebElement,
    browser_fixture,
    flash,
    overflow,
    press,
    screenshot,
    sign_in,
)
from tests.console.conftest import Stack, Stubs
from tests.helpers import eventually

S = types_pb2


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
    # ... next to the input it was made from.
    assert card.find_element(By.CSS_SELECTOR, "details.input pre").text == "draft"
    assert "committed by\nworker-a" in card.text
    screenshot(browser, "inbox-review")

    press(browser, _button(browser, "button.accept", "report-1"))
    assert flash(browser) == "accepted revision 1 of report-1: now DONE"
    assert stack.state("report-1") == (TaskState.DONE, 1)
    assert "Nothing to review." in browser.find_element(By.ID, "reviews").text

    browser.get(f"{stack.url}/tasks/report-1")
    assert browser.find_element(By.ID, "task-state").text == "DONE"
    timeline = browser.find_element(By.ID, "attempts").text
    assert "#1 worker-a" in timeline and "COMMITTED" in timeline
    browser.get(f"{stack.url}/queues")
    assert "No task is waiting, running, in review or failed." in browser.page_source


def test_rejecting_from_the_inbox_needs_a_reason_and_opens_a_new_round(
    stack: Stack, browser: WebDriver
) -> None:
    stack.review_task("report-3")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/inbox")
    press(browser, _button(browser, "button.reject", "report-3"))  # no reason typed
    assert flash(browser) == (
        "INVALID_ARGUMENT: reason is required: say why the result is rejected"
    )
    assert stack.state("report-3") == (TaskState.REVIEW, 1)

    card = browser.find_element(By.CSS_SELECTOR, '#reviews article[data-task="report-3"]')
    card.find_element(By.NAME, "reason").send_keys("wrong quarter")
    press(browser, _button(browser, "button.reject", "report-3"))
    assert flash(browser) == "rejected revision 1 of report-3: revision 2 is READY"
    assert stack.state("report-3") == (TaskState.READY, 2)
    with stack.client("pm-1") as pm:
        assert pm.get_task("report-3").revision == 2
    browser.get(f"{stack.url}/events?task=report-3")
    rejected = browser.find_element(By.CSS_SELECTOR, "#event-rows tr:first-child")  # newest
    assert "REVIEW → READY" in rejected.text and "pm-1" in rejected.text
    assert "wrong quarter" in rejected.text


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
    browser.get(f"{stack.url}/queues")
    # queue, ready, oldest ready, claimed, waiting, delayed, review, approval, failed
    assert browser.find_element(By.ID, "queues").text.splitlines()[-1] == "q 0 - 0 0 0 1 0 0"
    screenshot(browser, "queues")


def _needs_approval(stack: Stack, task_id: str) -> str:
    """A non-replayable task whose first attempt left an effect PREPARED and gave the task
    back: the next claim parks it in NEEDS_APPROVAL. Returns the effect id."""
    with stack.client("pm-1") as pm:
        pm.create_task(task_id, queue="q", input=b"send it", non_replayable=True)
    with stack.stubs("worker-a") as worker:
        fence = worker.claim(task_id).fence
        prepared = worker.effect(fence, "send")
        worker.worker.Release(worker_pb2.ReleaseRequest(fence=fence), metadata=worker.metadata)
        epoch = worker.admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=worker.metadata)
        again = worker_pb2.ClaimRequest(
            task_id=task_id, scheduler_epoch=epoch.epoch, ttl_seconds=30
        )
        assert (
            worker.worker.Claim(again, metadata=worker.metadata).outcome == S.OUTCOME_NEEDS_APPROVAL
        )
    return prepared


def _choose(browser: WebDriver, scope: str, resolution: str) -> None:
    """Pick a resolution in the form under ``scope`` (the console pre-selects none)."""
    radio = f'{scope} input[name="resolution"][value="{resolution}"]'
    browser.find_element(By.CSS_SELECTOR, radio).click()


def test_a_worker_sees_the_approve_button_and_the_server_refuses_it(
    stack: Stack, browser: WebDriver
) -> None:
    effect_id = _needs_approval(stack, "mail-1")
    sign_in(browser, stack.url, stack.token("worker-a"))
    browser.get(f"{stack.url}/inbox")
    listed = browser.find_element(By.CSS_SELECTOR, f'#effects article[data-effect="{effect_id}"]')
    assert "PREPARED" in listed.text
    card = '#approvals article[data-task="mail-1"]'
    _choose(browser, card, "absent")
    press(browser, _button(browser, "button.approve", "mail-1"))
    assert flash(browser).startswith("PERMISSION_DENIED: ")
    assert "ApproveRetry" in flash(browser)
    assert stack.state("mail-1")[0] is TaskState.NEEDS_APPROVAL
    screenshot(browser, "inbox-worker-refused")

    press(browser, browser.find_element(By.CSS_SELECTOR, ".signout button"))
    sign_in(browser, stack.url, stack.token("admin-1"))
    browser.get(f"{stack.url}/inbox")
    _choose(browser, card, "absent")
    press(browser, _button(browser, "button.approve", "mail-1"))
    assert flash(browser) == "approved a retry of mail-1: now READY, 1 effect(s) resolved"
    assert stack.state("mail-1")[0] is TaskState.READY


def test_approve_and_resolve_pre_select_nothing_and_warn_on_a_non_replayable_send_again(
    stack: Stack, browser: WebDriver
) -> None:
    effect_id = _needs_approval(stack, "charge-1")
    sign_in(browser, stack.url, stack.token("admin-1"))
    browser.get(f"{stack.url}/inbox")
    approval = browser.find_element(By.CSS_SELECTOR, '#approvals article[data-task="charge-1"]')
    effect = browser.find_element(By.CSS_SELECTOR, f'#effects article[data-effect="{effect_id}"]')
    for form in (approval, effect):
        radios = form.find_elements(By.CSS_SELECTOR, 'input[name="resolution"]')
        assert [r.get_attribute("value") for r in radios] == ["committed", "absent"]
        assert not [r for r in radios if r.is_selected()]  # an explicit choice is required
        warning = form.find_element(By.CSS_SELECTOR, "fieldset.resolution .warn").text
        assert warning.startswith("NON_REPLAYABLE task: if the effect did happen")
    screenshot(browser, "inbox-non-replayable-choice")

    # The browser will not send the form without a choice ...
    approval.find_element(By.CSS_SELECTOR, "button.approve").click()
    assert browser.find_elements(By.CSS_SELECTOR, '#approvals article[data-task="charge-1"]')
    assert stack.state("charge-1")[0] is TaskState.NEEDS_APPROVAL
    # ... and the task page asks the same way.
    browser.get(f"{stack.url}/tasks/charge-1")
    page_form = browser.find_element(By.CSS_SELECTOR, "form[action$='/approve']")
    assert not [
        r for r in page_form.find_elements(By.CSS_SELECTOR, "input[type=radio]") if r.is_selected()
    ]
    assert "NON_REPLAYABLE task" in page_form.text
    _choose(browser, "form[action$='/approve']", "committed")
    press(browser, page_form.find_element(By.CSS_SELECTOR, "button.approve"))
    assert flash(browser) == "approved a retry of charge-1: now READY, 1 effect(s) resolved"
    assert _effect_states(stack, "charge-1") == {effect_id: "EFFECT_STATE_COMMITTED"}


def _unknown_effect(stack: Stack, task_id: str) -> str:
    """worker-a's attempt records an effect UNKNOWN (its reconciliation opens) and gives the
    task back; returns the effect id."""
    with stack.client("pm-1") as pm:
        pm.create_task(task_id, queue="q", input=b"ping")
    with stack.stubs("worker-a") as worker:
        fence = worker.claim(task_id).fence
        effect_id = worker.effect(fence, "ping", S.EFFECT_STATE_UNKNOWN)
        worker.worker.Release(worker_pb2.ReleaseRequest(fence=fence), metadata=worker.metadata)
    return effect_id


def _effect_states(stack: Stack, task_id: str) -> dict[str, str]:
    with stack.stubs("pm-1") as pm:
        listed = pm.worker.ListEffects(
            worker_pb2.ListEffectsRequest(task_id=task_id), metadata=pm.metadata
        )
    return {e.effect_id: S.EffectState.Name(e.state) for e in listed.effects}


def test_an_unknown_effect_is_resolved_from_the_inbox_by_an_admin_only(
    stack: Stack, browser: WebDriver
) -> None:
    effect_id = _unknown_effect(stack, "notify-1")
    card = f'#effects article[data-effect="{effect_id}"]'
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/inbox")
    assert "UNKNOWN" in browser.find_element(By.CSS_SELECTOR, card).text
    assert "reconcile owner worker-a" in browser.find_element(By.CSS_SELECTOR, card).text
    _choose(browser, card, "committed")
    press(browser, browser.find_element(By.CSS_SELECTOR, f"{card} button.resolve"))
    assert flash(browser).startswith("PERMISSION_DENIED: ") and "ResolveEffect" in flash(browser)
    assert _effect_states(stack, "notify-1") == {effect_id: "EFFECT_STATE_UNKNOWN"}

    press(browser, browser.find_element(By.CSS_SELECTOR, ".signout button"))
    sign_in(browser, stack.url, stack.token("admin-1"))
    browser.get(f"{stack.url}/inbox")
    form = browser.find_element(By.CSS_SELECTOR, card)
    # Not a non-replayable task: no warning, and still no choice made for the admin.
    assert not form.find_elements(By.CSS_SELECTOR, ".warn")
    assert not [
        r for r in form.find_elements(By.CSS_SELECTOR, "input[type=radio]") if r.is_selected()
    ]
    _choose(browser, card, "absent")
    form.find_element(By.NAME, "reason").send_keys("the gateway has no record of it")
    screenshot(browser, "inbox-unknown-effect")
    press(browser, form.find_element(By.CSS_SELECTOR, "button.resolve"))
    assert flash(browser) == f"effect {effect_id[:16]}… is now ABSENT"
    assert _effect_states(stack, "notify-1") == {effect_id: "EFFECT_STATE_ABSENT"}
    assert not browser.find_elements(By.CSS_SELECTOR, card)  # no longer uncertain
    browser.get(f"{stack.url}/tasks/notify-1")
    shown = browser.find_element(By.CSS_SELECTOR, f'#effects [data-effect="{effect_id}"]')
    assert shown.text.startswith("ABSENT notify/ping")
    assert "the gateway has no record of it" in shown.text


def test_the_task_page_shows_fences_every_effect_and_the_dependency_graph(
    stack: Stack, browser: WebDriver
) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("fetch", queue="q", input=b"rows")
    stack.commit("fetch", b"12 rows")
    _after(stack, "merge", "fetch")
    _after(stack, "report", "merge")
    with stack.stubs("worker-a") as worker:
        first = worker.claim("merge").fence
        ids = {
            "mail": worker.effect(first, "mail", S.EFFECT_STATE_COMMITTED),
            "hook": worker.effect(first, "hook", S.EFFECT_STATE_ABSENT),
        }
        worker.worker.Release(worker_pb2.ReleaseRequest(fence=first), metadata=worker.metadata)
    with stack.stubs("admin-1") as admin:
        admin.admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=admin.metadata)
    with stack.stubs("worker-a") as worker:
        second = worker.claim("merge").fence
        ids["sms"] = worker.effect(second, "sms", S.EFFECT_STATE_UNKNOWN)
        ids["log"] = worker.effect(second, "log")

        sign_in(browser, stack.url, stack.token("pm-1"))
        browser.get(f"{stack.url}/tasks/merge")
        attempts = browser.find_elements(By.CSS_SELECTOR, "#attempts li")
        assert [a.get_attribute("data-attempt") for a in attempts] == ["1", "2"]
        assert f"fence: generation {first.claim_generation}, epoch 1" in attempts[0].text
        assert "RELEASED" in attempts[0].text
        assert f"fence: generation {second.claim_generation}, epoch 2" in attempts[1].text
        assert "running" in attempts[1].text

        for slot, state in [
            ("mail", "COMMITTED"),
            ("hook", "ABSENT"),
            ("sms", "UNKNOWN"),
            ("log", "PREPARED"),
        ]:
            effect = browser.find_element(By.CSS_SELECTOR, f'#effects [data-effect="{ids[slot]}"]')
            assert effect.text.startswith(f"{state} notify/{slot}"), effect.text
            # Only the uncertain ones offer to be resolved.
            resolvable = bool(effect.find_elements(By.CSS_SELECTOR, "button.resolve"))
            assert resolvable is (state in ("UNKNOWN", "PREPARED")), slot

        upstream = browser.find_element(By.CSS_SELECTOR, '#upstreams li[data-task="fetch"]')
        assert upstream.text == "fetch DONE"
        dependent = browser.find_element(By.CSS_SELECTOR, '#dependents li[data-task="report"]')
        assert dependent.text == "report WAITING"
        screenshot(browser, "task")
        worker.worker.Release(worker_pb2.ReleaseRequest(fence=second), metadata=worker.metadata)


def _after(stack: Stack, task_id: str, *upstreams: str) -> None:
    """pm-1 creates ``task_id`` depending on ``upstreams``."""
    with stack.stubs("pm-1") as pm:
        request = tasks_pb2.CreateTaskRequest(
            task_id=task_id, queue="q", input=b"i", depends_on=upstreams
        )
        pm.tasks.CreateTask(request, metadata=pm.metadata)


def _number(text: str) -> int:
    found = re.match(r"(\d+) s", text)
    assert found is not None, text
    return int(found.group(1))


def test_the_claims_page_counts_the_lease_down_and_shows_progress_and_renewals(
    stack: Stack, browser: WebDriver
) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("crunch-1", queue="q", input=b"numbers")
    sign_in(browser, stack.url, stack.token("pm-1"))
    browser.get(f"{stack.url}/claims")
    assert browser.find_element(By.ID, "no-claims").text == "No live claims."
    row = '#claims tr[data-task="crunch-1"]'
    with stack.stubs("worker-a") as worker:
        claim = worker.claim("crunch-1", ttl=30)
        # No reload: the page refreshes its own table.
        shown = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, row))
        assert shown[0].find_element(By.CSS_SELECTOR, ".holder").text == "worker-a"
        generation = shown[0].find_element(By.CSS_SELECTOR, ".generation").text
        assert generation == str(claim.fence.claim_generation)
        assert (
            browser.find_element(By.CSS_SELECTOR, f"{row} .renewed").text == "not since the claim"
        )
        assert browser.find_element(By.CSS_SELECTOR, f"{row} .progress").text == "none yet"

        # The expiry counts down from what etcd reported, without a renewal.
        def expires() -> int:
            return _number(browser.find_element(By.CSS_SELECTOR, f"{row} .expires").text)

        first = expires()
        assert 0 < first <= 30
        eventually(lambda: expires() < first)

        # Between refreshes the script counts on from the server's reading (data-seconds).
        def counted() -> bool:
            reading, shown = browser.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "return [Number(e.dataset.seconds), e.textContent];",
                f"{row} .expires",
            )
            return _number(str(shown)) < int(reading)

        eventually(counted)

        # A renewal with a progress marker: the marker shows (the server writes one at most
        # every 5 s, so from 5 s after the claim), and (etcd counts whole seconds) a refresh
        # after the claim shows as "renewed N s ago".
        def renewed() -> bool:
            request = worker_pb2.RenewRequest(fence=claim.fence, progress="step-2 of 5")
            assert worker.worker.Renew(request, metadata=worker.metadata).outcome == S.OUTCOME_OK
            text = browser.find_element(By.CSS_SELECTOR, f"{row} .renewed").text
            marker = browser.find_element(By.CSS_SELECTOR, f"{row} .progress").text
            return text.endswith(" s ago") and marker.startswith("step-2 of 5 (")

        eventually(renewed, timeout=25, interval=0.5)
        marker = browser.find_element(By.CSS_SELECTOR, f"{row} .progress")
        assert marker.text.startswith("step-2 of 5 (") and marker.text.endswith(" s ago)")
        assert expires() >= first - 1  # the renewal restored the lease
        screenshot(browser, "claims")
        worker.worker.Release(
            worker_pb2.ReleaseRequest(fence=claim.fence), metadata=worker.metadata
        )
    eventually(lambda: not browser.find_elements(By.CSS_SELECTOR, row))
    assert browser.find_element(By.ID, "no-claims").text == "No live claims."


LONG_ID = "a-task-with-a-rather-long-identifier-0123456789"


def _something_on_every_page(stack: Stack, worker: Stubs) -> worker_pb2.ClaimResponse:
    """A review, an approval, an uncertain effect, a dependency and a live claim."""
    stack.review_task("report-9", result=b"a long line of results " * 12)
    _needs_approval(stack, "mail-9")
    _after(stack, LONG_ID)
    _after(stack, "downstream-9", LONG_ID)
    return worker.claim(LONG_ID)


def test_every_page_fits_a_phone_and_is_screenshotted_at_its_width(
    stack: Stack, browser: WebDriver
) -> None:
    pages = [
        ("queues", "/queues"),
        ("tasks", "/tasks?queue=q"),
        ("dead-letters", "/tasks?queue=q&state=FAILED"),
        ("claims", "/claims"),
        ("task", f"/tasks/{LONG_ID}"),
        ("task-review", "/tasks/report-9"),
        ("inbox", "/inbox"),
        ("events", "/events"),
    ]
    with stack.stubs("worker-a") as worker:
        claim = _something_on_every_page(stack, worker)
        browser.set_window_size(*PHONE)
        browser.get(f"{stack.url}/signin")
        assert overflow(browser) == 0
        screenshot(browser, "signin-phone", size=None)
        sign_in(browser, stack.url, stack.token("admin-1"))
        for name, path in pages:
            browser.get(f"{stack.url}{path}")
            assert browser.find_elements(By.TAG_NAME, "main")
            assert overflow(browser) == 0, f"{path} is wider than a phone"
            screenshot(browser, f"{name}-phone", size=None)
        worker.worker.Release(
            worker_pb2.ReleaseRequest(fence=claim.fence), metadata=worker.metadata
        )
