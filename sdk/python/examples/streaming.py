"""A streaming agent: `text.count` streams one chunk per number, as an async generator.
The caller reads chunks as they come; leaving the loop early cancels the handler.

    python examples/streaming.py        # needs a sidecar on 127.0.0.1:7700 (see chain.py)
"""

import asyncio

from agent_reach import Agent, AgentNotFound, Call, Client, Reply

agent = Agent("counter", version="1.0.0")


@agent.capability("text.count")
async def count(call: Call):  # type: ignore[no-untyped-def]
    n = int(call.text() or "10")
    try:
        for i in range(1, n + 1):
            yield Reply.text(str(i))
            await asyncio.sleep(0.1)
    except (asyncio.CancelledError, GeneratorExit):
        print(f"(the caller left after {i} chunks; cleaning up)")
        raise


async def routable(mesh: Client, capability: str) -> bool:
    """Whether the sidecar has an instance for `capability` yet (not known yet: False)."""
    try:
        return bool((await mesh.route(capability)).candidates)
    except AgentNotFound:
        return False


async def main() -> None:
    async with agent, Client.local() as mesh:
        while not await routable(mesh, "text.count"):
            await asyncio.sleep(0.05)
        async for chunk in mesh.invoke_stream("text.count", text="100", timeout=30):
            print(chunk.text())
            if chunk.text() == "5":
                break  # cancels the call; the handler sees it
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(main())
