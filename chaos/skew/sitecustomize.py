"""Loaded as ``sitecustomize`` only into the processes the clock-skew fault runs under
libfaketime (chaos/faults.py ClockSkew puts this directory first on their PYTHONPATH).

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves CLOCK_MONOTONIC and the
condition-variable waits correct but makes ``clock_nanosleep`` fail with EINVAL, which is what
CPython 3.11's ``time.sleep`` calls. ``time.sleep`` is re-routed through a timed lock wait (the
same wait ``threading.Event.wait`` uses, which works there); nothing else is touched, so every
reader of the wall clock (``time.time``, the coordinator's clock, log timestamps) sees the skew.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep  # type: ignore[assignment]
