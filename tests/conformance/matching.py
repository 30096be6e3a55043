"""How a scenario's expected observation matches what a driver (or the harness) observed: pure,
no I/O, so the rules are unit-tested on their own (test_matching.py).

An expectation is JSON:

- an object matches an object that has every expected key, each matching (other keys are
  ignored: a driver may answer more than the protocol asks);
- a list matches a list of the same length, item by item;
- ``"$name"`` binds ``name`` to the value on first use and must equal it afterwards;
- ``"!$name"`` is anything but the bound value; ``"*"`` is any value (the key must be there);
- ``"#N"`` is a list of exactly N items, whatever they are;
- ``"<$name"``, ``">$name"``, ``"<=N"``, ``">=N"``, ``"<N"``, ``">N"`` compare numbers with a
  bound value or a literal integer;
- anything else must be equal.

A failed match binds nothing (``match`` returns the new bindings only when everything matched),
so a step retried until it matches never keeps a binding from a try that did not.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

Bindings = dict[str, Any]

_LENGTH = re.compile(r"^#(\d+)$")
_COMPARISON = re.compile(r"^(<=|>=|<|>)(\$[A-Za-z_][A-Za-z0-9_.]*|-?\d+)$")
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


class Mismatch(AssertionError):
    """An observation that does not match its expectation; the message names where."""


def match(expected: Any, actual: Any, bindings: Mapping[str, Any]) -> Bindings:
    """``bindings`` plus whatever ``expected`` binds, if ``actual`` matches; Mismatch if not."""
    bound = dict(bindings)
    _match(expected, actual, bound, "$")
    return bound


def _match(expected: Any, actual: Any, bound: Bindings, path: str) -> None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"{path}: expected an object, got {actual!r}")
        for key, value in expected.items():
            if key not in actual:
                raise Mismatch(f"{path}.{key}: missing (got {actual!r})")
            _match(value, actual[key], bound, f"{path}.{key}")
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            raise Mismatch(f"{path}: expected {len(expected)} items, got {actual!r}")
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            _match(want, got, bound, f"{path}[{index}]")
    elif isinstance(expected, str):
        _match_string(expected, actual, bound, path)
    elif expected != actual or type(expected) is not type(actual):
        raise Mismatch(f"{path}: expected {expected!r}, got {actual!r}")


def _match_string(expected: str, actual: Any, bound: Bindings, path: str) -> None:
    if expected == "*":
        return
    if expected.startswith("$"):
        _match_placeholder(expected[1:], actual, bound, path)
        return
    if expected.startswith("!$"):
        value = _bound(expected[2:], bound, path)
        if actual == value:
            raise Mismatch(f"{path}: expected anything but {expected[1:]} = {value!r}")
        return
    length = _LENGTH.match(expected)
    if length is not None:
        if not isinstance(actual, list) or len(actual) != int(length.group(1)):
            raise Mismatch(f"{path}: expected {length.group(1)} items, got {actual!r}")
        return
    comparison = _COMPARISON.match(expected)
    if comparison is not None:
        op, operand = comparison.groups()
        _compare(expected, op, operand, actual, bound, path)
    elif expected != actual:
        raise Mismatch(f"{path}: expected {expected!r}, got {actual!r}")


def _match_placeholder(name: str, actual: Any, bound: Bindings, path: str) -> None:
    if name not in bound:
        bound[name] = actual
    elif bound[name] != actual:
        raise Mismatch(f"{path}: expected ${name} = {bound[name]!r}, got {actual!r}")


def _compare(expected: str, op: str, operand: str, actual: Any, bound: Bindings, path: str) -> None:
    limit = _bound(operand[1:], bound, path) if operand.startswith("$") else int(operand)
    if not isinstance(actual, int) or isinstance(actual, bool):
        raise Mismatch(f"{path}: expected a number {expected}, got {actual!r}")
    if not _OPERATORS[op](actual, limit):
        raise Mismatch(f"{path}: expected {expected} (= {op} {limit!r}), got {actual!r}")


def _bound(name: str, bound: Bindings, path: str) -> Any:
    if name not in bound:
        raise Mismatch(f"{path}: ${name} is used before a step bound it")
    return bound[name]


def substitute(template: Any, bindings: Mapping[str, Any]) -> Any:
    """``template`` (a request's arguments) with every ``"$name"`` string replaced by its bound
    value: a later step can send what an earlier one observed (a generated task id); and every
    ``{"$repeat": text, "times": n}`` by ``text`` n times (an oversized payload, written small)."""
    if isinstance(template, dict) and "$repeat" in template:
        return str(template["$repeat"]) * int(template["times"])
    if isinstance(template, dict):
        return {key: substitute(value, bindings) for key, value in template.items()}
    if isinstance(template, list):
        return [substitute(value, bindings) for value in template]
    if isinstance(template, str) and template.startswith("$"):
        name = template[1:]
        if name not in bindings:
            raise Mismatch(f"${name} is sent before a step bound it")
        return bindings[name]
    return template
