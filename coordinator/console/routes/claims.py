"""The live claims page: every live claim with its holder, fence, attempt, its lease as etcd
reports it (ListClaims reads LeaseTimeToLive: the expiry counts down from what etcd said, not
from the TTL the worker asked for), when a renewal last refreshed it, and its progress marker.

Renewals are not counted: a renewal writes to etcd only when its progress marker moves, and a
count would add a write to every one. The lease says when etcd last refreshed it instead
("renewed N s ago"). The table refreshes itself every few seconds and, between refreshes, the
page's script counts every span on from the coordinator's reading (never the browser's clock
against the server's)."""

from __future__ import annotations

from starlette.requests import Request

from coordinator.console.routes.common import Context, page_token
from coordinator.console.settings import ConsoleSettings
from coordinator.console.views import claim_row
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import tasks_pb2

MAX_CLAIMS_PAGE = 100
"""ListClaims serves at most this many per page (each claim is one lease read in etcd)."""


def claims(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """One page of live claims, optionally of one queue."""
    queue = request.query_params.get("queue", "")[:64]
    token = page_token(request, "page_token")
    reply = rpc.call(
        rpc.tasks.ListClaims,
        tasks_pb2.ListClaimsRequest(
            queue=queue, page_size=min(settings.page_size, MAX_CLAIMS_PAGE), page_token=token
        ),
    )
    return {
        "queue": queue,
        "claims": [claim_row(c, reply.read_at) for c in reply.claims],
        "read_at": reply.read_at,
        "next_page_token": reply.next_page_token,
    }
