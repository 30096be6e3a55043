"""How often grpc's sync client wakes a thread that waits for an answer or a stream message.

grpc's sync client never blocks a thread indefinitely: ``grpc._common.wait`` waits in slices of
``MAXIMUM_WAIT_TIMEOUT`` (0.1 s), so a main thread blocked in a call still runs its signal
handlers. Each wake takes the GIL. A replica follows etcd over one watch per follow stream
(coordinator.store.lifecycle.events), each read by a thread blocked in such a wait: 1,000 follow
streams woke 10,000 times a second, 0.73 of a core with nothing happening (measured by
bench.long_polls on 2 cores). A notify still ends a wait at once, whatever the slice, so a
longer slice delays nothing but a signal handler - and a replica's main thread never waits in
grpc (it waits on its stop event, coordinator.server.app.serve). With 5 s slices the same 1,000
streams cost 0.20 of a core.

Only ``serve`` (the replica's own process) lengthens the slice: a test or a program that builds
a server in its own process keeps grpc's default. grpc's internals may move: should the
attribute go, nothing is changed (tests/server/test_grpc_waits.py notices).
"""

from __future__ import annotations

import grpc._common as grpc_common  # grpc's own, no API

REPLICA_WAIT_SLICE = 5.0
"""Seconds a replica's threads wait in grpc before waking to look again."""


def lengthen_wait_slices(seconds: float = REPLICA_WAIT_SLICE) -> bool:
    """Let grpc's sync waits sleep ``seconds`` between looks; whether grpc had the setting."""
    if not isinstance(getattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", None), float):
        return False
    grpc_common.MAXIMUM_WAIT_TIMEOUT = seconds
    return True
