"""The official A2A Python SDK (a2a-sdk 1.x), unmodified, as a client of an agent that is
itself an a2a-sdk server (tests/python/a2a_sdk_agent.py) registered as transport A2A, reached
through an Agent-Reach sidecar: run by tests/tests/e2e/a2a_transport.rs, one step per run.

    python a2a_sdk_transport.py BASE_URL BINDING scenario      -> what the scenario saw
    python a2a_sdk_transport.py BASE_URL BINDING submit TEXT N -> {"ids": [...], "states": [...]}
    python a2a_sdk_transport.py BASE_URL BINDING get TASK_ID   -> the task, summarised

BASE_URL is the agent's URL on the sidecar's A2A JSON-RPC port; BINDING (JSONRPC or GRPC)
the interface of its card the client uses. `scenario` streams a message, sends one
non-blocking (the client's polling mode) that works slowly, gets it, subscribes to it and
cancels it while subscribed, gets the streamed task again, lists the tasks and sends one
blocking. Prints one JSON object.
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


def texts(parts) -> str:
    return "".join(p.text for p in parts)


def summary(task: a2a_pb2.Task) -> dict:
    artifact = task.artifacts[0] if task.artifacts else None
    metadata = json_format.MessageToDict(task.metadata) if task.HasField("metadata") else {}
    return {
        "id": task.id,
        "state": state_name(task.status.state),
        "status_text": texts(task.status.message.parts),
        "artifact_text": texts(artifact.parts) if artifact else None,
        "served_by": json_format.MessageToDict(artifact.metadata).get("served_by") if artifact else None,
        "reason": metadata.get("reason"),
    }


def event_summary(event: a2a_pb2.StreamResponse) -> dict:
    kind = event.WhichOneof("payload")
    if kind == "task":
        return {"kind": "task", "id": event.task.id, "state": state_name(event.task.status.state)}
    if kind == "status_update":
        u = event.status_update
        return {"kind": "status", "id": u.task_id, "state": state_name(u.status.state)}
    if kind == "artifact_update":
        u = event.artifact_update
        return {"kind": "artifact", "id": u.task_id, "text": texts(u.artifact.parts)}
    return {"kind": kind}


def client_of(http: httpx.AsyncClient, card, binding: str, streaming: bool, polling: bool):
    return ClientFactory(
        ClientConfig(
            streaming=streaming,
            polling=polling,
            httpx_client=http,
            grpc_channel_factory=lambda url: grpc.aio.insecure_channel(url),
            supported_protocol_bindings=[binding],
        )
    ).create(card)


async def submit(client, text: str) -> a2a_pb2.Task:
    message = new_text_message(text, role=a2a_pb2.Role.ROLE_USER)
    answers = [a async for a in client.send_message(a2a_pb2.SendMessageRequest(message=message))]
    return answers[-1].task


async def scenario(http, card, binding: str) -> dict:
    out: dict = {}
    streaming = client_of(http, card, binding, streaming=True, polling=False)
    polling = client_of(http, card, binding, streaming=False, polling=True)
    blocking = client_of(http, card, binding, streaming=False, polling=False)
    try:
        message = new_text_message("hello stream", role=a2a_pb2.Role.ROLE_USER)
        events = [e async for e in streaming.send_message(a2a_pb2.SendMessageRequest(message=message))]
        out["stream"] = [event_summary(e) for e in events]
        streamed_id = events[0].task.id

        slow = await submit(polling, "slow")
        out["submitted"] = {"id": slow.id, "state": state_name(slow.status.state)}
        out["get_slow"] = summary(await polling.get_task(a2a_pb2.GetTaskRequest(id=slow.id)))

        seen: list = []
        first = asyncio.Event()

        async def follow() -> None:
            async for event in streaming.subscribe(a2a_pb2.SubscribeToTaskRequest(id=slow.id)):
                seen.append(event_summary(event))
                first.set()

        follower = asyncio.create_task(follow())
        await asyncio.wait_for(first.wait(), 20)
        canceled = await polling.cancel_task(a2a_pb2.CancelTaskRequest(id=slow.id))
        out["cancel"] = summary(canceled)
        await asyncio.wait_for(follower, 20)
        out["subscribed"] = seen
        out["get_canceled"] = summary(await polling.get_task(a2a_pb2.GetTaskRequest(id=slow.id)))

        out["get_streamed"] = summary(await polling.get_task(a2a_pb2.GetTaskRequest(id=streamed_id)))
        listed = await polling.list_tasks(a2a_pb2.ListTasksRequest())
        out["list"] = {"total": listed.total_size, "ids": sorted(t.id for t in listed.tasks)}
        out["blocking"] = summary(await submit(blocking, "second"))
    finally:
        for c in (streaming, polling, blocking):
            await c.close()
    return out


async def main(base_url: str, binding: str, step: str, args: list[str]) -> dict:
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        if step == "scenario":
            return await scenario(http, card, binding)
        client = client_of(http, card, binding, streaming=False, polling=True)
        try:
            if step == "submit":
                tasks = [await submit(client, args[0]) for _ in range(int(args[1]))]
                return {"ids": [t.id for t in tasks], "states": [state_name(t.status.state) for t in tasks]}
            if step == "get":
                return summary(await client.get_task(a2a_pb2.GetTaskRequest(id=args[0])))
            raise SystemExit(f"unknown step {step!r}")
        finally:
            await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))))
