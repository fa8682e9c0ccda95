"""The official A2A Python SDK (a2a-sdk 1.x), unmodified, as a client of an Agent-Reach
sidecar: run by tests/tests/e2e/a2a.rs.

    python a2a_sdk_client.py BASE_URL BINDING

BASE_URL is an agent's URL on the sidecar's A2A JSON-RPC port
(http://127.0.0.1:PORT/agents/NAME); the agent card is resolved from
BASE_URL/.well-known/agent-card.json. BINDING is JSONRPC or GRPC: the interface of the card
the client uses. The script sends one message streaming and one blocking, gets the task,
lists tasks and asks for the extended card, then prints what it saw as one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import a2a_pb2
from google.protobuf import json_format


def state_name(state: int) -> str:
    return a2a_pb2.TaskState.Name(state)


def event_summary(event: a2a_pb2.StreamResponse) -> dict:
    kind = event.WhichOneof("payload")
    if kind == "task":
        return {"kind": "task", "state": state_name(event.task.status.state)}
    if kind == "status_update":
        return {"kind": "status", "state": state_name(event.status_update.status.state)}
    if kind == "artifact_update":
        parts = event.artifact_update.artifact.parts
        return {"kind": "artifact", "text": parts[0].text if parts else None}
    return {"kind": kind}


async def main(base_url: str, binding: str) -> dict:
    out: dict = {}
    async with httpx.AsyncClient(timeout=30) as http:
        factory = ClientFactory(
            ClientConfig(
                streaming=True,
                httpx_client=http,
                grpc_channel_factory=lambda url: grpc.aio.insecure_channel(url),
                supported_protocol_bindings=[binding],
            )
        )
        card = await A2ACardResolver(http, base_url).get_agent_card()
        client = factory.create(card)
        out["card"] = json_format.MessageToDict(card)

        # Streaming: the task, then its updates.
        message = new_text_message("hello mesh", context_id="ctx-a2a-1", role=a2a_pb2.Role.ROLE_USER)
        events = [e async for e in client.send_message(a2a_pb2.SendMessageRequest(message=message))]
        out["stream"] = [event_summary(e) for e in events]
        task_id = next(e.task.id for e in events if e.WhichOneof("payload") == "task")

        task = await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        out["get_task"] = {
            "state": state_name(task.status.state),
            "context_id": task.context_id,
            "artifact_text": task.artifacts[0].parts[0].text if task.artifacts else None,
            "history": len(task.history),
        }

        # Blocking, without streaming.
        blocking = ClientFactory(
            ClientConfig(
                streaming=False,
                httpx_client=http,
                grpc_channel_factory=lambda url: grpc.aio.insecure_channel(url),
                supported_protocol_bindings=[binding],
            )
        ).create(card)
        answers = [e async for e in blocking.send_message(
            a2a_pb2.SendMessageRequest(message=new_text_message("second", role=a2a_pb2.Role.ROLE_USER))
        )]
        out["blocking"] = [
            {"state": state_name(a.task.status.state), "text": a.task.artifacts[0].parts[0].text} for a in answers
        ]

        listed = await client.list_tasks(a2a_pb2.ListTasksRequest(include_artifacts=True))
        out["list_total"] = listed.total_size

        try:
            await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id))
            out["cancel_done"] = "accepted"
        except Exception as e:  # the SDK's typed error for TASK_NOT_CANCELABLE
            out["cancel_done"] = type(e).__name__

        extended = await client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
        out["extended_name"] = extended.name
        await client.close()
        await blocking.close()
    return out


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1], sys.argv[2]))
    print(json.dumps(result))
