"""A sink plugin for one test: the archive write completes (fsynced), then the process is
SIGKILLed before it can run the prune txn. Installed in a child ``coordinator serve`` by
``python -c "import tests.retention.killing_sink as k; k.install(); ..."``: it wraps the sink
the server opens, so no hook or fault point lives in the production code."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

from coordinator.archive import ArchiveSink
from tests.retention.sinks import WrappedSink


class KillAfterWrite(WrappedSink):
    """Writes through ``inner``, then kills this process with SIGKILL (no cleanup runs)."""

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        self.inner.write(objects)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: the process was killed")


def install() -> None:
    """Make ``coordinator serve`` in this process archive through KillAfterWrite."""
    from coordinator.server import app

    names = vars(app)  # the name app.py calls when it opens the configured sink
    real = names["open_sink"]

    def killing(url: str, *, setting: str = "archive") -> ArchiveSink:
        return KillAfterWrite(real(url, setting=setting))

    names["open_sink"] = killing
