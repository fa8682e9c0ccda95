"""max_concurrency is honoured: 100 concurrent calls, never more than 8 handlers at once."""

from __future__ import annotations

import asyncio

from agent_reach import Agent, AgentOverloaded, Call, Client, Priority, Reply, Response
from conftest import run
from harness import Mesh
from agent_reach._proto.agentreach.v1 import policy_pb2
from util import put_capability_policy, wait_routable


def test_max_concurrency_8_under_100_concurrent_calls(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"pool-{unique}", sidecar=mesh.b.local, max_concurrency=8)
        running = 0
        peak = 0

        @agent.capability(f"pool.{unique}")
        async def work(call: Call) -> Reply:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await asyncio.sleep(0.1)
            finally:
                running -= 1
            return Reply.text(call.text())

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"pool.{unique}")
            # Let the mesh queue every call (default: 64 waiting, 100 ms each) so that what
            # is tested is the concurrency, not the shedding.
            await put_capability_policy(mesh.control_addr, f"pool-{unique}", policy_pb2.PolicySpec(
                admission=policy_pb2.Admission(queue_length=200, queue_timeout_ms=20_000)),
                kind=policy_pb2.POLICY_KIND_AGENT)
            await asyncio.sleep(1.0)
            results = await asyncio.gather(*(
                client.invoke(f"pool.{unique}", text=str(i), timeout=30, priority=Priority.HIGH)
                for i in range(100)
            ), return_exceptions=True)
            answered = [r for r in results if isinstance(r, Response)]
            shed = [r for r in results if isinstance(r, AgentOverloaded)]
            others = [r for r in results if not isinstance(r, (Response, AgentOverloaded))]
            assert not others, others[:3]
            assert sorted(int(r.text()) for r in answered) == sorted(
                i for i, r in enumerate(results) if isinstance(r, Response))
            assert len(answered) == 100, f"{len(answered)} served, {len(shed)} shed"
            assert peak <= 8, f"{peak} handlers ran at once"
            assert peak == 8, f"the pool was never full ({peak})"
            assert agent.peak_in_flight <= 8

    run(main())


def test_the_sdk_queues_beyond_max_concurrency_and_reports_it_as_load(unique: str) -> None:
    """Without the mesh's admission in front (calls straight to the agent's port), the
    SDK itself holds calls beyond max_concurrency in its queue."""
    import grpc

    from agent_reach._proto.agentreach.v1 import agent_pb2

    async def main() -> None:
        # A stand-in sidecar that accepts the registration and heartbeats.
        from fake_sidecar import FakeSidecar

        sidecar = FakeSidecar()
        address = await sidecar.start()
        agent = Agent(f"direct-{unique}", sidecar=address, max_concurrency=2)
        running = 0
        peak = 0

        @agent.capability("work")
        async def work(call: Call) -> str:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.1)
            running -= 1
            return "ok"

        async with agent:
            async with grpc.aio.insecure_channel(agent.endpoint.removeprefix("http://")) as channel:
                handle = channel.unary_unary(
                    "/agentreach.v1.Agent/Handle",
                    request_serializer=agent_pb2.HandleRequest.SerializeToString,
                    response_deserializer=agent_pb2.HandleReply.FromString,
                )
                calls = [asyncio.ensure_future(handle(agent_pb2.HandleRequest(capability="work"), timeout=10))
                         for _ in range(10)]
                await asyncio.sleep(0.05)
                load = agent._stats.load(agent.max_concurrency)
                assert (load.in_flight, load.queue_length) == (2, 8)
                assert load.load_ratio == 5.0
                replies = await asyncio.gather(*calls)
                assert all(r.payload == b"ok" for r in replies)
                assert peak == 2
        await sidecar.stop()

    run(main())
