"""bench/phases.py: a phase that would not fit is skipped, one still running at the bound is cut
off (also through an ``except Exception``), the load average is read around every phase that
started; with no budget nothing is ever skipped."""

from __future__ import annotations

import signal
import threading
import time

from bench.phases import PhaseClock


def _load_fields(clock: PhaseClock, phase: str) -> None:
    assert set(clock.load[phase]) == {"before", "after"}
    for reading in clock.load[phase].values():
        assert len(reading) == 3
        assert all(isinstance(v, float) and v >= 0 for v in reading)


def test_a_phase_running_at_the_bound_is_cut_off_and_the_next_ones_are_not_reached() -> None:
    clock = PhaseClock(0.2, time.monotonic())
    reached = []
    with clock.armed():
        with clock.phase("done"):
            reached.append("done")
        with clock.phase("slow"):
            try:
                threading.Event().wait(600)  # only the bound ends this wait
            except Exception:  # a phase's own handler must not swallow the cut-off
                reached.append("swallowed")
        reached.append("after")
    clock.not_reached(["done", "slow", "later"], {"done"})
    assert reached == ["done"]
    assert clock.cut_off
    assert clock.skipped == {
        "slow": "cut off: the 0.2 s budget ran out during it",
        "later": "the 0.2 s budget was used up",
    }
    _load_fields(clock, "done")
    _load_fields(clock, "slow")
    assert "later" not in clock.load


def test_a_phase_that_would_not_fit_is_skipped_with_the_reason() -> None:
    clock = PhaseClock(900, time.monotonic())
    assert clock.fits("short", 10)
    assert not clock.fits("long", 1000)
    assert clock.skipped == {"long": "the 900 s budget was used up"}


def test_without_a_budget_every_phase_fits_and_none_is_cut_off() -> None:
    clock = PhaseClock(None, time.monotonic())
    with clock.armed(), clock.phase("one"):
        assert clock.fits("one", 1e9)
    assert not clock.cut_off
    assert clock.skipped == {}
    _load_fields(clock, "one")


def test_leaving_the_block_disarms_the_bound_and_restores_the_handler() -> None:
    clock = PhaseClock(60, time.monotonic())
    previous = signal.getsignal(signal.SIGALRM)
    outer = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's, if it runs one
    try:
        with clock.armed(), clock.phase("quick"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # it can never ring later
        assert signal.getsignal(signal.SIGALRM) == previous
        assert not clock.cut_off
        assert clock.skipped == {}
    finally:
        if outer[0]:
            signal.setitimer(signal.ITIMER_REAL, outer[0])


def test_a_timer_set_before_is_set_again_with_what_it_had_left() -> None:
    clock = PhaseClock(60, time.monotonic())
    outer = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's, if it runs one
    previous = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        signal.setitimer(signal.ITIMER_REAL, 500)
        with clock.armed(), clock.phase("quick"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 60  # the budget's, meanwhile
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 60 < left <= 500
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_IGN
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0]:
            signal.setitimer(signal.ITIMER_REAL, outer[0])
