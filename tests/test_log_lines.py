"""The rendered log line: the same JSON as structlog's stock processors and renderer wrote (level,
ISO UTC timestamp, bound context, exceptions, repr for what JSON cannot hold), made cheaper."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from coordinator.logging import _iso_utc, bound, configure_logging

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lines]:
    """The JSON lines logged while the test ran (logging configured onto a stderr of its own)."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure_logging("info")
    yield lambda: [json.loads(line) for line in stderr.getvalue().splitlines()]
    monkeypatch.undo()
    configure_logging("info")


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def test_a_line_has_level_timestamp_event_fields_and_bound_context(lines: Lines) -> None:
    log = structlog.get_logger("t")
    with bound(task_id="t-1"):
        log.warning("rpc refused", code="UNAVAILABLE", n=3, when=datetime.date(2026, 12, 2))
    log.debug("not at info")
    (line,) = lines()
    timestamp = line.pop("timestamp")
    assert line == {
        "event": "rpc refused",
        "code": "UNAVAILABLE",
        "n": 3,
        "when": "datetime.date(2026, 12, 2)",  # repr, as structlog's JSONRenderer wrote it
        "task_id": "t-1",
        "level": "warning",
    }
    parsed = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    assert parsed.tzinfo == datetime.UTC and timestamp.endswith("Z")


def test_values_json_cannot_hold_are_their_repr_and_odd_ones_still_render(lines: Lines) -> None:
    log = structlog.get_logger("t")
    log.info("x", thing=Opaque(), raw=b"\x00", keys={1: "a"}, big=2**70, text="caf\u00e9")
    (line,) = lines()
    assert (line["thing"], line["raw"], line["keys"]) == ("<opaque>", "b'\\x00'", {"1": "a"})
    assert (line["big"], line["text"]) == (2**70, "caf\u00e9")


def test_an_exception_is_rendered_as_its_traceback(lines: Lines) -> None:
    log = structlog.get_logger("t")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    (line,) = lines()
    assert line["level"] == "error"
    assert "ValueError: boom" in line["exception"] and "Traceback" in line["exception"]


def test_stdlib_records_go_through_the_same_renderer(lines: Lines) -> None:
    logging.getLogger("grpc._server").warning("pool %s", "full")
    (line,) = lines()
    line.pop("timestamp")
    assert line == {"event": "pool full", "level": "warning", "logger": "grpc._server"}


@pytest.mark.parametrize(
    "now", [0.0, 1764662400.0, 1764662400.5, 1764662400.000001, 1764662459.999999, 951782400.25]
)
def test_the_timestamp_is_what_datetime_isoformat_writes(now: float) -> None:
    expected = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()
    assert _iso_utc(now) == expected.replace("+00:00", "Z")
