"""The record decoder of the version before orjson (stdlib json), kept verbatim for one test:
a server of that version, still running during a rolling upgrade, must read what the new one
writes."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from coordinator.domain.records import _field_converters

T = TypeVar("T")


def previous_decode(cls: type[T], data: bytes, **metadata: Any) -> T:
    """``coordinator.domain.records.decode`` as it was at commit 12fc347."""
    raw = json.loads(data)
    kwargs: dict[str, Any] = {}
    for name, convert in _field_converters(cls):  # type: ignore[arg-type]
        if name in raw:
            value = raw[name]
            kwargs[name] = value if convert is None else convert(value)
    kwargs.update(metadata)
    return cls(**kwargs)
