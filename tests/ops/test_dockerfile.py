"""The Dockerfile cannot be built here (no Docker engine); check what can go wrong silently:
the entrypoint is the installed `coordinator serve` and its default flags exist, the image is
multi-stage, its final stage installs nothing and runs as a numeric non-root user."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import click

from coordinator.cli import main
from coordinator.cli.serve import serve

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for parts in (line.split(None, 1) for line in lines if line and not line.startswith("#"))
    ]


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions(DOCKERFILE):
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_the_entrypoint_is_coordinator_serve_and_its_flags_exist() -> None:
    final = dict(_stages()[-1])
    entrypoint, cmd = json.loads(final["ENTRYPOINT"]), json.loads(final["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["coordinator", "serve"]
    assert scripts["coordinator"] == "coordinator.cli:main"
    assert main.get_command(click.Context(main), "serve") is serve
    flags = {opt for param in serve.params for opt in param.opts}
    used = [arg for arg in cmd if arg.startswith("-")]
    assert used and set(used) <= flags, used


def test_multi_stage_slim_and_non_root() -> None:
    stages = _stages()
    assert len(stages) == 2
    final = stages[-1]
    kinds = [kind for kind, _ in final]
    # The final stage copies the built virtualenv and installs nothing itself.
    assert all("--from=build" in args for kind, args in final if kind == "COPY")
    runs = " ".join(args for kind, args in final if kind == "RUN")
    assert not re.search(r"apt-get|pip |gcc|build-essential", runs), runs
    user = dict(final)["USER"]
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user), "numeric, non-root uid:gid"
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    assert "slim" in DOCKERFILE.split("ARG PYTHON_IMAGE=", 1)[1].split()[0]
    exposed = dict(final)["EXPOSE"].split()
    assert exposed == ["50051", "9090"]
