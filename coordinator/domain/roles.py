"""Who may call what: roles, the authenticated identity, and the role check (pure, no I/O).

A caller is a principal with a set of roles. ``worker`` claims tasks and reaches the acceptance
points of its own claims; ``pm`` produces and reviews tasks; ``admin`` runs the safe-rollback
controls. The table of which role may call which RPC lives in
coordinator.server.interceptors.auth; this module only holds the vocabulary and the decision.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.domain.validation import no_dot_segments
from coordinator.errors import InvalidArgument

PRINCIPAL_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
"""What a principal may look like: 1-128 characters of ``[A-Za-z0-9._:@-]`` (and neither
``.`` nor ``..``: check_principal refuses those)."""


class Role(enum.StrEnum):
    """A caller's role; its value is the spelling in token files and metadata."""

    WORKER = "worker"
    PM = "pm"
    ADMIN = "admin"


ALL_ROLES: frozenset[Role] = frozenset(Role)
"""Every role (what an insecure-mode caller gets when it names none)."""


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: the principal that owns its claims, and its roles."""

    principal: str
    roles: frozenset[Role]

    def may(self, allowed: frozenset[Role]) -> bool:
        """Whether any of this caller's roles is in ``allowed``."""
        return not self.roles.isdisjoint(allowed)


def check_principal(setting: str, text: str) -> str:
    """``text`` if it is a well-formed principal; InvalidArgument naming ``setting`` if not."""
    if not PRINCIPAL_PATTERN.fullmatch(text):
        raise InvalidArgument(
            f"{setting} must be 1-128 characters of [A-Za-z0-9._:@-], got {text[:140]!r}"
        )
    # A principal is a key segment too (per-worker job index, idempotency keys).
    return no_dot_segments(setting, text)


def parse_roles(setting: str, names: Iterable[str]) -> frozenset[Role]:
    """Role names (blanks ignored) -> roles; InvalidArgument naming ``setting`` on an unknown one.

    An unknown role is refused rather than dropped: a typo such as ``admn`` must not silently
    leave an operator without the role they meant to grant (or with fewer than they think).
    """
    roles = set()
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        try:
            roles.add(Role(name))
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise InvalidArgument(
                f"{setting}: unknown role {raw.strip()!r} (known: {known})"
            ) from None
    return frozenset(roles)


def format_roles(roles: Iterable[Role]) -> str:
    """Roles as a sorted comma list (``admin,pm``), for messages and docs."""
    return ",".join(sorted(r.value for r in roles))
