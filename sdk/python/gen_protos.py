#!/usr/bin/env python3
"""Generates the Python stubs shipped in ``agent_reach._proto`` from the repository's
``proto/`` directory, with grpcio-tools.

    python gen_protos.py          # (re)writes src/agent_reach/_proto/agentreach/v1/*
    python gen_protos.py --check  # exits 1 when the shipped stubs are stale against proto/

The generated modules import each other as ``agentreach.v1.X_pb2``; this script rewrites
those imports to ``agent_reach._proto.agentreach.v1.X_pb2`` so the stubs live inside the
package and clash with nothing else on ``sys.path``.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
OUT = HERE / "src" / "agent_reach" / "_proto"
PACKAGE = "agent_reach._proto"


def generate(into: Path) -> None:
    """Runs protoc (from grpcio-tools) over every ``proto/agentreach/v1/*.proto``."""
    from grpc_tools import protoc  # imported here so --help works without grpcio-tools
    import grpc_tools

    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "agentreach" / "v1").glob("*.proto"))
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={into}",
        f"--pyi_out={into}",
        f"--grpc_python_out={into}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for d in (into / "agentreach", into / "agentreach" / "v1"):
        (d / "__init__.py").write_text("")
    (into / "__init__.py").write_text('"""Stubs generated from proto/ by gen_protos.py; do not edit."""\n')
    pattern = re.compile(r"^from agentreach\.v1 import", re.MULTILINE)
    for f in (into / "agentreach" / "v1").iterdir():
        if f.suffix in (".py", ".pyi"):
            text = pattern.sub(f"from {PACKAGE}.agentreach.v1 import", f.read_text())
            f.write_text(text)


def tree(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail when the shipped stubs differ from proto/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_proto"
        fresh.mkdir()
        generate(fresh)
        if args.check:
            want, have = tree(fresh), tree(OUT) if OUT.exists() else {}
            stale = sorted(
                name
                for name in set(want) | set(have)
                if name not in want or name not in have or not filecmp.cmp(want[name], have[name], shallow=False)
            )
            if stale:
                print("stale generated stubs (run sdk/python/gen_protos.py):", *stale, sep="\n  ", file=sys.stderr)
                return 1
            print(f"generated stubs are up to date with {PROTO_ROOT}")
            return 0
        if OUT.exists():
            shutil.rmtree(OUT)
        shutil.copytree(fresh, OUT)
        print(f"wrote {len(tree(OUT))} files to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
