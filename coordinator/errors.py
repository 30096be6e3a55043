"""The one exception root of the coordinator and its subclasses.

Exceptions are for bad input and broken infrastructure. Business outcomes (FENCED,
ALREADY_CLAIMED, ...) are typed results, never exceptions. The server maps each class below to
one gRPC status code (coordinator.server.status); etcd and gRPC errors are translated at the
boundary with ``raise ... from``.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Root of every error the coordinator raises on purpose."""


class InvalidArgument(CoordinatorError):
    """A request field is missing, malformed or out of range. Nothing was written."""


class NotFound(CoordinatorError):
    """The named task (or attempt) does not exist. Nothing was written."""


class AlreadyExists(CoordinatorError):
    """The entity to create exists already. Nothing was written."""


class FailedPrecondition(CoordinatorError):
    """The request is well-formed but the system is not in a state that allows it."""


class PermissionDenied(CoordinatorError):
    """The caller may not act on this entity (e.g. another principal's attempt)."""


class Unauthenticated(CoordinatorError):
    """The caller presented no valid credentials."""


class ResourceExhausted(CoordinatorError):
    """A bounded resource of the server is full (e.g. open streams); retry later or raise the
    setting the message names. Nothing was written."""


class SpaceRefused(ResourceExhausted):
    """The space guard (store/etcd/space_guard.py) refused a write because etcd's database is above
    its high-water mark or etcd's NOSPACE alarm is active; the message names which and when to
    retry. Nothing was sent to etcd."""


class Undelivered(CoordinatorError):
    """A claim's answer could not reach its caller (it cancelled, its deadline passed, or the
    server is ending the call), so the claim was given back (gRPC CANCELLED). Raised rather
    than answered so that nothing stores the answer for a replay (an idempotency key)."""


class StoreUnavailable(CoordinatorError):
    """etcd could not be reached or did not answer in time; the call may be retried."""


class ReplicaRefused(CoordinatorError):
    """The keyspace's version record refuses this replica (too old a binary, or one that knows
    too old a schema): another replica may serve the call (gRPC UNAVAILABLE)."""


class StoreRefused(CoordinatorError):
    """etcd (or whatever answers at its endpoint) refused the request itself: a malformed txn,
    auth, quota, or a server that is not etcd at all. Retrying the same request cannot help."""


class LeaseGone(CoordinatorError):
    """etcd no longer has the lease a write was to be attached to. Nothing was written."""


class ConfigError(CoordinatorError):
    """A setting is invalid; the message names the setting."""


class EtcdNotFound(ConfigError):
    """No etcd binary could be located for the embedded mode."""
