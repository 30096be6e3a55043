"""A missing browser skips the browser tests on a developer machine (with the reason) and fails
them in CI, and scripts/install-browser.sh exits non-zero in CI when it cannot install one: CI
can never pass with the console's browser tests quietly skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.console import browser

ROOT = Path(__file__).resolve().parents[2]
REASON = "headless chromium is not installed"


@pytest.mark.parametrize("ci", [None, "", "0", "false", "no"])
def test_a_developer_run_without_a_browser_skips_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=REASON):
        browser.binaries()


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_a_ci_run_without_a_browser_fails(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match=f"{REASON}.*CI is set"):
        browser.binaries()


def _install_without_a_browser(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    """Run the install script where neither chromium nor apt-get can be found."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    id_path = shutil.which("id")
    assert id_path is not None
    (bindir / "id").symlink_to(id_path)
    env = {"PATH": str(bindir), "CI": ci, "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "install-browser.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_install_script_exits_non_zero_in_ci_without_a_browser(tmp_path: Path) -> None:
    result = _install_without_a_browser(tmp_path, "true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "chromium chromium-driver not installed and CI is set" in result.stderr


def test_the_install_script_lets_a_developer_run_skip(tmp_path: Path) -> None:
    result = _install_without_a_browser(tmp_path, "")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "chromium chromium-driver not installed: the console's browser tests will be SKIPPED"
        in (result.stdout)
    )
