"""The outbox downstream, as a real process, through the SDK's HTTP adapter."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from coordinator.demo.outbox import OutboxProcess
from coordinator.sdk import (
    DownstreamRefused,
    DownstreamResult,
    DownstreamUncertain,
    HttpDownstream,
    LookupUnsupported,
)
from tests.helpers import eventually

KEY = "eff-" + "a" * 64


@pytest.fixture(scope="module")
def outbox() -> Iterator[OutboxProcess]:
    """One idempotent outbox for the module (each test uses its own keys)."""
    with OutboxProcess() as running:
        yield running


@pytest.fixture(scope="module")
def plain() -> Iterator[OutboxProcess]:
    """An outbox without idempotency support."""
    with OutboxProcess(idempotent=False) as running:
        yield running


def test_a_key_is_performed_once_and_replayed_after(outbox: OutboxProcess) -> None:
    down = HttpDownstream(outbox.url)
    key = KEY[:-1] + "1"
    first = down.execute(key, 5, b"hello")
    assert first.external_ref.startswith("msg-") and first.etag == first.external_ref
    assert down.execute(key, 5, b"hello") == first  # the original result, not performed again
    assert down.lookup(key, 5) == first
    counts = outbox.counts()
    assert (counts["performed"][key], counts["calls"][key], counts["lookups"][key]) == (1, 2, 1)


def test_a_reused_key_with_another_payload_is_refused(outbox: OutboxProcess) -> None:
    down = HttpDownstream(outbox.url)
    key = KEY[:-1] + "2"
    down.execute(key, 5, b"payload X")
    with pytest.raises(DownstreamRefused, match="422"):
        down.execute(key, 5, b"payload Y")
    assert outbox.performed(key) == 1


def test_an_older_generation_cannot_land_after_a_newer_one_looked_up(
    outbox: OutboxProcess,
) -> None:
    down = HttpDownstream(outbox.url)
    key = KEY[:-1] + "3"
    assert down.lookup(key, 9) is None  # generation 9 looked: absent
    with pytest.raises(DownstreamRefused, match="stale fencing generation"):
        down.execute(key, 8, b"late")
    assert outbox.performed(key) == 0
    assert down.execute(key, 9, b"late").external_ref


@pytest.mark.parametrize("mode", ["close", "hang"])
def test_a_dropped_response_was_still_performed(outbox: OutboxProcess, mode: str) -> None:
    key = KEY[:-1] + ("4" if mode == "close" else "5")
    outbox.drop(key=key, mode=mode)
    down = HttpDownstream(outbox.url, timeout=1.0)
    with pytest.raises(DownstreamUncertain, match="the response was lost"):
        down.execute(key, 3, b"lost")
    assert outbox.performed(key) == 1
    found = down.lookup(key, 3)
    assert found is not None and found.external_ref.startswith("msg-")


def test_a_stalled_send_is_performed_only_when_released(outbox: OutboxProcess) -> None:
    key = KEY[:-1] + "6"
    outbox.stall(key)
    answers: list[DownstreamResult | Exception] = []

    def send() -> None:
        try:
            answers.append(HttpDownstream(outbox.url, timeout=10).execute(key, 4, b"slow"))
        except Exception as exc:
            answers.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    eventually(lambda: outbox.counts()["performed"].get(key) is None, timeout=1)
    assert HttpDownstream(outbox.url).lookup(key, 4) is None
    outbox.release(key)
    thread.join(10)
    assert len(answers) == 1 and isinstance(answers[0], DownstreamResult)
    assert outbox.performed(key) == 1


def test_without_idempotency_every_send_performs_and_nothing_can_be_looked_up(
    plain: OutboxProcess,
) -> None:
    down = HttpDownstream(plain.url)
    first = down.execute(KEY, 1, b"mail")
    second = down.execute(KEY, 1, b"mail")
    assert first.external_ref != second.external_ref
    assert plain.performed(KEY) == 2
    with pytest.raises(LookupUnsupported):
        down.lookup(KEY, 1)


def test_an_unreachable_downstream_performed_nothing() -> None:
    with OutboxProcess() as gone:
        url = gone.url
    with pytest.raises(DownstreamRefused, match="cannot connect"):
        HttpDownstream(url, timeout=1.0).execute(KEY, 1, b"x")


def test_bad_requests_are_refused(outbox: OutboxProcess) -> None:
    down = HttpDownstream(outbox.url)
    with pytest.raises(DownstreamRefused, match="Idempotency-Key is required"):
        down.execute("", 1, b"x")
    assert outbox.counts()["performed"].get("") is None
