"""Every metric family a replica exports is named in docs/operations.md, which an operator
reads to write a query or an alert: a family added without a line there is found here."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.metrics import Metrics

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_exported_family_is_documented() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    doc = OPERATIONS.read_text(encoding="utf-8")
    families = [f for f in registry.collect() if f.name.startswith("coordinator_")]
    assert len(families) >= 40  # the registry this test reads is the replica's
    shown = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert sorted(name for name in shown if name not in doc) == []
