"""Durations in the public SDK: a ``timedelta`` or a number of seconds, the same everywhere.

``cancel.wait_for_cancelled(1.0)``, ``client.claim_next("q", ttl=30)`` and
``ttl=timedelta(seconds=30)`` all mean what they say. Each public entry point converts with
``as_timedelta`` (or a ``DurationField`` of an options dataclass converts when it is set), so
the SDK inside works in ``timedelta`` only and a reader never wonders which unit a number is.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Generic, TypeAlias, TypeVar, cast

Duration: TypeAlias = timedelta | float | int
"""A span of time: a ``timedelta``, or seconds (``int`` or ``float``)."""

D = TypeVar("D", bound=timedelta | None)


def as_timedelta(value: Duration, name: str) -> timedelta:
    """``value`` as a timedelta; TypeError naming ``name`` for anything but a timedelta or a
    finite number of seconds (a bool is not one)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{name}: give seconds (int or float) or a timedelta, got {value!r}")
    return timedelta(seconds=value)


def as_optional(value: Duration | None, name: str) -> timedelta | None:
    """``as_timedelta``, with None kept (an unset option)."""
    return None if value is None else as_timedelta(value, name)


def timeout_seconds(value: Duration | None, name: str = "timeout") -> float | None:
    """A wait's timeout in seconds for ``Event.wait`` and the like (None: wait forever)."""
    return None if value is None else as_timedelta(value, name).total_seconds()


class DurationField(Generic[D]):
    """A dataclass field that holds a ``D`` (a timedelta, or an optional one) and accepts seconds
    as well: ``CallRetry(timeout=5)`` stores ``timedelta(seconds=5)``.

    A data descriptor, so a frozen dataclass's ``__init__`` (``object.__setattr__``) goes
    through ``__set__`` too; the class attribute is the default the dataclass sees.
    """

    def __init__(self, default: D) -> None:
        self._default: D = default
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = f"{owner.__name__}.{name}"
        self._slot = f"_{name}"

    def __get__(self, obj: object | None, objtype: type | None = None) -> D:
        if obj is None:
            return self._default
        return cast(D, obj.__dict__.get(self._slot, self._default))

    def __set__(self, obj: object, value: Duration | D) -> None:
        converted: Any = None if value is None else as_timedelta(value, self._name)
        obj.__dict__[self._slot] = converted
