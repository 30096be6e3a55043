"""The token file: who holds which bearer token (by hash) and which certificate principal has
which roles; reloaded when the file changes, without a restart.

Format (JSON; see docs/deploy.md)::

    {
      "tokens": {
        "<sha256 hex of the token>": {"principal": "worker-1", "roles": ["worker"],
                                      "expires_at": "2026-01-01T00:00:00Z"}
      },
      "certificates": {
        "worker-7.pool.example": {"roles": ["worker"]}
      }
    }

Why JSON rather than YAML: the standard library reads it (no dependency in the server), it has
no implicit typing (YAML reads ``no`` as false, ``0x1F`` as a number), and the file is usually
written by ``coordinator token new``, not by hand. Only hashes are stored, so the file (a
Kubernetes Secret) grants nothing by itself if it leaks.

Reload: ``TokenFile.table()`` re-reads the file when its (mtime, inode, size, mode) changed,
checking at most once per ``reload_interval``. Kubernetes updates a mounted Secret by swapping a
symlink, which changes the inode; ``stat`` follows the link. A file that fails to parse on reload
leaves the previous table in force and logs an error: a typo must not lock every worker out.

Permissions: a file that group or others may write is refused (whoever can write it can grant
themselves any role). Read access is no concern, the file holds hashes only: a Kubernetes Secret
volume's files are symlinks to mode 0644 files by default, and load. The mode is checked on the
opened file, so a swap between the check and the read cannot slip a different file in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from coordinator.domain.roles import Role, check_principal, parse_roles
from coordinator.errors import ConfigError, CoordinatorError

log = structlog.get_logger(__name__)

_HEX64 = frozenset("0123456789abcdef")


def token_hash(token: str) -> str:
    """The sha256 hex digest a token file stores for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    """One bearer token's holder, roles and optional expiry."""

    principal: str
    roles: frozenset[Role]
    expires_at: datetime | None = None


@dataclass(frozen=True)
class TokenTable:
    """The parsed file: token hash -> entry, certificate principal -> roles."""

    tokens: Mapping[str, TokenEntry] = field(default_factory=dict)
    certificates: Mapping[str, frozenset[Role]] = field(default_factory=dict)


def parse_token_file(text: str, *, source: str = "token_file") -> TokenTable:
    """Parse and validate the whole file; ConfigError naming ``source`` and the bad entry."""
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, _DuplicateKey) as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the top level must be an object")
    unknown = set(doc) - {"tokens", "certificates"}
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}")
    try:
        tokens = {
            _check_hash(source, h): _token_entry(f"{source}: tokens[{h[:12]}...]", e)
            for h, e in _section(source, doc, "tokens").items()
        }
        certificates = {
            check_principal(f"{source}: certificates key", p): _roles(
                f"{source}: certificates[{p}]", e
            )
            for p, e in _section(source, doc, "certificates").items()
        }
    except CoordinatorError as exc:
        raise ConfigError(str(exc)) from exc
    return TokenTable(tokens=tokens, certificates=certificates)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's default keeps the last of two equal keys silently; a token file must not."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(f"duplicate key {key!r}")
        result[key] = value
    return result


def _section(source: str, doc: dict[str, Any], name: str) -> dict[str, Any]:
    section = doc.get(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: {name} must be an object")
    return section


def _check_hash(source: str, value: str) -> str:
    if len(value) != 64 or not set(value) <= _HEX64:
        raise ConfigError(
            f"{source}: token key {value[:70]!r} must be the 64-character lower-case sha256 "
            "hex digest of the token (coordinator token new writes it)"
        )
    return value


def _token_entry(where: str, entry: Any) -> TokenEntry:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    unknown = set(entry) - {"principal", "roles", "expires_at", "note"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    principal = entry.get("principal")
    if not isinstance(principal, str):
        raise ConfigError(f"{where}: principal is required")
    expires_at = None
    if entry.get("expires_at") is not None:
        expires_at = _timestamp(f"{where}: expires_at", entry["expires_at"])
    return TokenEntry(
        principal=check_principal(f"{where}: principal", principal),
        roles=_roles(where, entry),
        expires_at=expires_at,
    )


def _roles(where: str, entry: Any) -> frozenset[Role]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    names = entry.get("roles")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: roles must be a list of role names")
    roles = parse_roles(f"{where}: roles", names)
    if not roles:
        raise ConfigError(f"{where}: roles must name at least one role")
    return roles


def _timestamp(where: str, value: Any) -> datetime:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be an RFC 3339 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(f"{where} must be an RFC 3339 timestamp, got {value!r}") from exc
    if parsed.tzinfo is None:
        raise ConfigError(f"{where} must carry a time zone (e.g. a trailing Z), got {value!r}")
    return parsed.astimezone(UTC)


Signature = tuple[int, int, int, int]


def _signature(st: os.stat_result) -> Signature:
    # The mode is part of it: a chmod alone (which leaves mtime alone) must be noticed too.
    return st.st_mtime_ns, st.st_ino, st.st_size, st.st_mode


def _check_mode(path: Path, st: os.stat_result) -> None:
    """ConfigError if group or others may write the file (what the path resolves to)."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigError(
            f"token_file {str(path)!r} has mode {mode:04o}: group or others may write it and so "
            f"grant themselves any role; refused. Fix: chmod 600 {path}"
        )


def _load(path: Path) -> tuple[Signature, TokenTable]:
    """Read, check and parse ``path``; OSError if unreadable, ConfigError if refused."""
    with path.open("rb") as file:
        st = os.fstat(file.fileno())
        _check_mode(path, st)
        data = file.read()
    source = f"token_file {str(path)!r}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8: {exc}") from exc
    return _signature(st), parse_token_file(text, source=source)


class TokenFile:
    """A token file kept current: ``table()`` reloads it when it changed on disk."""

    def __init__(
        self,
        path: Path | str,
        *,
        reload_interval: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Load ``path`` now; ConfigError (naming token_file) if it is unreadable or invalid."""
        self.path = Path(path)
        self._interval = reload_interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        try:
            self._signature, self._table = _load(self.path)
        except OSError as exc:
            raise ConfigError(f"token_file: cannot read {str(self.path)!r}: {exc}") from exc
        self._checked_at = monotonic()

    def table(self) -> TokenTable:
        """The current table (re-read first if the interval passed and the file changed)."""
        with self._lock:
            now = self._monotonic()
            if now - self._checked_at >= self._interval:
                self._checked_at = now
                self._reload_if_changed()
            return self._table

    def reload(self) -> bool:
        """Re-read the file now if it changed; returns whether a new table took effect."""
        with self._lock:
            self._checked_at = self._monotonic()
            return self._reload_if_changed()

    def _reload_if_changed(self) -> bool:
        try:
            if _signature(self.path.stat()) == self._signature:
                return False
            signature, table = _load(self.path)
        except (OSError, ConfigError) as exc:
            log.error("token file not reloaded; the previous one stays in force", error=str(exc))
            return False
        self._signature = signature
        self._table = table
        log.warning(
            "token file reloaded",
            path=str(self.path),
            tokens=len(table.tokens),
            certificates=len(table.certificates),
        )
        return True


def write_token_file(path: Path, table_doc: dict[str, Any]) -> None:
    """Write a token file document atomically (readers never see half a file), mode 0600.

    The temporary file has an unpredictable name in the same directory and is created
    exclusively without following links (``mkstemp``: O_EXCL, O_NOFOLLOW, mode 0600), so a link
    planted in the directory is never written through; ``os.replace`` then swaps the name itself,
    a link at ``path`` included, never what such a link points to.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(table_doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
