"""Agent-Reach for Python: agents and callers of the Agent-Reach mesh.

An agent in a few lines::

    from agent_reach import Agent, Call, Reply

    agent = Agent("summarizer", version="1.2.0", max_concurrency=8)

    @agent.capability("text.summarize", tags=["en", "zh"])
    async def summarize(call: Call) -> Reply:
        return Reply.text(call.text()[:200])

    agent.run()

A caller::

    from agent_reach import Client, Priority

    async with Client.local() as mesh:
        reply = await mesh.invoke("text.summarize", text="...", priority=Priority.HIGH, timeout=3)

Errors are :class:`MeshError` subclasses (see :mod:`agent_reach.errors`). The generated
protobuf and gRPC stubs of the whole API are in ``agent_reach._proto.agentreach.v1``.
"""

from agent_reach._types import HealthState, Priority, Reply
from agent_reach.agent import Agent, AgentStartError, Call
from agent_reach.client import Candidate, Chunk, ChunkStream, Client, Response, Route, Skipped
from agent_reach.errors import (
    AgentCredentialInvalid,
    AgentNotFound,
    AgentOverloaded,
    CircuitOpen,
    Conflict,
    ContextConflict,
    ContextFieldLocked,
    ContextHistoryCompacted,
    ContextPolicyOverride,
    ContextWriterMismatch,
    ContextWriterNotAllowed,
    ContextTooLarge,
    ContextTooManySessions,
    ControlUnavailable,
    DeadlineExceeded,
    HandlerError,
    IdempotencyKeyReused,
    IdempotentReplyNotStored,
    InstanceNotFound,
    InstanceUnreachable,
    Internal,
    InvalidArgument,
    LeaseNotFound,
    MeshError,
    NoHealthyInstance,
    NotAuthorized,
    PayloadTooLarge,
    PermissionDenied,
    PolicyNotFound,
    RateLimited,
    ShuttingDown,
    SidecarUnreachable,
    StoreUnavailable,
)
from agent_reach.session import FieldWrite, Session, SessionChange, SessionField, SessionSnapshot, WritePolicy
from agent_reach.sync import SyncClient
from agent_reach.tasks import Submitted, TaskHandle, TaskState, TaskView

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentCredentialInvalid",
    "AgentNotFound",
    "AgentOverloaded",
    "AgentStartError",
    "Call",
    "Candidate",
    "Chunk",
    "ChunkStream",
    "CircuitOpen",
    "Client",
    "Conflict",
    "ContextConflict",
    "ContextFieldLocked",
    "ContextHistoryCompacted",
    "ContextPolicyOverride",
    "ContextWriterMismatch",
    "ContextWriterNotAllowed",
    "ContextTooLarge",
    "ContextTooManySessions",
    "ControlUnavailable",
    "FieldWrite",
    "DeadlineExceeded",
    "HandlerError",
    "HealthState",
    "IdempotencyKeyReused",
    "IdempotentReplyNotStored",
    "InstanceNotFound",
    "InstanceUnreachable",
    "Internal",
    "InvalidArgument",
    "LeaseNotFound",
    "MeshError",
    "NoHealthyInstance",
    "NotAuthorized",
    "PayloadTooLarge",
    "PermissionDenied",
    "PolicyNotFound",
    "Priority",
    "RateLimited",
    "Reply",
    "Response",
    "Route",
    "Session",
    "SessionChange",
    "SessionField",
    "SessionSnapshot",
    "ShuttingDown",
    "SidecarUnreachable",
    "Skipped",
    "StoreUnavailable",
    "Submitted",
    "SyncClient",
    "TaskHandle",
    "TaskState",
    "TaskView",
    "WritePolicy",
    "__version__",
]
