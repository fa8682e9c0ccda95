"""An agent written with the official A2A Python SDK's server (a2a-sdk 1.x, gRPC binding),
unmodified: run by tests/tests/e2e/a2a_transport.rs, which registers it with a sidecar as
transport A2A.

    python a2a_sdk_agent.py NAME [LABEL]

Serves lf.a2a.v1.A2AService on 127.0.0.1 (a free port, printed as the first stdout line)
until killed. Each message's text comes back upper-cased as the artifact "upper" of a
completed task, with metadata served_by=LABEL (default NAME); a text "fail" makes the task
fail; a text "slow" works (status message "working at LABEL") for up to 60 s, until
canceled, then completes.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2, a2a_pb2_grpc


class Upper(AgentExecutor):
    def __init__(self, label: str) -> None:
        self.label = label

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        working = new_text_message(f"working at {self.label}", task_id=task.id, context_id=task.context_id)
        await updater.start_work(message=working)
        text = context.get_user_input()
        if text == "slow":
            await asyncio.sleep(60)
        if text == "fail":
            await updater.failed(new_text_message("asked to fail", task_id=task.id, context_id=task.context_id))
            return
        await updater.add_artifact([new_text_part(text.upper())], name="upper", metadata={"served_by": self.label})
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.cancel()


async def main(name: str, label: str) -> None:
    card = a2a_pb2.AgentCard(
        name=name,
        description="upper-cases text",
        version="1.0.0",
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[a2a_pb2.AgentSkill(id="text.upper", name="upper", description="upper-cases text", tags=["en"])],
    )
    card.capabilities.streaming = True
    handler = DefaultRequestHandler(agent_executor=Upper(label), task_store=InMemoryTaskStore(), agent_card=card)
    server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]))
