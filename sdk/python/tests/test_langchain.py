"""The LangChain adapter (agent-reach[langchain]): a mesh capability as a tool, called
through langchain-core's tool interface, sync and async, with no model involved."""

from __future__ import annotations

import asyncio
import threading

import pytest
from langchain_core.tools import BaseTool

from agent_reach import Agent, AgentNotFound, Call, Client, Reply
from agent_reach.langchain import mesh_tool
from conftest import run
from harness import Mesh
from util import wait_routable


def test_a_capability_is_a_langchain_tool(mesh: Mesh, unique: str) -> None:
    ready = threading.Event()
    done = threading.Event()

    async def serve_agent() -> None:
        agent = Agent(f"shout-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"text.shout{unique}", tags=["en"])
        async def shout(call: Call) -> Reply:
            return Reply.text(call.text().upper() + "!")

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"text.shout{unique}")
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)

    # The agent runs on a loop of its own, as it would in its own process.
    thread = threading.Thread(target=lambda: asyncio.run(serve_agent()))
    thread.start()
    try:
        assert ready.wait(20)
        tool = mesh_tool(f"text.shout{unique}", description="Shouts the text back", tags=["en"],
                         sidecar=mesh.a.local)
        assert isinstance(tool, BaseTool)
        assert tool.name == f"text_shout{unique}"
        assert tool.description == "Shouts the text back"
        assert list(tool.args) == ["text"]
        assert tool.invoke({"text": "hello"}) == "HELLO!"
        assert run(tool.ainvoke({"text": "async"})) == "ASYNC!"
        missing = mesh_tool(f"text.shoot{unique}", description="typo", sidecar=mesh.a.local)
        with pytest.raises(AgentNotFound) as caught:
            missing.invoke({"text": "x"})
        assert f"text.shout{unique}" in caught.value.suggestions
    finally:
        done.set()
        thread.join(30)
