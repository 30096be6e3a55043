"""How a record's field values are written to JSON and read back (domain/records.py's codec).

The stored format is what the stdlib codec of the first versions wrote: enums by name, bytes as
base64, tuples as lists. orjson writes the records now, for speed; these are the conversions it
needs to write the same values, and the stdlib writer for the few values orjson refuses or would
write otherwise (an int past 64 bits, a lone surrogate, a non-finite float).
"""

from __future__ import annotations

import base64
import json
import math
import types
from collections.abc import Callable
from enum import Enum
from typing import Any, Union, get_args, get_origin


def stdlib_encode(out: dict[str, Any]) -> bytes:
    """What every record was before orjson, for the values orjson cannot write as it did."""
    plain = {k: v if type(v) in _PLAIN else to_json(v) for k, v in out.items()}
    return json.dumps(plain, separators=(",", ":"), sort_keys=True).encode()


# Values the stdlib writes as they are (exact types: it would write an IntEnum as its number).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def finite(value: Any) -> bool:
    """Whether ``value`` is anything but an infinite or NaN float."""
    return not isinstance(value, float) or math.isfinite(value)


def enum_name(value: Enum) -> str:
    """An enum as records store it: its name."""
    return value.name


def base64_text(value: bytes) -> str:
    """Bytes as records store them: base64 text."""
    return base64.b64encode(value).decode()


def to_json(value: Any) -> Any:
    """``value`` as the stdlib codec writes it in a record."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, tuple):
        return list(value)
    return value


def converter(hint: Any) -> Callable[[Any], Any] | None:
    """The JSON -> value conversion of a field typed ``hint`` (None: the parsed value as is)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        convert = converter(inner)
        if convert is None:
            return None
        return lambda value: None if value is None else convert(value)
    if origin is tuple:
        return tuple
    if isinstance(hint, type) and issubclass(hint, Enum):
        enum: type[Enum] = hint
        return lambda value: enum[value]
    if hint is bytes:
        return base64.b64decode
    return None
