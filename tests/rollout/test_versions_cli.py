"""``coordinator versions show|set-minimum`` against a running coordinator."""

from __future__ import annotations

from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.domain.versions import SCHEMA_VERSION
from coordinator.etcd_process import EtcdProcess
from coordinator.store.control.versions import VersionStore
from tests.sdk.support import served


def _cli(target: str, *args: str) -> Result:
    env = {"COORDINATOR_TARGET": target}
    return CliRunner().invoke(main, [*args, "--insecure"], env=env, terminal_width=200)


def _said(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if not line.startswith("20")]


def test_versions_show_and_set_minimum(etcd: EtcdProcess, prefix: str) -> None:
    with served(etcd.endpoint, prefix) as coord:
        epoch = coord.store.admin.epoch()
        raised = _cli(coord.target, "versions", "set-minimum", "--sdk", "0.1.0")
        assert raised.exit_code == 0, raised.output
        assert _said(raised)[-1] == f"epoch bumped to {epoch + 1}"
        assert VersionStore(coord.store.ctx).read().min_sdk_version == "0.1.0"
        shown = _cli(coord.target, "versions", "show")
        assert shown.exit_code == 0, shown.output
        assert "min_sdk_version 0.1.0" in _said(shown)
        assert "min_coordinator_version 0" in _said(shown)
        lowered = _cli(coord.target, "versions", "set-minimum", "--sdk", "0.0.9")
        assert lowered.exit_code != 0
        assert "below the current minimum 0.1.0" in lowered.output
        assert coord.store.admin.epoch() == epoch + 1
        # A deploy job setting the same minimums again fences no claim: nothing is written.
        again = _cli(coord.target, "versions", "set-minimum", "--sdk", "0.1.0")
        assert again.exit_code == 0, again.output
        said = "unchanged: the minimums were already so; the epoch stays"
        assert _said(again)[-1] == f"{said} {epoch + 1}"
        assert coord.store.admin.epoch() == epoch + 1
        nothing = _cli(coord.target, "versions", "set-minimum")
        assert nothing.exit_code == 2


def test_set_minimum_raises_the_schema_never_past_what_the_coordinator_knows(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as coord:
        epoch = coord.store.admin.epoch()
        beyond = _cli(coord.target, "versions", "set-minimum", "--schema", str(SCHEMA_VERSION + 1))
        assert beyond.exit_code != 0
        assert (
            f"this coordinator knows keyspace schemas up to {SCHEMA_VERSION}, not "
            f"{SCHEMA_VERSION + 1}; raise it through a coordinator that knows it" in beyond.output
        )
        lowered = _cli(coord.target, "versions", "set-minimum", "--schema", "1")
        assert lowered.exit_code != 0
        assert f"the keyspace is at schema {SCHEMA_VERSION}; a schema is never lowered" in (
            lowered.output
        )
        assert coord.store.admin.epoch() == epoch  # neither wrote anything
        zero = _cli(coord.target, "versions", "set-minimum", "--schema", "0")
        assert zero.exit_code == 2  # not a schema: refused before any call
        same = _cli(coord.target, "versions", "set-minimum", "--schema", str(SCHEMA_VERSION))
        assert same.exit_code == 0, same.output
        assert f"schema_version {SCHEMA_VERSION}" in _said(same)
        # The keyspace is at that schema already: nothing written, no claim fenced.
        unchanged = "unchanged: the minimums were already so; the epoch stays"
        assert _said(same)[-1] == f"{unchanged} {epoch}"
