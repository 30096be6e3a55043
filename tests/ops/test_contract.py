"""The wire contract's guard (``make contract``): buf lint passes with the exceptions buf.yaml
lists, buf breaking passes against the stored image (protos/contract.binpb) and catches a
renumbered field or a renamed message in a copy of protos/, and the stored image is the
contract as it stands (accepted with ``make contract-accept``).

Skipped when buf is missing (scripts/install-buf.sh installs it into .tools/bin; ``make test``
does, through ``make contract``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "protos" / "contract.binpb"
BUF = ROOT / ".tools" / "bin" / "buf"

pytestmark = pytest.mark.skipif(
    not BUF.exists(), reason="buf not installed: run scripts/install-buf.sh (make contract does)"
)


def _buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _copy_of_the_contract(tmp_path: Path) -> Path:
    """A copy of buf.yaml and protos/ to edit (never the checked-in files)."""
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    return tmp_path


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    edited, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    assert count == 1, f"{pattern!r} not found in {path}"
    path.write_text(edited)


def test_the_protos_pass_lint_with_only_the_listed_exceptions() -> None:
    done = _buf("lint")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_protos_break_nothing_against_the_stored_contract() -> None:
    done = _buf("breaking", "--against", str(IMAGE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_stored_contract_is_the_protos_as_they_stand(tmp_path: Path) -> None:
    # An addition the breaking check lets through must still be accepted on purpose, or a
    # later removal of it would go unseen (the image would not know the field).
    built = tmp_path / "now.binpb"
    done = _buf("build", "--exclude-source-info", "-o", str(built))
    assert done.returncode == 0, done.stderr
    assert built.read_bytes() == IMAGE.read_bytes(), "run `make contract-accept`"


def test_a_renumbered_field_is_caught(tmp_path: Path) -> None:
    copy = _copy_of_the_contract(tmp_path)
    _edit(copy / "protos/coordinator/v1/types.proto", r"(string task_id = )1;", r"\g<1>99;")
    done = _buf("breaking", "--against", str(IMAGE), cwd=copy)
    assert done.returncode != 0
    assert "task_id" in done.stdout, done.stdout


def test_a_renamed_message_is_caught(tmp_path: Path) -> None:
    copy = _copy_of_the_contract(tmp_path)
    worker = copy / "protos/coordinator/v1/worker.proto"
    worker.write_text(worker.read_text().replace("ClaimResponse", "ClaimAnswer"))
    done = _buf("breaking", "--against", str(IMAGE), cwd=copy)
    assert done.returncode != 0
    assert "ClaimResponse" in done.stdout, done.stdout


def test_an_unlisted_lint_finding_fails(tmp_path: Path) -> None:
    # The exceptions are scoped to the files that have them: a new file obeys every rule.
    copy = _copy_of_the_contract(tmp_path)
    (copy / "protos/coordinator/v1/extra.proto").write_text(
        'syntax = "proto3";\npackage coordinator.v1;\nmessage extra_thing { string A = 1; }\n'
    )
    done = _buf("lint", cwd=copy)
    assert done.returncode != 0
    assert "extra_thing" in done.stdout, done.stdout
