"""A mesh capability as a LangChain / LangGraph tool (extra ``agent-reach[langchain]``).

    from agent_reach.langchain import mesh_tool

    translate = mesh_tool("text.translate", description="Translate text to Chinese", tags=["zh"])
    translate.invoke({"text": "hello"})          # sync, e.g. from a LangChain agent
    await translate.ainvoke({"text": "hello"})   # async, e.g. inside a LangGraph node

The tool takes one string argument, ``text``, sends it as the call's payload and returns
the answer's text. Mesh errors (``AgentNotFound``, ``RateLimited``...) propagate as the
SDK's typed exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

from agent_reach._types import Priority
from agent_reach.client import Client
from agent_reach.sync import SyncClient


class TextInput(BaseModel):
    """The tool's input."""

    text: str = Field(description="The text sent to the capability")


def mesh_tool(
    capability: str,
    *,
    description: str,
    name: str | None = None,
    tags: Sequence[str] = (),
    timeout: float | None = 30.0,
    priority: Priority | None = None,
    sidecar: str | None = None,
) -> StructuredTool:
    """A LangChain tool that calls ``capability`` through the local sidecar (or
    ``sidecar``). ``name`` defaults to the capability with dots as underscores."""
    state: dict[str, Client | SyncClient] = {}

    async def acall(text: str) -> str:
        client = state.get("async")
        if not isinstance(client, Client):
            client = state["async"] = Client(sidecar)
        reply = await client.invoke(capability, tags=tags, text=text, timeout=timeout, priority=priority)
        return reply.text()

    def call(text: str) -> str:
        client = state.get("sync")
        if not isinstance(client, SyncClient):
            client = state["sync"] = SyncClient(sidecar)
        return client.invoke(capability, tags=tags, text=text, timeout=timeout, priority=priority).text()

    return StructuredTool.from_function(
        func=call,
        coroutine=acall,
        name=name or capability.replace(".", "_").replace("-", "_"),
        description=description,
        args_schema=TextInput,
    )
