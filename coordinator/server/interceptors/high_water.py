"""High-water shares at the door: above etcd's high-water mark, a growth call still goes when
its caller's share admits it.

Above the mark the space guard (domain/space.py) refuses writes that only add data. Refusing
them to everyone stops a pool that creates small tasks because one token churned etcd full, so
each principal keeps a share of its write budget (``share`` of its rate over the same window,
``write_budget_high_water_share``): a call whose bytes fit its caller's share runs inside
``within_share()`` and its growth writes go; one that does not runs as before and the store
refuses it typed (a renewal's checkpoint is not kept, the renewal is). A principal that filled
etcd spent its share long ago; one that writes little has all of it. Above the full mark
(``etcd_quota_full``) shares count for nothing. Below the mark nothing is charged or wrapped.
"""

from __future__ import annotations

from typing import Any

import grpc

from coordinator.domain.space import SpaceState
from coordinator.server.identity import identity_of
from coordinator.server.interceptors.handlers import Handler, unary_handler
from coordinator.server.interceptors.write_budgets import (
    CHARGED_METHODS,
    WriteBudgets,
    growth_bytes,
)
from coordinator.store.etcd.space_guard import SpaceGuard, within_share


class HighWaterShareInterceptor:
    """Opens ``within_share()`` around the growth calls their callers' shares admit (see the
    module docstring); placed before idempotency, so a keyed create's key goes with it."""

    def __init__(self, guard: SpaceGuard, shares: WriteBudgets) -> None:
        self._guard = guard
        self._shares = shares

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap the growth methods (their calls pass while etcd is below the high-water mark)."""
        if method not in CHARGED_METHODS or handler.unary_unary is None:
            return handler
        run = handler.unary_unary
        shares, guard = self._shares, self._guard

        def shared(request: Any, context: grpc.ServicerContext) -> Any:
            if guard.state is not SpaceState.HIGH_WATER:
                return run(request, context)
            if not shares.fits(identity_of(context), growth_bytes(method, request)):
                return run(request, context)  # the store refuses its growth, typed
            with within_share():
                return run(request, context)

        return unary_handler(handler, shared)
