"""The examples under sdk/python/examples run against the mesh, so they cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import Mesh

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, mesh: Mesh) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENT_REACH_SIDECAR": mesh.a.local})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_two_agent_chain(mesh: Mesh) -> None:
    assert "Say '你好 谢谢' when you arrive" in run_example("chain.py", mesh)


def test_the_streaming_agent(mesh: Mesh) -> None:
    out = run_example("streaming.py", mesh)
    assert out.splitlines()[:5] == ["1", "2", "3", "4", "5"]
    assert "the caller left after" in out
