from __future__ import annotations

import asyncio

from agent_reach import Agent, Call, Client, Reply
from conftest import run
from harness import Mesh


def test_python_agent_answers_through_two_sidecars(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"echo-{unique}", version="1.2.0", sidecar=mesh.a.local)

        @agent.capability(f"echo.{unique}", tags=["en"])
        async def echo(call: Call) -> Reply:
            return Reply.text(f"{call.capability}:{call.text()}")

        async with agent, Client(mesh.b.local) as client:
            await wait_routable(client, f"echo.{unique}")
            reply = await client.invoke(f"echo.{unique}", tags=["en"], text="hi", timeout=5)
            assert reply.text() == f"echo.{unique}:hi"
            assert reply.instance == agent.instance_id
            assert reply.agent == f"echo-{unique}"
            assert reply.agent_version == "1.2.0"
            assert reply.attempts == 1

    run(main())


async def wait_routable(client: Client, capability: str, count: int = 1, timeout: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            route = await client.route(capability)
            if len(route.candidates) >= count:
                return
        except Exception:
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{capability} not routable with {count} instance(s) within {timeout}s")
        await asyncio.sleep(0.05)
