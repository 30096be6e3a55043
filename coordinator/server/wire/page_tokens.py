"""Page tokens of every list RPC: issued with a check, refused unless they come back intact.

A token is the position the listing resumes at (a task id, ``task_id/effect_id``, an attempt
number), ``~``, and a check: 12 hex digits of the sha256 of the RPC's name, the listing's
filters and the position. ListEffects always refused a token that was not the shape of its
positions or was of another task; a task id, though, is any short word, so ListClaims,
ListDependencies and ListTasks took "garbage" as a position and answered an empty last page,
which a client reads as "done". With the check every list refuses, INVALID_ARGUMENT naming
page_token, whatever it did not issue for this very listing: text that never was a token, a
truncated or edited one, one of another RPC, or one sent with other filters.

The check is no secret and needs none (replicas share nothing but etcd): a forged token only
resumes a listing its caller may read anyway. It catches mistakes, not attackers; the position
is still checked for its shape, because the store builds a key from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from coordinator.errors import InvalidArgument

_SEPARATOR = "~"
"""In no position: task ids, effect ids and attempt numbers never hold one."""
_CHECK_CHARS = 12

Filters = Mapping[str, object]
"""The request fields a listing's token is bound to, by their .proto names."""


def issue(rpc: str, filters: Filters, position: str) -> str:
    """The token that resumes ``rpc``, with ``filters``, at ``position``; empty (no more
    pages) stays empty."""
    if not position:
        return ""
    return f"{position}{_SEPARATOR}{_check(rpc, filters, position)}"


def parse(rpc: str, filters: Filters, token: str, shape: Callable[[str], object]) -> str:
    """The position of a token ``rpc`` issued for ``filters`` (empty: the first page);
    ``shape`` raises InvalidArgument for a position the listing never returns."""
    if not token:
        return ""
    position, _, check = token.rpartition(_SEPARATOR)
    if position and check == _check(rpc, filters, position):
        try:
            shape(position)
        except InvalidArgument:
            pass
        else:
            return position
    bound = ", ".join(f"{name} {value!r}" for name, value in filters.items() if value)
    raise InvalidArgument(
        f"page_token {token[:60]!r} is not one {rpc} returned"
        + (f" for {bound}" if bound else "")
        + ": send next_page_token back unchanged, with the same filters (empty for the first page)"
    )


def _check(rpc: str, filters: Filters, position: str) -> str:
    # repr() keeps the parts apart: no value can pass for two (("a", "b~") vs ("a~", "b")).
    material = repr((rpc, sorted((k, str(v)) for k, v in filters.items()), position))
    return hashlib.sha256(material.encode()).hexdigest()[:_CHECK_CHARS]
