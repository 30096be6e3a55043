"""Authentication and roles: one interceptor, one table of which role may call which RPC.

Every call to a coordinator service passes ``AuthInterceptor`` first. It authenticates the
caller (bearer token, client certificate, or - in insecure mode only - the metadata the caller
sends), refuses it UNAUTHENTICATED if that fails, looks the method up in ``ROLE_TABLE`` and
refuses PERMISSION_DENIED if none of the caller's roles may call it. A method missing from the
table is refused too (fail closed): a new RPC is unreachable until someone decides who may call
it. The handler then runs with the caller's Identity in ``identity.CURRENT_IDENTITY``, which is
where servicers (``principal_of``) and later interceptors (idempotency) find it.

Health checking and reflection stay open: load balancers and grpcurl must not need a token.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

import grpc
import structlog

from coordinator.config import Config, is_loopback
from coordinator.domain.roles import (
    ALL_ROLES,
    Identity,
    Role,
    check_principal,
    format_roles,
    parse_roles,
)
from coordinator.errors import ConfigError, InvalidArgument, PermissionDenied, Unauthenticated
from coordinator.server.identity import (
    ANONYMOUS,
    AUTHORIZATION_METADATA_KEY,
    CURRENT_IDENTITY,
    PRINCIPAL_METADATA_KEY,
    ROLES_METADATA_KEY,
)
from coordinator.server.interceptors.handlers import Handler, rebuilt, streams_responses
from coordinator.server.status import status_code_of
from coordinator.server.tls import PeerProperties, ServerTLS, certificate_names, over_tls
from coordinator.server.tokens import TokenFile, token_hash

log = structlog.get_logger(__name__)

_W, _P, _A = Role.WORKER, Role.PM, Role.ADMIN
_ANY = frozenset({_W, _P, _A})
_WORKER = "/coordinator.v1.WorkerService/"
_TASKS = "/coordinator.v1.TaskService/"
_ADMIN = "/coordinator.v1.AdminService/"

ROLE_TABLE: Mapping[str, frozenset[Role]] = {
    # Workers claim and reach the acceptance points of their own claims (the owner check is
    # the store's: a worker never acts on another principal's attempt).
    _WORKER + "Claim": frozenset({_W}),
    _WORKER + "ClaimNext": frozenset({_W}),
    _WORKER + "Renew": frozenset({_W}),
    _WORKER + "RenewMany": frozenset({_W}),
    _WORKER + "AuthorizeTool": frozenset({_W}),
    _WORKER + "StageResult": frozenset({_W}),
    _WORKER + "Commit": frozenset({_W}),
    _WORKER + "Release": frozenset({_W}),
    _WORKER + "Fail": frozenset({_W}),
    _WORKER + "PrepareEffect": frozenset({_W}),
    _WORKER + "RecordEffect": frozenset({_W}),
    # The owner of an open reconciliation (a worker) or an admin resolves an uncertain effect
    # without a claim; the store checks which one the caller is.
    _WORKER + "ResolveEffect": frozenset({_W, _A}),
    # Listing the uncertain effects is a read, open to every role: the owners (workers) and
    # admins who resolve them, and the pms whose tasks they hold up.
    _WORKER + "ListOpenEffects": _ANY,
    _WORKER + "ListEffects": _ANY,
    # One effect by its id: the same read as a line of ListEffects (`coordinator effects show`
    # was refused to the pms and admins `effects list` answers).
    _WORKER + "GetEffect": _ANY,
    # Managed jobs: a worker records and lists its own (the store checks the owner); an admin
    # may list any worker's jobs.
    _WORKER + "StartJob": frozenset({_W}),
    _WORKER + "FinishJob": frozenset({_W}),
    _WORKER + "ListJobs": frozenset({_W, _A}),
    # Producers and reviewers (pm) shape the work; admins may too.
    _TASKS + "CreateTask": frozenset({_P, _A}),
    _TASKS + "UpdateInput": frozenset({_P, _A}),
    _TASKS + "CancelTask": frozenset({_P, _A}),
    _TASKS + "RetryTask": frozenset({_P, _A}),
    _TASKS + "RetryTasks": frozenset({_P, _A}),
    _TASKS + "Accept": frozenset({_P, _A}),
    _TASKS + "Reject": frozenset({_P, _A}),
    _TASKS + "SetDependencies": frozenset({_P, _A}),
    # A committed result is the work product: its producers and reviewers (pm) read it, and
    # admins; a worker has no need to read another attempt's work.
    _TASKS + "GetResult": frozenset({_P, _A}),
    # Reads are open to every role: the same records GetTask returns, nothing more.
    _TASKS + "GetTask": _ANY,
    _TASKS + "ListAttempts": _ANY,
    _TASKS + "ListTasks": _ANY,
    _TASKS + "WatchEvents": _ANY,
    _TASKS + "ListEvents": _ANY,
    # Live claims with their leases (the console's claims page), and a task's neighbours in
    # the dependency graph: reads of what GetTask and ListTasks already show, nothing more.
    _TASKS + "ListClaims": _ANY,
    _TASKS + "ListDependencies": _ANY,
    # Workers pin the epoch they claim under, so every role reads it.
    _ADMIN + "GetEpoch": _ANY,
    _ADMIN + "DrainStatus": frozenset({_P, _A}),
    _ADMIN + "GetStats": frozenset({_P, _A}),
    # The safe-rollback controls and approvals of uncertain effects are admin-only.
    _ADMIN + "BumpEpoch": frozenset({_A}),
    _ADMIN + "PauseClaims": frozenset({_A}),
    _ADMIN + "ResumeClaims": frozenset({_A}),
    _ADMIN + "ApproveRetry": frozenset({_A}),
    # The version gate: everyone may read the record; raising a minimum is admin-only.
    _ADMIN + "GetVersions": _ANY,
    _ADMIN + "SetMinimumVersions": frozenset({_A}),
}
"""gRPC method path -> the roles that may call it. Anything absent is refused."""

OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Method-path prefixes served without authentication."""

Metadata = Sequence[tuple[str, str | bytes]]


class Authenticator(Protocol):
    """Turns a call's metadata and TLS peer properties into an Identity."""

    @property
    def insecure(self) -> bool:
        """Whether callers may name themselves (no authentication)."""
        ...

    def authenticate(self, metadata: Metadata, peer: PeerProperties) -> Identity:
        """The caller; Unauthenticated (or InvalidArgument for malformed metadata) if not."""
        ...

    def refresh(self) -> None:
        """Take in a credential change now rather than at the next periodic reload."""
        ...


class InsecureAuth:
    """No authentication: the caller names its principal and roles in metadata.

    For local use, the demo and tests only. ``x-coordinator-principal`` (default
    ``anonymous``) and ``x-coordinator-roles`` (a comma list; default: every role).
    """

    insecure = True

    def authenticate(self, metadata: Metadata, peer: PeerProperties) -> Identity:
        """Believe what the caller says about itself."""
        del peer
        values = _metadata_dict(metadata)
        principal = values.get(PRINCIPAL_METADATA_KEY)
        roles_text = values.get(ROLES_METADATA_KEY)
        return Identity(
            principal=ANONYMOUS
            if principal is None
            else check_principal(PRINCIPAL_METADATA_KEY, principal),
            roles=ALL_ROLES
            if roles_text is None
            else parse_roles(ROLES_METADATA_KEY, roles_text.split(",")),
        )

    def refresh(self) -> None:
        """Nothing to refresh: callers name themselves."""


class TokenAuth:
    """Bearer tokens from a token file, and (with mutual TLS) client-certificate principals.

    A bearer token, when sent, decides (and must be valid). Without one, a verified client
    certificate names the principal: of its URI and DNS subject alternative names (its common
    name only if it has no SAN; ``tls.certificate_names``), the first that the token file's
    ``certificates`` section lists; its roles come from there.
    """

    insecure = False

    def __init__(
        self,
        tokens: TokenFile,
        *,
        client_certificates: bool = False,
        require_tls: bool = False,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``require_tls``: refuse calls that did not arrive over TLS (the plaintext
        ``health_listen`` port then serves health checks and nothing else)."""
        self._tokens = tokens
        self._client_certificates = client_certificates
        self._require_tls = require_tls
        self._now = now

    def authenticate(self, metadata: Metadata, peer: PeerProperties) -> Identity:
        """The token's or the certificate's identity; Unauthenticated otherwise."""
        if self._require_tls and not over_tls(peer):
            raise Unauthenticated("this port serves health checks only; call the TLS port")
        authorization = _metadata_dict(metadata).get(AUTHORIZATION_METADATA_KEY)
        if authorization is not None:
            return self._by_token(authorization)
        if self._client_certificates:
            names = certificate_names(peer)
            if names:
                return self._by_certificate(names)
        raise Unauthenticated(
            "no credentials: send 'authorization: Bearer <token>'"
            + (" or a client certificate" if self._client_certificates else "")
        )

    def refresh(self) -> None:
        """Re-read the token file now if it changed (one ``stat`` when it did not)."""
        self._tokens.reload()

    def _by_token(self, authorization: str) -> Identity:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
        entry = self._tokens.table().tokens.get(token_hash(token.strip()))
        if entry is None:
            raise Unauthenticated("unknown or revoked bearer token")
        if entry.expires_at is not None and self._now() >= entry.expires_at:
            raise Unauthenticated(f"bearer token expired at {entry.expires_at.isoformat()}")
        return Identity(principal=entry.principal, roles=entry.roles)

    def _by_certificate(self, names: list[str]) -> Identity:
        certificates = self._tokens.table().certificates
        for name in names:
            roles = certificates.get(name)
            if roles is not None:
                return Identity(principal=name, roles=roles)
        # Authenticated by the CA, but nobody granted this principal a role.
        return Identity(principal=names[0], roles=frozenset())


def _metadata_dict(metadata: Metadata) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, value in metadata:
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        values.setdefault(key, text)
    return values


class AuthInterceptor:
    """Authenticates every call, enforces ``ROLE_TABLE``, and runs the handler as the caller."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap the method's handler; open services pass through."""
        if method.startswith(OPEN_SERVICES):
            return handler
        return _wrap(handler, lambda context: self._admit(method, context))

    def refresh(self) -> None:
        """Take in a credential change now (``Authenticator.refresh``)."""
        self._auth.refresh()

    def check(self, method: str, metadata: Metadata, peer: PeerProperties) -> Identity:
        """The caller's identity if it may call ``method``; Unauthenticated, InvalidArgument or
        PermissionDenied otherwise. Long-lived calls run it again while they last, so credentials
        revoked or expired meanwhile end them (coordinator.server.streams)."""
        identity = self._auth.authenticate(metadata, peer)
        allowed = ROLE_TABLE.get(method)
        if allowed is None:
            raise PermissionDenied(
                f"{method} has no entry in the role table; refused (principal "
                f"{identity.principal!r})"
            )
        if not identity.may(allowed):
            held = format_roles(identity.roles) or "none"
            raise PermissionDenied(
                f"principal {identity.principal!r} (roles: {held}) may not call {method}; "
                f"allowed roles: {format_roles(allowed)}"
            )
        return identity

    def _admit(self, method: str, context: grpc.ServicerContext) -> Identity:
        """The caller's identity if it may call ``method``; aborts the call otherwise."""
        try:
            return self.check(method, call_metadata(context), peer_properties(context))
        except (Unauthenticated, InvalidArgument, PermissionDenied) as exc:
            _refuse(context, method, status_code_of(exc), str(exc))


def call_metadata(context: grpc.ServicerContext) -> Metadata:
    """The call's invocation metadata (what ``AuthInterceptor.check`` reads)."""
    return tuple(context.invocation_metadata() or ())


def peer_properties(context: grpc.ServicerContext) -> PeerProperties:
    """The call's TLS peer properties (what ``AuthInterceptor.check`` reads)."""
    properties: Any = context.auth_context() or {}
    return {key: list(values) for key, values in properties.items()}


def _refuse(
    context: grpc.ServicerContext, method: str, code: grpc.StatusCode, message: str
) -> NoReturn:
    log.info("rpc refused", rpc=method, code=code.name, error=message, peer=context.peer())
    context.abort(code, message)


def _wrap(handler: Handler, admit: Callable[[grpc.ServicerContext], Identity]) -> Handler:
    """The same handler, whose behaviour first admits the caller and then runs as it.

    grpc's sync server runs the behaviour (and, for a streaming response, every ``next``) in
    the handler thread, so the identity is set in a copied context around exactly that code.
    """

    def admitted(context: grpc.ServicerContext) -> contextvars.Context:
        identity = admit(context)
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_IDENTITY.set, identity)
        return ctx

    def unary_response(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            return admitted(context).run(behavior, request, context)

        return run

    def stream_response(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            ctx = admitted(context)
            responses = ctx.run(behavior, request, context)
            while True:
                try:
                    yield ctx.run(next, responses)
                except StopIteration:
                    return

        return run

    return rebuilt(
        handler,
        lambda kind, behavior: (
            stream_response(behavior) if streams_responses(kind) else unary_response(behavior)
        ),
    )


def authenticator_for(config: Config) -> Authenticator:
    """The authenticator ``config`` asks for; ConfigError naming the setting if it cannot be.

    No authentication is configured only with an explicit ``insecure`` (Config refuses it on a
    non-loopback listen address unless ``insecure_allow_remote``).
    """
    problem = config.auth_problem()
    if problem is not None:
        raise ConfigError(problem)
    if config.insecure:
        return InsecureAuth()
    assert config.token_file is not None  # auth_problem() saw to it
    tokens = TokenFile(config.token_file, reload_interval=config.token_reload_interval)
    return TokenAuth(
        tokens,
        client_certificates=config.tls_client_ca is not None,
        require_tls=config.tls_cert is not None,
    )


def tls_for(config: Config) -> ServerTLS | None:
    """The gRPC port's TLS settings, or None for plaintext."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    return ServerTLS(cert=config.tls_cert, key=config.tls_key, client_ca=config.tls_client_ca)


def local_default(listen: str) -> Authenticator:
    """``build_server``'s authenticator when none is given: insecure, and loopback only."""
    if not is_loopback(listen):
        raise ConfigError(
            f"listen: {listen!r} is not a loopback address; a server reachable from elsewhere "
            "needs an explicit authenticator"
        )
    return InsecureAuth()


def auth_mode(config: Config) -> str:
    """How callers are authenticated, for the start-up log line (``tokens+mtls``, ...)."""
    if config.insecure:
        return "insecure"
    transport = "+mtls" if config.tls_client_ca else "+tls" if config.tls_cert else "+plaintext"
    return "tokens" + transport
