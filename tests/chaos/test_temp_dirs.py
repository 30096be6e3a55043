"""A chaos run's temporary directory (its etcd data, logs and histories: 367 MB for the naive
baseline's etcd) is removed when the run ends, and kept, with its path said, only when the
coordinator's run failed or raised: a staging loop over seeds once filled /tmp."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import CheckReport
from chaos.runner import Result, in_temp_dir
from chaos.violation import Rule, Violation

PASSED = CheckReport(operations=1, commits=1, fenced={}, reconciled=0, indefinite=0, violations=())
FAILED = CheckReport(
    operations=1,
    commits=2,
    fenced={},
    reconciled=0,
    indefinite=0,
    violations=(Violation(Rule.DOUBLE_COMMIT, "t1", ("a", "b"), "committed twice"),),
)


def _run(implementation: str, verdict: CheckReport | None, seen: list[Path]) -> Result:
    def run(root: Path) -> Result:
        (root / "etcd.data").write_bytes(b"x" * 1024)
        seen.append(root)
        return Result("worker-pause", implementation, verdict)

    return in_temp_dir("chaos-test-", run)


@pytest.mark.parametrize(
    ("implementation", "verdict"),
    [("coordinator", PASSED), ("coordinator", None), ("naive", FAILED)],  # naive must fail
)
def test_a_run_that_did_not_fail_leaves_nothing_behind(
    implementation: str, verdict: CheckReport | None
) -> None:
    seen: list[Path] = []
    _run(implementation, verdict, seen)
    assert not seen[0].exists()


def test_a_failed_or_raising_run_keeps_its_directory_and_says_where(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[Path] = []
    _run("coordinator", FAILED, seen)
    with pytest.raises(RuntimeError):

        def broken(root: Path) -> Result:
            seen.append(root)
            raise RuntimeError("the harness broke")

        in_temp_dir("chaos-test-", broken)
    try:
        assert all(path.is_dir() for path in seen)
        said = capsys.readouterr().err
        assert [
            f"chaos: kept {p} (the run's data and logs) for inspection" in said for p in seen
        ] == [
            True,
            True,
        ]
    finally:
        for path in seen:
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
