"""Every scenario of conformance/scenarios/ against every SDK's driver (drivers.DRIVERS), on a
real server over the session etcd (tests/fixtures.py: a fresh key prefix and metrics registry
per test). Each run must observe exactly what its scenario expects, so two SDKs that behave
differently cannot both pass: a difference between the SDKs is a failing test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.metrics import Metrics
from coordinator.sdk import WorkerClient
from tests.conformance import downstream
from tests.conformance.drivers import DRIVERS, DriverSpec
from tests.conformance.runner import SCENARIOS, Harness, Run, load

SCENARIO_FILES = sorted(SCENARIOS.glob("*.json"))


@pytest.fixture
def harness(server: str, metrics: Metrics) -> Iterator[Harness]:
    """The server, its metrics, a producer client and a downstream for one scenario run."""
    with (
        downstream.serving() as (url, ledger),
        WorkerClient(server, principal="conformance-harness") as producer,
    ):
        yield Harness(server, metrics, producer, url, ledger)


@pytest.mark.slow  # real driver processes; some scenarios pause one past its lease
@pytest.mark.parametrize("spec", DRIVERS, ids=[spec.name for spec in DRIVERS])
@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[path.stem for path in SCENARIO_FILES])
def test_scenario(path: Path, spec: DriverSpec, harness: Harness, tmp_path: Path) -> None:
    missing = spec.missing()
    if missing is not None:
        pytest.skip(missing)
    run = Run(load(path), spec, harness, tmp_path)
    try:
        run.run()
    finally:
        run.close()


def test_every_scenario_is_found() -> None:
    # A glob that finds nothing would pass the suite vacuously.
    assert len(SCENARIO_FILES) >= 7, SCENARIO_FILES
