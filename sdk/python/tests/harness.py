"""The mesh the tests run against: a real etcd, the control binary and two sidecar
binaries (built by cargo), each on free 127.0.0.1 ports with its own temp dir and log.

Nothing is skipped: when a process cannot start, the fixture fails with its log.
Binaries come from ``AGENT_REACH_BIN_DIR`` (default: the repository's target/debug), etcd
from ``AGENT_REACH_ETCD_BIN`` or ``etcd`` on PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def bin_dir() -> Path:
    return Path(os.environ.get("AGENT_REACH_BIN_DIR") or REPO / "target" / "debug")


def binary(name: str) -> str:
    path = bin_dir() / name
    if not path.exists():
        raise RuntimeError(f"{path} does not exist: build it first (cargo build -p agent-reach-control "
                           f"-p agent-reach-sidecar -p agent-reach-e2e --bins) or set AGENT_REACH_BIN_DIR")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float, proc: Process) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) during start:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001
            last = str(e)
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name}: {url} not ready within {timeout}s ({last}):\n{proc.log_tail()}")


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def spawn(name: str, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> Process:
    log = workdir / f"{name}.log"
    out = open(log, "ab")
    popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})})
    out.close()
    return Process(name, popen, log)


@dataclass
class Sidecar:
    proc: Process
    local: str
    """host:port of the local API (agents register and invoke here)."""
    mesh: str
    admin: str


@dataclass
class Mesh:
    workdir: Path
    etcd: Process
    etcd_endpoint: str
    control: Process
    control_addr: str
    a: Sidecar
    b: Sidecar
    processes: list[Process] = field(default_factory=list)

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()
        if not os.environ.get("AGENT_REACH_KEEP_TMP"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_etcd(workdir: Path) -> tuple[Process, str]:
    etcd = os.environ.get("AGENT_REACH_ETCD_BIN") or shutil.which("etcd")
    if not etcd:
        raise RuntimeError("etcd is required (Debian: apt-get install etcd-server) and is not on PATH")
    errors = []
    for attempt in range(3):
        client, peer = free_port(), free_port()
        data = workdir / f"etcd-data-{attempt}"
        proc = spawn("etcd", [
            etcd, "--name=default", f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--initial-cluster-state=new", "--logger=zap", "--log-level=error",
        ], workdir)
        try:
            wait_http(f"http://127.0.0.1:{client}/health", 20, proc)
            return proc, f"http://127.0.0.1:{client}"
        except RuntimeError as e:
            proc.stop()
            errors.append(str(e))
    raise RuntimeError("etcd did not start:\n" + "\n".join(errors))


def start_control(workdir: Path, etcd: str) -> tuple[Process, str]:
    errors = []
    for _ in range(3):
        port, admin = free_port(), free_port()
        proc = spawn("control", [
            binary("agent-reach-control"), f"--listen=127.0.0.1:{port}", f"--admin-listen=127.0.0.1:{admin}",
            f"--etcd-endpoints={etcd}", "--lease-ttl=10s", "--dashboard-listen=off",
            # These tests are about the SDK, not identity: plaintext and an open Admin API by
            # the binaries' explicit opt-outs (mutual TLS is tested in tests/tests/e2e).
            "--mtls=off", "--insecure-open-admin-api",
        ], workdir, {"RUST_LOG": os.environ.get("RUST_LOG", "info")})
        try:
            wait_http(f"http://127.0.0.1:{admin}/readyz", 30, proc)
            return proc, f"127.0.0.1:{port}"
        except RuntimeError as e:
            proc.stop()
            errors.append(str(e))
    raise RuntimeError("control did not start:\n" + "\n".join(errors))


def start_sidecar(workdir: Path, name: str, control: str, extra: list[str] | None = None) -> Sidecar:
    errors = []
    for _ in range(3):
        local, mesh, admin = free_port(), free_port(), free_port()
        proc = spawn(f"sidecar-{name}", [
            binary("agent-reach-sidecar"), f"--listen=127.0.0.1:{local}", f"--mesh-listen=127.0.0.1:{mesh}",
            f"--admin-listen=127.0.0.1:{admin}", f"--control=http://{control}", f"--sidecar-id=sidecar-{name}",
            "--heartbeat-interval=500ms", "--probe-interval=500ms", "--dead-after=5s", "--control-timeout=2s",
            "--drain-timeout=5s", "--insecure-plaintext-control",
            # Several sidecars share the host; the A2A JSON-RPC port is not used by these tests.
            # One runtime thread, as a sidecar on one core runs (the Rust end-to-end tests
            # run theirs on multi-thread runtimes).
            "--a2a-listen=off", "--worker-threads=1", *(extra or []),
        ], workdir, {"RUST_LOG": os.environ.get("RUST_LOG", "info")})
        try:
            wait_http(f"http://127.0.0.1:{admin}/readyz", 30, proc)
            return Sidecar(proc, f"127.0.0.1:{local}", f"127.0.0.1:{mesh}", f"127.0.0.1:{admin}")
        except RuntimeError as e:
            proc.stop()
            errors.append(str(e))
    raise RuntimeError(f"sidecar {name} did not start:\n" + "\n".join(errors))


def start_mesh() -> Mesh:
    workdir = Path(tempfile.mkdtemp(prefix="agent-reach-pytest-"))
    started: list[Process] = []
    try:
        etcd, etcd_endpoint = start_etcd(workdir)
        started.append(etcd)
        control, control_addr = start_control(workdir, etcd_endpoint)
        started.append(control)
        a = start_sidecar(workdir, "a", control_addr)
        started.append(a.proc)
        b = start_sidecar(workdir, "b", control_addr)
        started.append(b.proc)
    except BaseException:
        for p in reversed(started):
            p.stop()
        print(f"(logs kept in {workdir})")
        raise
    return Mesh(workdir, etcd, etcd_endpoint, control, control_addr, a, b, started)


AGENT_SCRIPT = Path(__file__).with_name("agent_process.py")


@dataclass
class AgentProcess:
    """An agent in a process of its own (see agent_process.py or the Rust test-agent)."""

    popen: subprocess.Popen[str]
    instance_id: str
    log: Path

    def terminate(self) -> None:
        self.popen.terminate()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _start_agent(args: list[str], workdir: Path, name: str, env: dict[str, str] | None = None) -> AgentProcess:
    log = workdir / f"{name}-{time.monotonic_ns()}.log"
    err = open(log, "w")
    popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
                             env={**os.environ, **(env or {})})
    err.close()
    assert popen.stdout is not None
    line = popen.stdout.readline()
    if not line.startswith("READY "):
        popen.kill()
        popen.wait()
        raise RuntimeError(f"{name} did not start: {line!r}\n{log.read_text(errors='replace')}")
    return AgentProcess(popen, line.split()[1].strip(), log)


def start_python_agent(workdir: Path, sidecar: str, *args: str) -> AgentProcess:
    return _start_agent([sys.executable, str(AGENT_SCRIPT), "--sidecar", sidecar, *args], workdir, "py-agent")


def start_rust_agent(workdir: Path, sidecar: str, name: str, capabilities: list[str], *extra: str) -> AgentProcess:
    args = [binary("test-agent"), "--sidecar", sidecar, "--name", name]
    for c in capabilities:
        args += ["--capability", c]
    return _start_agent([*args, *extra], workdir, "rust-agent")
