"""Sessions ended by sign-out, refused even when their cookie comes back.

The session lives in a signed cookie, so signing out only cleared the browser's copy: a copied
cookie kept working until its expiry (8 hours). Each session now carries a random id and its
sign-in time; sign-out records the id here until the cookie would have expired anyway, and a
cookie whose id is recorded is treated as signed out.

The record is bounded: past ``max_entries`` the oldest entries are dropped, and every session
signed in before the newest dropped one's sign-in is refused from then on (a few people sign in
again; no ended session comes back). It is per console process, like the random session key:
with several console replicas, give them one ``--secret-file`` and expect a sign-out to hold on
the replica that served it (documented in docs/console.md).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_ENTRIES = 10_000
"""Sign-outs remembered at once (about 100 bytes each)."""


class SignedOut:
    """The ids of ended sessions, each until ``lifetime`` seconds after its sign-in."""

    def __init__(
        self,
        *,
        lifetime: float,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lifetime = lifetime
        self._max = max_entries
        self._clock = clock
        self._ended: OrderedDict[str, float] = OrderedDict()  # id -> sign-in time
        self._before = 0.0  # sessions signed in at or before this are all refused
        self._lock = threading.Lock()  # pages run in threads and on the event loop

    def end(self, session_id: str, signed_in_at: float) -> None:
        """Record that a session signed out."""
        with self._lock:
            self._forget_expired()
            self._ended[session_id] = signed_in_at
            while len(self._ended) > self._max:
                _, dropped_at = self._ended.popitem(last=False)
                self._before = max(self._before, dropped_at)

    def is_ended(self, session_id: str, signed_in_at: float) -> bool:
        """Whether the session signed out (or is older than a dropped record)."""
        with self._lock:
            return signed_in_at <= self._before or session_id in self._ended

    def __len__(self) -> int:
        return len(self._ended)

    def _forget_expired(self) -> None:
        # Insertion order is sign-out order, not sign-in order: scan the whole (bounded) record.
        oldest_valid = self._clock() - self._lifetime
        for session_id in [s for s, at in self._ended.items() if at < oldest_valid]:
            del self._ended[session_id]
