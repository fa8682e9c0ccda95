#!/usr/bin/env python3
"""The Python SDK's overhead per call: one agent process serving through the SDK
(`agent_reach.Agent`) against a bare `grpc.aio` servicer of `agentreach.v1.Agent` doing the
same work (upper-casing the payload), each in a process of its own.

    python bench/python_agent_overhead.py                  # direct calls to each process
    python bench/python_agent_overhead.py --mesh           # also through etcd + control + 2 sidecars
    python bench/python_agent_overhead.py --calls 20000 --concurrency 32

Needs `agent_reach` importable (`pip install sdk/python`, or PYTHONPATH=sdk/python/src);
--mesh also needs the cargo-built binaries (target/debug, or AGENT_REACH_BIN_DIR) and etcd.
Prints, for each server, calls/s and the server process's CPU per call (user + system from
/proc), and the SDK's CPU per call as a multiple of the bare servicer's (target: <= 1.2).
The load generator is one Python process, so calls/s is bounded by it as well; CPU per
call is the server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from agent_reach._proto.agentreach.v1 import agent_pb2, common_pb2, sidecar_pb2

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


def work(payload: bytes) -> bytes:
    return payload.upper()


# -- the two servers (child processes) ---------------------------------------------------

async def serve_bare() -> None:
    async def handle(request: agent_pb2.HandleRequest, context: grpc.aio.ServicerContext) -> agent_pb2.HandleReply:
        return agent_pb2.HandleReply(payload=work(request.payload), content_type=request.content_type)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("agentreach.v1.Agent", {
        "Handle": grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=agent_pb2.HandleRequest.FromString,
            response_serializer=agent_pb2.HandleReply.SerializeToString),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY http://127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def serve_sdk(sidecar: str, name: str) -> None:
    from agent_reach import Agent, Call, Reply

    agent = Agent(name, sidecar=sidecar, version="1.0.0")

    @agent.capability(name)
    async def handle(call: Call) -> Reply:
        return Reply(work(call.payload), call.content_type)

    await agent.start()
    print(f"READY {agent.endpoint} {agent.instance_id}", flush=True)
    await asyncio.Event().wait()


# -- a stand-in sidecar for the direct runs ------------------------------------------------

def fake_sidecar() -> tuple[grpc.Server, str]:
    def register(r: sidecar_pb2.RegisterRequest, c: object) -> sidecar_pb2.RegisterReply:
        return sidecar_pb2.RegisterReply(instance_id="bench-1", heartbeat_interval_ms=2000, tenant="default")

    def heartbeat(r: sidecar_pb2.HeartbeatRequest, c: object) -> sidecar_pb2.HeartbeatReply:
        return sidecar_pb2.HeartbeatReply()

    server = grpc.server(ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("agentreach.v1.Sidecar", {
        "Register": grpc.unary_unary_rpc_method_handler(register, sidecar_pb2.RegisterRequest.FromString,
                                                        sidecar_pb2.RegisterReply.SerializeToString),
        "Heartbeat": grpc.unary_unary_rpc_method_handler(heartbeat, sidecar_pb2.HeartbeatRequest.FromString,
                                                         sidecar_pb2.HeartbeatReply.SerializeToString),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def spawn(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise SystemExit(f"server {args} did not start")
    return proc, line[1:]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# -- load --------------------------------------------------------------------------------

async def load(address: str, method: str, request: bytes, calls: int, concurrency: int) -> float:
    """Makes `calls` calls, `concurrency` at a time; returns the wall time."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        await call(request, timeout=10)
        remaining = calls

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await call(request, timeout=10)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def measure_once(pid: int, address: str, method: str, request: bytes, args: argparse.Namespace) -> tuple[float, float]:
    """(calls/s, server CPU microseconds per call) of one measurement."""
    before = cpu_seconds(pid)
    wall = asyncio.run(load(address, method, request, args.calls, args.concurrency))
    cpu = cpu_seconds(pid) - before
    return args.calls / wall, cpu / args.calls * 1e6


def compare(servers: list[tuple[str, int, str, bytes]], method: str, args: argparse.Namespace) -> list[float]:
    """Measures each server `--reps` times, alternating so that other load on the machine
    hits both alike; prints medians and returns the median CPU per call of each."""
    for _, pid, address, request in servers:
        asyncio.run(load(address, method, request, min(500, args.calls), args.concurrency))  # warm up
    samples: list[list[tuple[float, float]]] = [[] for _ in servers]
    for _ in range(args.reps):
        for i, (_, pid, address, request) in enumerate(servers):
            samples[i].append(measure_once(pid, address, method, request, args))
    out = []
    for (label, *_), runs in zip(servers, samples):
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        spread = ", ".join(f"{c:.0f}" for _, c in runs)
        print(f"  {label:<26} {rate:>8.0f} calls/s   {cpu:>7.1f} us CPU/call (server process; runs: {spread})")
        out.append(cpu)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--payload", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3, help="alternating measurements of each server; medians are reported")
    p.add_argument("--mesh", action="store_true", help="also measure through etcd, control and two sidecars")
    p.add_argument("--serve", choices=["bare", "sdk"], help=argparse.SUPPRESS)
    p.add_argument("--sidecar", help=argparse.SUPPRESS)
    p.add_argument("--name", default="bench.echo", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "bare":
        asyncio.run(serve_bare())
        return
    if args.serve == "sdk":
        asyncio.run(serve_sdk(args.sidecar, args.name))
        return

    payload = b"x" * args.payload
    handle = agent_pb2.HandleRequest(payload=payload, content_type="text/plain", capability="bench.echo",
                                     instance_id="bench-1", attempt=1).SerializeToString()
    print(f"{args.calls} calls, {args.concurrency} at a time, {args.payload} B payload")
    print("direct (load generator -> agent process):")
    sidecar, sidecar_addr = fake_sidecar()
    bare, (bare_ep,) = spawn("--serve", "bare")
    try:
        sdk, (sdk_ep, _) = spawn("--serve", "sdk", "--sidecar", sidecar_addr)
    except BaseException:
        bare.kill()
        raise
    try:
        b, s = compare([
            ("bare grpc.aio servicer", bare.pid, bare_ep.removeprefix("http://"), handle),
            ("agent_reach.Agent", sdk.pid, sdk_ep.removeprefix("http://"), handle),
        ], "/agentreach.v1.Agent/Handle", args)
        print(f"  SDK CPU per call = {s / b:.2f} x the bare servicer's (target <= 1.2)")
    finally:
        sdk.kill()
        bare.kill()
        sidecar.stop(None)
    if args.mesh:
        run_mesh(args, payload)


def run_mesh(args: argparse.Namespace, payload: bytes) -> None:
    sys.path.insert(0, str(HERE.parent / "sdk" / "python" / "tests"))
    from harness import start_mesh

    print("through the mesh (load generator -> sidecar a -> sidecar b -> agent process):")
    mesh = start_mesh()
    bare = sdk = None
    stop = threading.Event()
    try:
        sdk, _ = spawn("--serve", "sdk", "--sidecar", mesh.b.local, "--name", "bench.sdk")
        bare, (bare_ep,) = spawn("--serve", "bare")
        # The bare servicer has no SDK: the bench registers it and heartbeats for it.
        with grpc.insecure_channel(mesh.b.local) as channel:
            register = channel.unary_unary("/agentreach.v1.Sidecar/Register",
                                           request_serializer=sidecar_pb2.RegisterRequest.SerializeToString,
                                           response_deserializer=sidecar_pb2.RegisterReply.FromString)
            reply = register(sidecar_pb2.RegisterRequest(registration=common_pb2.AgentRegistration(
                agent="bench-bare", version="1.0.0", endpoint=bare_ep,
                capabilities=[common_pb2.Capability(name="bench.bare")])), timeout=10)

        def beat() -> None:
            with grpc.insecure_channel(mesh.b.local) as ch:
                hb = ch.unary_unary("/agentreach.v1.Sidecar/Heartbeat",
                                    request_serializer=sidecar_pb2.HeartbeatRequest.SerializeToString,
                                    response_deserializer=sidecar_pb2.HeartbeatReply.FromString)
                while not stop.wait(0.4):
                    hb(sidecar_pb2.HeartbeatRequest(instance_id=reply.instance_id, state=common_pb2.HEALTH_STATE_UP))

        threading.Thread(target=beat, daemon=True).start()
        time.sleep(3)  # both reach sidecar a's table
        def invoke(capability: str) -> bytes:
            return sidecar_pb2.InvokeRequest(target=common_pb2.Target(capability=capability), payload=payload,
                                             content_type="text/plain").SerializeToString()

        assert bare is not None and sdk is not None
        compare([
            ("bare grpc.aio servicer", bare.pid, mesh.a.local, invoke("bench.bare")),
            ("agent_reach.Agent", sdk.pid, mesh.a.local, invoke("bench.sdk")),
        ], "/agentreach.v1.Sidecar/Invoke", args)
    finally:
        stop.set()
        for proc in (sdk, bare):
            if proc is not None:
                proc.kill()
        mesh.stop()


if __name__ == "__main__":
    main()
