"""Fixtures of the owned-reconciliation tests: the store fixtures (``make_store``, ``clock``);
the server fixtures are the shared ones (tests/fixtures.py), each on this test's own key
prefix."""

from __future__ import annotations

from tests.store.conftest import clock, make_store  # noqa: F401 (fixtures)
