"""Lifecycle: SIGTERM under load loses no call and deregisters; a blocked event loop does
not get the agent removed (heartbeats come from a thread of their own)."""

from __future__ import annotations

import asyncio
import signal
import time

from agent_reach import Agent, Call, Client, HealthState, Response
from agent_reach._proto.agentreach.v1 import common_pb2
from conftest import run
from fake_sidecar import FakeSidecar
from harness import Mesh, start_python_agent
from util import list_instances, wait_route, wait_routable


def test_sigterm_under_load_loses_no_call_and_deregisters(mesh: Mesh, unique: str) -> None:
    name, cap = f"drain-{unique}", f"drain.{unique}"
    args = ("--name", name, "--capability", cap, "--delay", "0.2")
    first = start_python_agent(mesh.workdir, mesh.b.local, *args)
    second = start_python_agent(mesh.workdir, mesh.b.local, *args)

    async def main() -> None:
        async with Client(mesh.a.local) as client:
            await wait_routable(client, cap, count=2)
            results: list[object] = []
            served_by: dict[str, int] = {}
            stop_at = time.monotonic() + 5.0

            async def worker(w: int) -> None:
                i = 0
                while time.monotonic() < stop_at:
                    try:
                        reply = await client.invoke(cap, text=f"{w}-{i}", timeout=15)
                        assert reply.text().endswith(f":{w}-{i}")
                        served_by[reply.instance] = served_by.get(reply.instance, 0) + 1
                        results.append(reply)
                    except Exception as e:  # noqa: BLE001 - collected and reported below
                        results.append(e)
                    i += 1

            workers = [asyncio.create_task(worker(w)) for w in range(16)]
            await asyncio.sleep(1.5)
            first.popen.send_signal(signal.SIGTERM)
            await asyncio.gather(*workers)
            failures = [r for r in results if not isinstance(r, Response)]
            assert not failures, f"{len(failures)} of {len(results)} calls failed: {failures[:3]}"
            assert served_by.get(first.instance_id, 0) > 0 and served_by.get(second.instance_id, 0) > 0
            code = await asyncio.get_running_loop().run_in_executor(None, first.wait, 30)
            assert code == 0, first.log_text()
            assert "HANDLED" in first.log_text()
            # Deregistered: gone from control's registry and from the caller's routing table.
            ids = [i.instance_id for i in await list_instances(mesh.control_addr, name)]
            assert first.instance_id not in ids and second.instance_id in ids, ids
            await wait_route(client, cap, lambda r: [c.instance_id for c in r.candidates] == [second.instance_id]
                             and not r.skipped, 10, "only the second instance")

    try:
        run(main())
    finally:
        first.kill()
        second.terminate()
        second.wait(30)


def test_a_blocked_event_loop_for_10s_does_not_get_the_agent_removed(mesh: Mesh, unique: str) -> None:
    # Sidecar b removes an instance after 5 s without heartbeats or probe answers
    # (--dead-after=5s), so a 10 s stall would remove an agent that heartbeats from its
    # event loop.
    name = f"stuck-{unique}"
    agent = start_python_agent(mesh.workdir, mesh.b.local, "--name", name, "--capability", f"ping.{unique}",
                               "--block-on", f"block.{unique}")

    async def main() -> None:
        async with Client(mesh.a.local) as client:
            await wait_routable(client, f"block.{unique}")
            await wait_routable(client, f"ping.{unique}")
            blocked = asyncio.create_task(client.invoke(f"block.{unique}", text="10", timeout=30))
            started = time.monotonic()
            states = set()
            while not blocked.done():
                instances = await list_instances(mesh.control_addr, name)
                assert [i.instance_id for i in instances] == [agent.instance_id], "the agent was removed"
                states.add(common_pb2.HealthState.Name(instances[0].state))
                await asyncio.sleep(0.5)
            reply = await blocked
            assert reply.text() == "unblocked"
            assert time.monotonic() - started >= 9.5
            assert states <= {"HEALTH_STATE_UP", "HEALTH_STATE_DEGRADED"}, states
            await wait_route(client, f"ping.{unique}",
                             lambda r: [(c.instance_id, c.state) for c in r.candidates] == [(agent.instance_id, "UP")],
                             10, "UP again")
            reply = await client.invoke(f"ping.{unique}", text="after", timeout=5)
            assert reply.instance == agent.instance_id

    try:
        run(main())
    finally:
        agent.terminate()
        agent.wait(30)


def test_heartbeats_go_on_while_the_loop_is_blocked_and_report_degraded() -> None:
    async def main() -> None:
        sidecar = FakeSidecar(heartbeat_interval_ms=100)
        address = await sidecar.start()
        agent = Agent("blocker", sidecar=address, max_concurrency=4)

        @agent.capability("noop")
        async def noop(call: Call) -> str:
            return ""

        async with agent:
            await asyncio.sleep(0.3)
            before = len(sidecar.heartbeats)
            t0 = time.monotonic()
            time.sleep(2.0)  # the event loop is stuck
            during = [h for t, h in sidecar.heartbeats if t0 <= t <= t0 + 2.0]
            assert len(during) >= 10, len(during)
            assert during[-1].state == HealthState.DEGRADED
            assert during[0].load.in_flight == 0 and before > 0
            await asyncio.sleep(0.5)
            assert sidecar.heartbeats[-1][1].state == HealthState.UP
            agent.set_state(HealthState.DEGRADED)
            await asyncio.sleep(0.3)
            assert sidecar.heartbeats[-1][1].state == HealthState.DEGRADED
        # Shutdown: PAUSED, then deregistered.
        assert any(h.state == HealthState.PAUSED for _, h in sidecar.heartbeats)
        assert sidecar.deregistered == [agent.instance_id]
        assert sidecar.registrations[0].registration.max_concurrency == 4
        await sidecar.stop()

    run(main())


def test_an_agent_the_sidecar_lost_registers_again_with_its_id() -> None:
    async def main() -> None:
        sidecar = FakeSidecar(heartbeat_interval_ms=100)
        address = await sidecar.start()
        agent = Agent("phoenix", version="2.0.0", sidecar=address, instance_id="phoenix-0")

        @agent.capability("rise", tags=["x"])
        async def rise(call: Call) -> str:
            return ""

        async with agent:
            assert agent.instance_id == "phoenix-0"
            sidecar.forget = True  # e.g. the sidecar restarted
            for _ in range(50):
                if len(sidecar.registrations) == 2:
                    break
                await asyncio.sleep(0.05)
            again = sidecar.registrations[1]
            assert again.instance_id == "phoenix-0"
            assert again.registration.agent == "phoenix" and again.registration.version == "2.0.0"
            assert [(c.name, list(c.tags)) for c in again.registration.capabilities] == [("rise", ["x"])]
            assert again.registration.endpoint == agent.endpoint
        await sidecar.stop()

    run(main())
