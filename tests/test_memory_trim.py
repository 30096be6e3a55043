"""coordinator/memory_trim.py: the trim hands freed heap pages back (glibc), is a safe no-op
without malloc_trim, and runs once per quiet period, never while work is going on."""

from __future__ import annotations

import threading

import pytest

from coordinator import memory_trim
from coordinator.memory_trim import QuietTrim, rss_bytes, trim_heap
from tests.helpers import eventually

MIB = 1 << 20
BLOCK = 4096  # past pymalloc's 512 bytes: straight from malloc's heap


def _free_blocks_under_pins() -> list[bytes]:
    """64 MiB of blocks freed but for one in 256 kept (returned): the freed spans lie between
    live blocks, so free() alone cannot shrink the heap over them."""
    blocks = [bytes([n % 251]) * BLOCK for n in range(16 * 1024)]
    pins = blocks[::256]
    del blocks
    return pins


@pytest.mark.skipif(memory_trim._malloc_trim() is None, reason="malloc_trim is glibc's")
def test_the_trim_returns_the_pages_free_spans_held() -> None:
    pins = _free_blocks_under_pins()
    returned = trim_heap()
    assert returned >= 32 * MIB, returned
    assert len(pins) == 64


def test_without_malloc_trim_the_trim_is_a_collection_only_and_the_pages_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_trim, "_malloc_trim", lambda: None)  # as on musl or macOS
    pins = _free_blocks_under_pins()
    assert trim_heap() < 8 * MIB  # what the trim above returns stays without it
    assert len(pins) == 64


def test_rss_is_read_from_proc() -> None:
    assert rss_bytes() > 10 * MIB  # an interpreter with pytest loaded


class _Counted:
    """A trim that only counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self) -> int:
        self.runs += 1
        return 0


def test_quiet_trims_once() -> None:
    counted = _Counted()
    trim = QuietTrim("work", delay=0.0, trim=counted)
    trim.quiet()
    eventually(lambda: trim.trims == 1)
    assert counted.runs == 1


def test_work_starting_again_drops_the_waiting_trim() -> None:
    counted = _Counted()
    trim = QuietTrim("resumed", delay=3600.0, trim=counted)
    trim.quiet()
    assert [t.name for t in threading.enumerate()].count("trim after resumed") == 1
    trim.busy()
    # The timer's thread ended without trimming: nothing is left that could.
    eventually(lambda: "trim after resumed" not in [t.name for t in threading.enumerate()])
    assert (counted.runs, trim.trims) == (0, 0)
