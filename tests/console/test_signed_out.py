"""The record of signed-out sessions (console/signed_out.py): an ended session stays refused
until its cookie would have expired, and the record's bound never lets one come back."""

from __future__ import annotations

from coordinator.clock import ManualClock
from coordinator.console.signed_out import SignedOut


def test_an_ended_session_is_refused_until_its_cookie_expires() -> None:
    clock = ManualClock()
    ended = SignedOut(lifetime=100, clock=clock.now)
    start = clock.now()
    ended.end("a", start)
    assert ended.is_ended("a", start)
    assert not ended.is_ended("b", start)
    clock.advance(101)  # the cookie of "a" expired anyway: the entry is dropped at the next end
    ended.end("b", clock.now())
    assert len(ended) == 1
    assert ended.is_ended("b", clock.now())


def test_past_the_bound_older_sessions_are_refused_rather_than_forgotten() -> None:
    clock = ManualClock()
    ended = SignedOut(lifetime=1000, max_entries=2, clock=clock.now)
    signed_in = {}
    for name in ("a", "b", "c", "d"):
        signed_in[name] = clock.now()
        clock.advance(1)
    for name in ("a", "b", "c"):
        ended.end(name, signed_in[name])
    assert len(ended) == 2
    assert ended.is_ended("a", signed_in["a"])  # dropped from the record, still refused
    assert ended.is_ended("b", signed_in["b"])
    assert not ended.is_ended("d", signed_in["d"])  # signed in after the dropped one: still in
