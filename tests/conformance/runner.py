"""One scenario run by one SDK's drivers: every step in order, each observation matched against
the scenario's expectation (matching.py). The step kinds are listed in
docs/conformance.md; a step names a driver (``"driver": "a"``) for driver ops and events, or is a
harness step (``"harness": "sigstop"``, ...), which no driver ever sees."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.metrics import Metrics
from coordinator.sdk import WorkerClient
from tests.conformance.downstream import Ledger
from tests.conformance.drivers import DriverProcess, DriverSpec
from tests.conformance.matching import Bindings, Mismatch, match, substitute
from tests.helpers import eventually

SCENARIOS = Path(__file__).resolve().parents[2] / "conformance" / "scenarios"

WITHIN = 30.0
"""Seconds a step marked ``until`` (or an awaited event or task state) may take by default: past
a 5 s claim TTL, a keepalive's TTL/3 and the server's 1 s expiry scan, on a loaded machine."""

_WORKER = "/coordinator.v1.WorkerService/"
_VIEWS = frozenset({"task", "metrics", "downstream", "events"})


@dataclass(frozen=True)
class Harness:
    """What the harness holds besides the drivers: the server, its metrics, its own producer
    client (for harness steps) and the downstream."""

    target: str
    metrics: Metrics
    producer: WorkerClient
    downstream_url: str
    ledger: Ledger

    def metric_view(self) -> dict[str, int]:
        """The server's counters a scenario can assert on (what /metrics would show)."""
        registry = self.metrics.registry

        def calls(method: str) -> int:
            count = "coordinator_rpc_duration_seconds_count"
            return int(registry.get_sample_value(count, {"method": _WORKER + method}) or 0)

        renewed = registry.get_sample_value("coordinator_renewals_total", {"outcome": "OK"})
        return {
            "renew_many_calls": calls("RenewMany"),
            "renew_calls": calls("Renew"),
            "renewed_ok": int(renewed or 0),
        }

    def task_view(self, task_id: str) -> dict[str, Any]:
        """A task as the server has it, for ``task`` steps."""
        task = self.producer.get_task(task_id)
        return {
            "state": task.state.name,
            "attempt": task.attempt,
            "attempts_counted": task.attempts_counted,
            "checkpoint_size": task.checkpoint_size or 0,
            "dead_letter_reason": task.dead_letter_reason.name,
            "last_error": task.last_error,
        }


def load(path: Path) -> dict[str, Any]:
    """A scenario file."""
    scenario: dict[str, Any] = json.loads(path.read_text())
    return scenario


class Run:
    """One scenario by one SDK: its drivers, what they answered so far, what steps bound."""

    def __init__(self, scenario: dict[str, Any], spec: DriverSpec, harness: Harness, logs: Path):
        self._scenario = scenario
        self._harness = harness
        self.bindings: Bindings = {"downstream": harness.downstream_url}
        self._pending: dict[str, tuple[DriverProcess, int]] = {}
        self.drivers = {
            letter: DriverProcess(
                spec,
                target=harness.target,
                worker_id=f"{letter}-{spec.name}",
                log=logs / f"driver-{letter}.log",
            )
            for letter in scenario["drivers"]
        }

    def run(self) -> None:
        """Every step in order; the first mismatch fails the test naming its step."""
        for index, step in enumerate(self._scenario["steps"]):
            try:
                self._step(step)
            except AssertionError as exc:
                raise AssertionError(f"step {index} {json.dumps(step)}: {exc}") from exc

    def close(self) -> None:
        """Exit every driver; each must exit 0 and have kept stdout for the protocol."""
        codes = {letter: driver.exit() for letter, driver in self.drivers.items()}
        violations = {k: d.violations() for k, d in self.drivers.items() if d.violations()}
        assert not violations, f"stdout lines outside the protocol: {violations}"
        assert set(codes.values()) == {0}, f"driver exit codes: {codes}"

    def _step(self, step: dict[str, Any]) -> None:
        if "harness" in step:
            self._harness_step(step)
        elif "op" in step:
            self._op(step)
        elif "reply_to" in step:
            driver, request_id = self._pending.pop(step["reply_to"])
            self._expect(step, driver.reply(request_id))
        elif "event" in step:
            driver = self.drivers[step["driver"]]
            self._until(step, lambda: self._first_match(step["event"], driver.events()))
        else:
            raise AssertionError("a step needs one of harness, op, reply_to, event")

    def _op(self, step: dict[str, Any]) -> None:
        driver = self.drivers[step["driver"]]
        args = substitute(step.get("args", {}), self.bindings)
        if "async" in step:  # answered later, by a reply_to step (a long poll)
            self._pending[step["async"]] = (driver, driver.send(step["op"], args))
        elif step.get("until"):
            self._until(step, lambda: self._expect(step, driver.call(step["op"], args)))
        else:
            self._expect(step, driver.call(step["op"], args))

    def _expect(self, step: dict[str, Any], reply: dict[str, Any]) -> Bindings:
        """Match a reply: ``ok`` true unless the step expects otherwise."""
        expected = {"ok": True, **step.get("expect", {})}
        self.bindings = match(expected, reply, self.bindings)
        return self.bindings

    def _first_match(self, expected: Any, seen: list[dict[str, Any]]) -> Bindings:
        for observed in seen:
            try:
                self.bindings = match(expected, observed, self.bindings)
            except Mismatch:
                continue
            return self.bindings
        raise Mismatch(f"none of {seen!r} matches {expected!r}")

    def _until(self, step: dict[str, Any], attempt: Callable[[], Bindings]) -> None:
        within = float(step.get("within_s", WITHIN))
        eventually(attempt, timeout=within, interval=0.1, message=f"{json.dumps(step)}")

    def _harness_step(self, step: dict[str, Any]) -> None:
        kind, harness = step["harness"], self._harness
        if kind == "sigstop":
            self.drivers[step["driver"]].stop()
        elif kind == "sigcont":
            self.drivers[step["driver"]].resume()
        elif kind == "create_tasks":
            for index in range(step["count"]):
                harness.producer.create_task(
                    f"{step['queue']}-{index}", input=b"{}", queue=step["queue"]
                )
        elif kind == "cancel_task":
            harness.producer.cancel_task(substitute(step["task_id"], self.bindings))
        elif kind == "lose_next_answer":
            harness.ledger.lose_next_answers(1)
        elif kind in _VIEWS:
            self._observe(step, lambda: self._view(kind, step))
        else:
            raise AssertionError(f"no harness step {kind!r}")

    def _view(self, kind: str, step: dict[str, Any]) -> Any:
        """What a harness step observes: the server's task record or metrics, the
        downstream's counters, a driver's events so far."""
        if kind == "task":
            return self._harness.task_view(substitute(step["task_id"], self.bindings))
        if kind == "metrics":
            return self._harness.metric_view()
        if kind == "downstream":
            return self._harness.ledger.counts()
        return self.drivers[step["driver"]].events()

    def _observe(self, step: dict[str, Any], view: Callable[[], Any]) -> None:
        def matched() -> Bindings:
            self.bindings = match(step["expect"], view(), self.bindings)
            return self.bindings

        if step.get("until"):
            self._until(step, matched)
        else:
            matched()
