"""Turn etcd's own authentication on for one coordinator keyspace, idempotently.

etcd without auth lets anything that reaches its client port write every key, so a pod that
bypasses the coordinator bypasses every token and fence with it. ``ensure_auth`` leaves etcd
with:

* ``root`` (role ``root``) holding ``root_password``: the only admin, used by this setup and by
  maintenance (defragmentation);
* a role named like ``user`` that may read and write exactly ``<prefix>/...`` and nothing else;
* ``user`` holding ``password`` and only that role (what ``coordinator serve`` logs in as);
* auth enabled.

Run again (every ``helm upgrade`` does), it logs in as root and brings the same state back: a
changed coordinator password or prefix is applied, a permission on another range is revoked.
The chart runs it as a Job (``coordinator etcd-auth``); it speaks etcd's Auth API directly, so
the etcd image needs no shell.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from etcd3 import etcdrpc
from etcd3.etcdrpc import auth_pb2

from coordinator.errors import CoordinatorError

ROOT = "root"

# etcd's answers (server/etcdserver/api/v3rpc/rpctypes), matched on their fixed text.
_AUTH_NOT_ENABLED = "authentication is not enabled"
_USER_EXISTS = "user name already exists"
_ROLE_EXISTS = "role name already exists"


class EtcdAuthError(CoordinatorError):
    """etcd refused the setup (wrong root password, unreachable, not permitted)."""


class AuthOutcome(enum.Enum):
    """What ``ensure_auth`` found."""

    ENABLED = "enabled"
    """Auth was off: users and role created, auth turned on."""
    RECONCILED = "reconciled"
    """Auth was already on: users, passwords and the role's range brought in line."""


@dataclass(frozen=True)
class EtcdTLS:
    """PEM files for TLS to etcd: its CA, and a client certificate with key."""

    ca_cert: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files."""

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            read(self.ca_cert), private_key=read(self.key), certificate_chain=read(self.cert)
        )


@dataclass(frozen=True)
class AuthPlan:
    """The state ``ensure_auth`` leaves: who may log in, with which password, to which range."""

    root_password: str
    user: str
    password: str
    prefix: str

    def __post_init__(self) -> None:
        if self.user == ROOT:
            raise ValueError("the coordinator's etcd user must not be root")
        for name in ("root_password", "password"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")

    @property
    def key(self) -> bytes:
        """First key of the coordinator's range (every key is ``<prefix>/...``)."""
        return f"{self.prefix}/".encode()

    @property
    def range_end(self) -> bytes:
        """End of the range (exclusive): ``<prefix>0``, the key after every ``<prefix>/...``."""
        return f"{self.prefix}0".encode()


def ensure_auth(
    endpoints: Sequence[str], plan: AuthPlan, *, tls: EtcdTLS | None, timeout: float = 10.0
) -> AuthOutcome:
    """Bring etcd's users, role and auth switch to ``plan`` (see the module docstring).

    Tries each endpoint in turn; EtcdAuthError if none answers or etcd refuses.
    """
    errors = []
    for endpoint in endpoints:
        channel = (
            grpc.secure_channel(endpoint, tls.credentials())
            if tls
            else grpc.insecure_channel(endpoint)
        )
        try:
            return _Session(etcdrpc.AuthStub(channel), timeout).ensure(plan)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise EtcdAuthError(f"etcd refused: {exc.code().name}: {exc.details()}") from exc
            errors.append(f"{endpoint}: {exc.details()}")
        finally:
            channel.close()
    raise EtcdAuthError(f"no etcd endpoint answered: {'; '.join(errors)}")


class _Session:
    """Auth API calls on one channel, as root once auth is on."""

    def __init__(self, auth: Any, timeout: float) -> None:
        self._auth = auth
        self._timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = ()

    def ensure(self, plan: AuthPlan) -> AuthOutcome:
        enabled = self._login(plan.root_password)
        # Once logged in, root's password is already right; changing it would end the session.
        self._user(ROOT, plan.root_password, role=ROOT, set_password=not enabled)
        self._role_range(plan)
        self._user(plan.user, plan.password, role=plan.user)
        if enabled:
            return AuthOutcome.RECONCILED
        self._call(self._auth.AuthEnable, etcdrpc.AuthEnableRequest())
        return AuthOutcome.ENABLED

    def _login(self, root_password: str) -> bool:
        """Log in as root; False if auth is still off (every call is allowed then)."""
        request = etcdrpc.AuthenticateRequest(name=ROOT, password=root_password)
        try:
            token = self._auth.Authenticate(request, self._timeout).token
        except grpc.RpcError as exc:
            if _AUTH_NOT_ENABLED in (exc.details() or ""):
                return False
            if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                raise EtcdAuthError(
                    "etcd auth is on and root's password is not the one given: "
                    "etcd keeps the password it was enabled with"
                ) from exc
            raise
        self._metadata = (("token", token),)
        return True

    def _user(self, name: str, password: str, *, role: str, set_password: bool = True) -> None:
        """``name`` exists with ``password`` and exactly the role ``role``."""
        added = self._tolerate(
            _USER_EXISTS,
            self._auth.UserAdd,
            etcdrpc.AuthUserAddRequest(name=name, password=password),
        )
        if not added and set_password:
            self._call(
                self._auth.UserChangePassword,
                etcdrpc.AuthUserChangePasswordRequest(name=name, password=password),
            )
        self._tolerate(_ROLE_EXISTS, self._auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=role))
        user = self._call(self._auth.UserGet, etcdrpc.AuthUserGetRequest(name=name))
        for other in set(user.roles) - {role}:
            self._call(
                self._auth.UserRevokeRole,
                etcdrpc.AuthUserRevokeRoleRequest(name=name, role=other),
            )
        self._call(self._auth.UserGrantRole, etcdrpc.AuthUserGrantRoleRequest(user=name, role=role))

    def _role_range(self, plan: AuthPlan) -> None:
        """The role ``plan.user`` reads and writes the prefix's range, and nothing else."""
        self._tolerate(_ROLE_EXISTS, self._auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=plan.user))
        role = self._call(self._auth.RoleGet, etcdrpc.AuthRoleGetRequest(role=plan.user))
        for perm in role.perm:
            if (perm.key, perm.range_end) != (plan.key, plan.range_end):
                self._call(
                    self._auth.RoleRevokePermission,
                    etcdrpc.AuthRoleRevokePermissionRequest(
                        role=plan.user, key=perm.key, range_end=perm.range_end
                    ),
                )
        permission = auth_pb2.Permission(
            permType=auth_pb2.Permission.READWRITE, key=plan.key, range_end=plan.range_end
        )
        self._call(
            self._auth.RoleGrantPermission,
            etcdrpc.AuthRoleGrantPermissionRequest(name=plan.user, perm=permission),
        )

    def _tolerate(self, exists: str, method: Callable[..., Any], request: Any) -> bool:
        """Call an "add"; False if etcd says it already exists."""
        try:
            self._call(method, request)
        except grpc.RpcError as exc:
            if exists in (exc.details() or ""):
                return False
            raise
        return True

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        return method(request, self._timeout, metadata=self._metadata)
