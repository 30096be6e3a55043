"""Where the SDK's channel connects: one coordinator, a list of replicas, or a DNS name of many.

gRPC resolves and balances: a list of replica addresses becomes one ``ipv4:``/``ipv6:`` target,
a DNS name yields every address it resolves to, and the channel's load-balancing policy picks
among them. The SDK's default policy is ``pick_first`` with a shuffled address list (gRFC A62):

- each client sticks to one replica, so the replica that granted a claim also serves its
  renewals and commit (store/held.py saves that commit a read; store/leases.py reuses only
  leases the replica itself refreshed); ``round_robin`` would spread one claim's calls over
  every replica and lose both;
- the shuffle spreads the clients of a pool over the replicas;
- when the replica's connection fails, the channel connects to the next address, so a retry
  goes to a replica that is up.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence

from coordinator.errors import InvalidArgument

LB_OPTION = (
    "grpc.service_config",
    json.dumps({"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": True}}]}),
)
"""The channel option of the default policy (a caller's own ``grpc.service_config`` wins)."""

# Targets gRPC resolves itself; anything else is ``host:port`` or a comma-separated list of them.
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def channel_target(target: str | Sequence[str]) -> str:
    """The gRPC target for one address, a gRPC URI (``dns:///name:7070``, ``ipv4:...``), or
    several ``host:port`` replicas given as a list or comma-separated.

    Several replicas must be IP addresses of one family: gRPC has no target that lists host
    names; give one DNS name that resolves to every replica instead.
    """
    endpoints = [target] if isinstance(target, str) else list(target)
    if len(endpoints) == 1 and endpoints[0].startswith(_SCHEMES):
        return endpoints[0]
    parts = [p.strip() for e in endpoints for p in e.split(",") if p.strip()]
    if not parts:
        raise InvalidArgument("no coordinator address given")
    if len(parts) == 1:
        return parts[0]
    families = {_family(part) for part in parts}
    if len(families) > 1:
        raise InvalidArgument(f"replica addresses mix IPv4 and IPv6: {','.join(parts)}")
    return f"{families.pop()}:{','.join(parts)}"


def _family(endpoint: str) -> str:
    """``ipv4`` or ``ipv6`` for an ``ip:port`` / ``[ip]:port`` endpoint; InvalidArgument else."""
    host, sep, port = endpoint.rpartition(":")
    try:
        if not sep or not port.isdigit():
            raise ValueError("no port")
        bracketed = host.startswith("[") and host.endswith("]")
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
        if (address.version == 6) != bracketed:
            raise ValueError("an IPv6 address needs brackets, only an IPv6 address has them")
    except ValueError:
        raise InvalidArgument(
            f"{endpoint!r}: several coordinator addresses must each be IP:PORT ([IP]:PORT for "
            "IPv6); for host names give one DNS name that resolves to every replica, e.g. "
            "'dns:///coordinator.example:7070'"
        ) from None
    return f"ipv{address.version}"
