"""A two-agent chain: "planner" answers `plan.trip` by calling `text.translate` on
"translator" through the mesh. The nested call inherits the handler's deadline and trace.

Run a mesh first (`cargo run -p agent-reach-cli -- up`: control and a sidecar on
127.0.0.1:7700), then:

    python examples/chain.py            # both agents, then one call through the chain
"""

import asyncio

from agent_reach import Agent, AgentNotFound, Call, Client, Reply

translator = Agent("translator", version="1.0.0", max_concurrency=8)
planner = Agent("planner", version="1.0.0")

GREETINGS = {"hello": "你好", "thanks": "谢谢"}


@translator.capability("text.translate", tags=["zh"])
async def translate(call: Call) -> Reply:
    return Reply.text(" ".join(GREETINGS.get(w, w) for w in call.text().split()))


@planner.capability("plan.trip")
async def plan(call: Call) -> Reply:
    # A nested call: no timeout given, so it gets what is left of this call's deadline.
    phrase = await call.client.invoke("text.translate", tags=["zh"], text=call.text())
    return Reply.text(f"Say {phrase.text()!r} when you arrive (translated by {phrase.instance})")


async def routable(mesh: Client, capability: str) -> bool:
    """Whether the sidecar has an instance for `capability` yet (not known yet: False)."""
    try:
        return bool((await mesh.route(capability)).candidates)
    except AgentNotFound:
        return False


async def main() -> None:
    async with translator, planner, Client.local() as mesh:
        for _ in range(100):  # wait until the sidecar routes to both
            if await routable(mesh, "plan.trip") and await routable(mesh, "text.translate"):
                break
            await asyncio.sleep(0.05)
        reply = await mesh.invoke("plan.trip", text="hello thanks", timeout=5)
        print(reply.text())


if __name__ == "__main__":
    asyncio.run(main())
