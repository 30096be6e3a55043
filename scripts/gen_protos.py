"""Regenerate the Python code for protos/coordinator/v1/*.proto into coordinator/v1/.

Run: python scripts/gen_protos.py           (writes coordinator/v1/)
     python scripts/gen_protos.py --out DIR (writes DIR/coordinator/v1/; the freshness test)

The versions of grpcio-tools and mypy-protobuf are pinned in pyproject.toml's dev extra, so the
output is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[Path]:
    """The .proto files of the wire contract, in a stable order."""
    return sorted((PROTO_ROOT / "coordinator" / "v1").glob("*.proto"))


def generate(out: Path) -> None:
    """Run protoc (bundled with grpcio-tools) with the python, grpc and mypy plugins."""
    package_dir = out / "coordinator" / "v1"
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / "__init__.py").write_text('"""Generated wire contract (do not edit)."""\n')
    include = str(Path(protoc.__file__).parent / "_proto")
    # protoc finds its mypy plugins (protoc-gen-mypy*) on PATH: use this interpreter's.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: the repo)")
    ns = parser.parse_args(argv)
    generate(ns.out)


if __name__ == "__main__":
    main(sys.argv[1:])
