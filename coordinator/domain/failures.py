"""What a holder reports when its attempt failed (WorkerService.Fail), as plain data."""

from __future__ import annotations

from dataclasses import dataclass, replace

KEPT_MESSAGE = 256
"""Characters of a failure's message kept when the whole report may not be (``trimmed``)."""


@dataclass(frozen=True)
class FailureReport:
    """The holder's word on its failed attempt: whether another attempt may succeed, the error,
    and the earliest it wants the next attempt to start (seconds after now)."""

    retryable: bool
    code: str
    message: str = ""
    details: bytes = b""
    delay: float = 0.0
    # The holder gives the task back as it shuts down (domain/retry.py: not counted, bounded).
    shutdown: bool = False

    def summary(self) -> str:
        """``code: message`` for events and logs (the details stay with the attempt)."""
        return f"{self.code}: {self.message}" if self.message else self.code

    def trimmed(self) -> FailureReport:
        """The report as kept when its caller's write budget or etcd's space guard cannot take
        the whole of it: no details, the message cut to KEPT_MESSAGE characters. The failure
        itself always lands (refusing it would only leave the lease to expire)."""
        return replace(self, details=b"", message=self.message[:KEPT_MESSAGE])

    @property
    def bulky(self) -> bool:
        """Whether ``trimmed`` would drop anything."""
        return bool(self.details) or len(self.message) > KEPT_MESSAGE
