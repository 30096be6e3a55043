"""``coordinator doctor``: report every disagreement in a keyspace; repair only the unambiguous.

Reads the whole prefix at one etcd revision and runs the pure checks of coordinator.doctor.
Findings that depend on time (an expired claim not reclaimed, a dependent not released) are
confirmed by a second snapshot one reclaim window later. ``--repair`` applies each offered
repair as one CAS txn (skipped if any key it relies on changed) and prints it; it never touches
an ambiguous finding. Exit code 0: consistent (or everything found was repaired); 1: not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import click

from coordinator.cli.local_up import discover
from coordinator.cli.options import etcd_security_options
from coordinator.config import DEFAULT_ETCD, DEFAULT_PREFIX
from coordinator.config_values import parse_endpoints
from coordinator.doctor import LAGGING, Finding, Repair, Snapshot, check, confirm
from coordinator.doctor.findings import Problem
from coordinator.domain.keys import Keyspace
from coordinator.domain.retention import DEFAULT_RETENTION, parse_setting_duration
from coordinator.errors import ConfigError, CoordinatorError, StoreUnavailable
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.ops import delete, mod_revision_is, put

_PAGE = 1000


def read_snapshot(kv: EtcdKV, keys: Keyspace) -> Snapshot:
    """Every key under the prefix, paged, all read at the first page's revision."""
    root = keys.prefix + "/"
    start, end, revision = root, kv.prefix_end(root), 0
    found = {}
    while True:
        page, revision = kv.range_page(start, end, limit=_PAGE, revision=revision)
        found.update({item.key: item for item in page})
        if len(page) < _PAGE:
            return Snapshot(revision, found)
        start = page[-1].key + "\0"


def diagnose(
    kv: EtcdKV,
    keys: Keyspace,
    *,
    reclaim_window: float,
    retention: float = DEFAULT_RETENTION,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[Finding], int]:
    """The findings (lagging ones confirmed a window later) and the first snapshot's revision."""
    snap = read_snapshot(kv, keys)
    findings = check(snap, keys, retention=retention)
    if reclaim_window > 0 and any(f.problem in LAGGING for f in findings):
        sleep(reclaim_window)
        findings = confirm(findings, check(read_snapshot(kv, keys), keys, retention=retention))
    return findings, snap.revision


def apply_repair(kv: EtcdKV, repair: Repair) -> bool:
    """One repair as one txn; False if a key it relies on changed since the snapshot."""
    compares = [mod_revision_is(g.key, g.mod_revision) for g in repair.guards]
    ops = [put(w.key, w.value) if w.value is not None else delete(w.key) for w in repair.writes]
    return kv.txn(compares, ops).succeeded


@click.command()
@click.option(
    "--etcd",
    envvar="COORDINATOR_ETCD",
    show_envvar=True,
    default=None,
    metavar="HOST:PORT[,HOST:PORT...]",
    help="etcd client endpoints [default: the running `coordinator up`'s etcd, else "
    f"{','.join(DEFAULT_ETCD)}].",
)
@click.option(
    "--prefix",
    envvar="COORDINATOR_PREFIX",
    show_envvar=True,
    default=DEFAULT_PREFIX,
    show_default=True,
    help="etcd key prefix of the keyspace to check.",
)
@click.option("--repair", is_flag=True, help="Apply the unambiguous fixes (each is printed).")
@click.option(
    "--repair-pruned",
    is_flag=True,
    help="Also delete the records a half-done prune left of tasks that were archived and "
    "pruned (records-of-pruned-task; their tombstone names the archive).",
)
@click.option(
    "--retention",
    default="7d",
    show_default=True,
    metavar="DURATION",
    help="With --repair: a terminal task missing from the prune index is scheduled this long "
    "after it finished (use the replicas' retention).",
)
@click.option(
    "--reclaim-window",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="An expired claim or a due release counts only if still pending this much later.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@etcd_security_options
def doctor(
    etcd: str | None,
    prefix: str,
    repair: bool,
    repair_pruned: bool,
    retention: str,
    reclaim_window: float,
    as_json: bool,
    etcd_ca_cert: str | None,
    etcd_cert: str | None,
    etcd_key: str | None,
    etcd_user: str | None,
    etcd_password: str | None,
) -> None:
    """Check a keyspace: task records vs their indexes (ready, delayed, deadline, ...), claim
    keys, results, events and edges."""
    keys = Keyspace(prefix)
    etcd, guessed = _etcd_endpoints(etcd)
    try:
        retention_s = parse_setting_duration("retention", retention)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'--retention'") from exc
    kv = _connected(
        keys,
        etcd,
        guessed,
        ca_cert=etcd_ca_cert,
        cert_cert=etcd_cert,
        cert_key=etcd_key,
        user=etcd_user,
        password=etcd_password,
    )
    try:
        findings, revision = diagnose(
            kv, keys, reclaim_window=reclaim_window, retention=retention_s
        )
        held = _held_for_a_person(findings)
        repaired = {
            id(f): apply_repair(kv, f.repair)
            for f in findings
            if f.repair is not None
            and (repair_pruned if _deletes_data(f) else repair)
            and f not in held
        }
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        kv.close()
    remaining = [f for f in findings if not repaired.get(id(f), False)]
    if as_json:
        click.echo(json.dumps(_as_json(prefix, revision, findings, repaired, remaining)))
    else:
        _print(prefix, revision, findings, repaired, (repair, repair_pruned), held)
    raise SystemExit(1 if remaining else 0)


def _connected(
    keys: Keyspace,
    etcd: str,
    guessed: str,
    *,
    ca_cert: str | None,
    cert_cert: str | None,
    cert_key: str | None,
    user: str | None,
    password: str | None,
) -> EtcdKV:
    """A connection to ``etcd`` that has read the keyspace's version record. A refused
    credential fails here, not in the middle; a prefix no coordinator ever served (a typo) has
    no version record: "consistent" about it would mislead."""
    try:
        kv = EtcdKV.connect(
            list(parse_endpoints(etcd)),
            ca_cert=ca_cert,
            cert_cert=cert_cert,
            cert_key=cert_key,
            user=user,
            password=password,
        )
        found = kv.get(keys.versions)
    except StoreUnavailable as exc:
        raise click.ClickException(f"{exc}{guessed}") from exc
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    if found is None:
        kv.close()
        raise click.ClickException(
            f"no coordinator has served prefix {keys.prefix!r} on {etcd} (it has no "
            f"{keys.versions} record): is --prefix right?"
        )
    return kv


def _etcd_endpoints(etcd: str | None) -> tuple[str, str]:
    """The endpoints to check (--etcd, else the running ``coordinator up``'s etcd, else the
    default) and, when guessed, a note saying why they were tried, for a failed connection."""
    if etcd is not None:
        return etcd, ""
    local = discover(flag="--etcd (or COORDINATOR_ETCD)")
    if local is not None:
        return local.etcd, ""
    tried = ",".join(DEFAULT_ETCD)
    return tried, (
        f" (no --etcd given and no `coordinator up` running, so {tried} was tried: "
        "start `coordinator up`, or give --etcd HOST:PORT)"
    )


def _held_for_a_person(findings: list[Finding]) -> list[Finding]:
    """Repairs left undone because their task has a finding that needs a person: scheduling
    its prune would let the pruner archive and delete it before anyone looked (a DONE task
    whose result is gone was archived without it, and the next run called the keyspace
    consistent)."""
    waiting = {f.task_id for f in findings if f.repair is None and f.task_id}
    return [
        f for f in findings if f.problem is Problem.TERMINAL_NOT_SCHEDULED and f.task_id in waiting
    ]


def _deletes_data(finding: Finding) -> bool:
    """Repairs that delete records (of archived tasks) need their own flag."""
    return finding.problem is Problem.PRUNE_LEFTOVER


def _print(
    prefix: str,
    revision: int,
    findings: list[Finding],
    repaired: dict[int, bool],
    repairing: tuple[bool, bool],
    held: list[Finding],
) -> None:
    for finding in findings:
        click.echo(f"{finding.problem.value}: {finding.message}")
        deletes = _deletes_data(finding)
        if finding.repair is None:
            click.echo("  not repaired: ambiguous, needs a person")
        elif finding in held:
            click.echo(
                f"  not repaired: task {finding.task_id} has a finding that needs a person "
                "first (its prune would archive it as it is)"
            )
        elif not repairing[1 if deletes else 0]:
            flag = "--repair-pruned" if deletes else "--repair"
            click.echo(f"  repairable ({flag}): {finding.repair.action}")
        elif repaired.get(id(finding)):
            click.echo(f"  repaired: {finding.repair.action}")
        else:
            click.echo(f"  not repaired (changed since the snapshot): {finding.repair.action}")
    if not findings:
        click.echo(f"doctor: keyspace {prefix} is consistent at revision {revision}")
    else:
        fixable = sum(f.repair is not None for f in findings)
        click.echo(
            f"doctor: {len(findings)} disagreement(s) in {prefix} at revision {revision} "
            f"({fixable} with an unambiguous repair, {sum(repaired.values())} repaired)"
        )


def _as_json(
    prefix: str,
    revision: int,
    findings: list[Finding],
    repaired: dict[int, bool],
    remaining: list[Finding],
) -> dict[str, object]:
    return {
        "prefix": prefix,
        "revision": revision,
        "consistent": not remaining,
        "findings": [
            {
                "problem": f.problem.value,
                "task_id": f.task_id,
                "message": f.message,
                "keys": list(f.keys),
                "repair": f.repair.action if f.repair is not None else None,
                "repaired": repaired.get(id(f), False),
            }
            for f in findings
        ],
    }
