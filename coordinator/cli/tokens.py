"""``coordinator token``: issue and revoke bearer tokens in a token file (JSON, hashes only).

``token new`` prints a fresh random token once (give it to the worker, e.g. as a Kubernetes
Secret it reads into ``COORDINATOR_TOKEN``) and stores only its sha256 in the file; ``token
revoke`` removes a principal's tokens; ``token cert`` grants roles to a client-certificate
principal (mutual TLS). A running coordinator picks the changed file up without a restart.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from coordinator.domain.roles import Role, check_principal
from coordinator.errors import CoordinatorError
from coordinator.server.tokens import parse_token_file, token_hash, write_token_file

_ROLE = click.Choice([r.value for r in Role])
_FILE = click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="COORDINATOR_TOKEN_FILE",
    show_envvar=True,
    required=True,
    help="The token file to edit (created if missing).",
)


def _principal(ctx: click.Context, param: click.Parameter, value: str) -> str:
    del ctx, param
    try:
        return check_principal("--principal", value)
    except CoordinatorError as exc:
        raise click.BadParameter(str(exc)) from exc


_PRINCIPAL = click.option(
    "--principal",
    required=True,
    callback=_principal,
    help="Who (the name the server's logs, events and role checks use).",
)
_ROLES = click.option(
    "--role", "roles", type=_ROLE, multiple=True, required=True, help="Repeat for several."
)


def _load(path: Path) -> dict[str, Any]:
    """The file's document (validated), or an empty one if the file does not exist yet."""
    if not path.exists():
        return {"tokens": {}, "certificates": {}}
    text = path.read_text(encoding="utf-8")
    try:
        parse_token_file(text, source=str(path))
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    doc: dict[str, Any] = json.loads(text)
    doc.setdefault("tokens", {})
    doc.setdefault("certificates", {})
    return doc


@click.group()
def token() -> None:
    """Issue and revoke bearer tokens in a token file."""


@token.command()
@_PRINCIPAL
@_ROLES
@_FILE
@click.option(
    "--expires-in",
    type=click.IntRange(min=1),
    default=None,
    metavar="DAYS",
    help="The token stops working after this many days (default: never).",
)
@click.option("--note", default="", help="A remark stored with the entry (who, why).")
def new(
    principal: str, roles: tuple[str, ...], path: Path, expires_in: int | None, note: str
) -> None:
    """Create a token for --principal with the --role(s) given; prints the token (only this
    once: the file keeps its hash)."""
    doc = _load(path)
    secret = secrets.token_urlsafe(32)
    entry: dict[str, Any] = {"principal": principal, "roles": sorted(set(roles))}
    if expires_in is not None:
        expires = datetime.now(UTC) + timedelta(days=expires_in)
        entry["expires_at"] = expires.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    if note:
        entry["note"] = note
    doc["tokens"][token_hash(secret)] = entry
    write_token_file(path, doc)
    click.echo(secret)


@token.command()
@_PRINCIPAL
@_FILE
def revoke(principal: str, path: Path) -> None:
    """Remove every token of --principal (and its certificate entry)."""
    doc = _load(path)
    before = len(doc["tokens"])
    doc["tokens"] = {h: e for h, e in doc["tokens"].items() if e.get("principal") != principal}
    removed = before - len(doc["tokens"])
    cert = doc["certificates"].pop(principal, None) is not None
    if not removed and not cert:
        raise click.ClickException(f"{principal!r} has no token or certificate entry in {path}")
    write_token_file(path, doc)
    click.echo(f"revoked {removed} token(s)" + (" and the certificate entry" if cert else ""))


@token.command()
@_PRINCIPAL
@_ROLES
@_FILE
def cert(principal: str, roles: tuple[str, ...], path: Path) -> None:
    """Grant roles to the client-certificate principal --principal (its URI or DNS SAN; its
    CN only if it has no SAN)."""
    doc = _load(path)
    doc["certificates"][principal] = {"roles": sorted(set(roles))}
    write_token_file(path, doc)
    click.echo(f"certificate principal {principal} may act as {', '.join(sorted(set(roles)))}")
