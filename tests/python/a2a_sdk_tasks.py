"""The official A2A Python SDK (a2a-sdk 1.x), unmodified, working with durable tasks on an
Agent-Reach sidecar's JSON-RPC binding: run by tests/tests/e2e/a2a_durable.rs, one step per
run (the test restarts the sidecar between steps).

    python a2a_sdk_tasks.py BASE_URL submit TEXT       -> {"id", "state"}
    python a2a_sdk_tasks.py BASE_URL get TASK_ID       -> {"state", "artifact_text", "status_text", "history"}
    python a2a_sdk_tasks.py BASE_URL answer TASK_ID TEXT -> {"state"}

BASE_URL is an agent's URL on the sidecar's A2A JSON-RPC port. `submit` sends with the
client's polling mode (return_immediately). With AR_API_TOKEN in the environment every HTTP
request carries it as the ar-api-token header. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import a2a_pb2


def state_name(state: int) -> str:
    return a2a_pb2.TaskState.Name(state)


def texts(parts) -> str:
    return "".join(p.text for p in parts)


async def main(base_url: str, step: str, args: list[str]) -> dict:
    token = os.environ.get("AR_API_TOKEN")
    headers = {"ar-api-token": token} if token else {}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        client = ClientFactory(
            ClientConfig(streaming=False, polling=True, httpx_client=http, supported_protocol_bindings=["JSONRPC"])
        ).create(card)
        try:
            if step == "submit":
                message = new_text_message(args[0], role=a2a_pb2.Role.ROLE_USER)
                answers = [a async for a in client.send_message(a2a_pb2.SendMessageRequest(message=message))]
                task = answers[-1].task
                return {"id": task.id, "state": state_name(task.status.state)}
            if step == "get":
                task = await client.get_task(a2a_pb2.GetTaskRequest(id=args[0]))
                return {
                    "state": state_name(task.status.state),
                    "artifact_text": texts(task.artifacts[0].parts) if task.artifacts else None,
                    "status_text": texts(task.status.message.parts),
                    "history": len(task.history),
                }
            if step == "answer":
                task = await client.get_task(a2a_pb2.GetTaskRequest(id=args[0]))
                message = new_text_message(
                    args[1], context_id=task.context_id, task_id=task.id, role=a2a_pb2.Role.ROLE_USER
                )
                answers = [a async for a in client.send_message(a2a_pb2.SendMessageRequest(message=message))]
                return {"state": state_name(answers[-1].task.status.state)}
            raise SystemExit(f"unknown step {step!r}")
        finally:
            await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))))
