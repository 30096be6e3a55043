"""Where the SDK's channels connect: one coordinator, a list of replicas, or a DNS name of many.

A list of replica addresses gives one channel per replica (``Endpoints``). Every call goes to
one of them, the current one (a random one at first, so the clients of a pool spread over the
replicas), and the client sticks to it: the replica that granted a claim also serves its
renewals and commit (store/attempts/views.py saves that commit a read; store/etcd/leases.py reuses
only leases the replica itself refreshed), which ``round_robin`` over the addresses would lose for
every call. When a try fails in a way the SDK retries (UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED), the client moves on to the next replica, so the retry goes elsewhere.
That covers a replica that answers UNAVAILABLE itself (its etcd is unreachable: the server
answers StoreUnavailable), which gRPC's own failover never leaves, since its connection is
fine.

One address, or a DNS name that resolves to several, is one channel, and gRPC balances: the
policy is ``pick_first`` with a shuffled address list (gRFC A62), which sticks to one address and
moves on only when its connection fails.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

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


def endpoint_targets(target: str | Sequence[str]) -> list[str]:
    """One gRPC target per replica named: several ``host:port`` addresses (a list, or
    comma-separated, or an ``ipv4:``/``ipv6:`` URI of several) give one each; one address or
    any other URI (a DNS name) gives one."""
    whole = channel_target(target)
    scheme, _, addresses = whole.partition(":")
    if scheme in ("ipv4", "ipv6") and "," in addresses:
        return [f"{scheme}:{address}" for address in addresses.split(",")]
    return [whole]


class Endpoints:
    """The channels to the replicas a client was given, used as one channel (the stubs are
    made on ``channel``): each call goes to the current replica, and ``failed(at)`` moves the
    client on to the next one after a try at replica ``at`` failed.

    Duck-types the channel methods the generated stubs call, for sync and ``grpc.aio``
    channels alike; closing the channels is their owner's (their close differs).
    """

    def __init__(self, channels: Sequence[Any], *, first: int) -> None:
        self._channels = list(channels)
        self._current = first % len(self._channels)
        self._lock = threading.Lock()

    @property
    def channel(self) -> Any:
        """What the stubs are made on: the one channel itself, or these endpoints."""
        return self._channels[0] if len(self._channels) == 1 else self

    @property
    def current(self) -> int:
        """The replica calls go to now (its index in the list given)."""
        return self._current

    def failed(self, at: int) -> None:
        """A try at replica ``at`` failed and will be retried: move on, unless another call's
        failure already did (calls failing together move the client once, not once each)."""
        with self._lock:
            if self._current == at:
                self._current = (at + 1) % len(self._channels)

    def unary_unary(self, *args: Any, **kwargs: Any) -> _OnCurrent:
        """A unary method, sent to the current replica at each call."""
        return _OnCurrent(self, lambda channel: channel.unary_unary(*args, **kwargs))

    def unary_stream(self, *args: Any, **kwargs: Any) -> _OnCurrent:
        """A server-streaming method, opened on the current replica at each call."""
        return _OnCurrent(self, lambda channel: channel.unary_stream(*args, **kwargs))

    def stream_unary(self, *args: Any, **kwargs: Any) -> _OnCurrent:
        """A client-streaming method (none in the API; for completeness)."""
        return _OnCurrent(self, lambda channel: channel.stream_unary(*args, **kwargs))

    def stream_stream(self, *args: Any, **kwargs: Any) -> _OnCurrent:
        """A bidirectional method (none in the API; for completeness)."""
        return _OnCurrent(self, lambda channel: channel.stream_stream(*args, **kwargs))

    def multi_callable(self, at: int, make: Callable[[Any], Any], made: list[Any]) -> Any:
        """``make``'s multi-callable on replica ``at``, made once (``made`` is its cache)."""
        if made[at] is None:
            made[at] = make(self._channels[at])
        return made[at]

    @property
    def count(self) -> int:
        """How many replicas."""
        return len(self._channels)


class _OnCurrent:
    """One method's multi-callable on every replica (made when first used), each call sent to
    the replica that is current when it is made."""

    def __init__(self, endpoints: Endpoints, make: Callable[[Any], Any]) -> None:
        self._endpoints = endpoints
        self._make = make
        self._made: list[Any] = [None] * endpoints.count

    def _now(self) -> Any:
        return self._endpoints.multi_callable(self._endpoints.current, self._make, self._made)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._now()(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        """The sync API's ``with_call`` (client interceptors use it)."""
        return self._now().with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        """The sync API's ``future`` (client interceptors use it)."""
        return self._now().future(*args, **kwargs)
