"""``python -m chaos run --scenario NAME|all [--duration S] [--seed N] [--report FILE]``."""

from __future__ import annotations

from pathlib import Path

import click

from chaos.faults import FAULTS
from chaos.harness import TlsFiles
from chaos.report import as_json, table
from chaos.runner import Result, run_naive, run_scenario


@click.group()
def main() -> None:
    """Chaos scenarios against a local coordinator, checked against claim.v1's rules."""


@main.command()
@click.option("--scenario", required=True, type=click.Choice([*FAULTS, "all"]))
@click.option("--duration", type=click.FloatRange(min=1), default=10.0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--target",
    default="",
    metavar="ADDR",
    help="A deployed coordinator: client-side scenarios only, on a queue of their own "
    "(plaintext gRPC unless --ca).",
)
@click.option("--token", default="", envvar="CHAOS_TOKEN", help="Bearer token for --target.")
@click.option(
    "--ca",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TLS to --target: the PEM CA that signed its certificate.",
)
@click.option(
    "--cert",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Mutual TLS: a PEM client certificate (with --key and --ca).",
)
@click.option("--key", type=click.Path(exists=True, dir_okay=False), default=None)
def run(
    scenario: str,
    duration: float,
    seed: int,
    report: Path | None,
    target: str,
    token: str,
    ca: str | None,
    cert: str | None,
    key: str | None,
) -> None:
    """Run one scenario (or all); exit 1 on any violation by the coordinator.

    worker-pause also runs against the naive baseline (chaos/naive.py), side by side: that
    row must FAIL (the checker catches the late overwrite); exit 1 if it does not."""
    if (cert is None) != (key is None) or (cert is not None and ca is None):
        raise click.UsageError("--cert and --key go together, and need --ca")
    if ca is not None and not target:
        raise click.UsageError("--ca is for --target (the local harness is plaintext)")
    tls = TlsFiles(ca, cert or "", key or "") if ca is not None else None
    names = list(FAULTS) if scenario == "all" else [scenario]
    results: list[Result] = []
    for name in names:
        done = len(results)
        results.append(
            run_scenario(name, duration=duration, seed=seed, target=target, token=token, tls=tls)
        )
        if name == "worker-pause":
            results.append(run_naive())
        if len(names) > 1:  # progress while "all" runs; one scenario's rows are the summary
            click.echo(table(results[done:]), err=True)
    click.echo(table(results))
    if report is not None:
        report.write_text(as_json(results))
    raise SystemExit(exit_code(results))


def exit_code(results: list[Result]) -> int:
    """1 if the coordinator broke a rule, the cluster was unhealthy around a fault, or the
    checker missed the naive baseline's."""
    for r in results:
        if r.unhealthy:
            return 1
        if r.verdict is None:
            continue
        if r.implementation == "naive" and r.verdict.ok:
            return 1
        if r.implementation != "naive" and not r.verdict.ok:
            return 1
    return 0


if __name__ == "__main__":
    main()
