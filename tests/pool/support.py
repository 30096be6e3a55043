"""What the pool tests share."""

from __future__ import annotations


class RecordedPool:
    """What ``stop_on_signals`` calls on a pool, in order."""

    stopped = False  # its run() has not returned

    def __init__(self) -> None:
        self.calls: list[str] = []

    def stop(self) -> None:
        self.calls.append("stop")

    def hurry(self) -> None:
        self.calls.append("hurry")
