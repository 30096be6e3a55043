"""The repository's docs and docstrings stand alone: they name no design file or folder that a
clone does not have, so a reader is never sent to look for one."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (
    "coordinator",
    "docs",
    "helm",
    "protos",
    "bench",
    "chaos",
    "conformance",
    "scripts",
    "tests",
)
FILES = ("README.md", "DEVELOPERS.md", "Makefile", "Dockerfile", "pyproject.toml")
SUFFIXES = frozenset({".py", ".md", ".proto", ".txt", ".yaml", ".yml", ".toml", ".tpl", ".sh"})
# Written without the name itself, so this file does not match.
ABSENT = ("DESIGN" + ".md", "shared" + "/DESIGN")


def _texts() -> list[Path]:
    found = [ROOT / name for name in FILES if (ROOT / name).exists()]
    for folder in FOLDERS:
        found += [p for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return found


def test_no_file_cites_a_design_document_the_clone_lacks() -> None:
    assert not (ROOT / ABSENT[0]).exists()  # if one is ever added, this test goes
    texts = _texts()
    assert len(texts) > 100  # the walk found the tree
    citing = sorted(
        str(path.relative_to(ROOT))
        for path in texts
        if any(name in path.read_text(errors="replace") for name in ABSENT)
    )
    assert citing == []
