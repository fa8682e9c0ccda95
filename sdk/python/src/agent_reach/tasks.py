"""Durable tasks from Python: submit work the mesh keeps (in etcd) until it is done, then
read it, follow its updates, wait for its end, answer its questions or cancel it::

    async with Client.local() as mesh:
        task = await mesh.submit("report.build", text="Q3", session="s-42")
        async for update in task.updates():          # every change, until the end
            print(update.state.name, update.status_text)
        done = await task.wait(timeout=600)
        print(done.state, done.result_text())

        asking = await mesh.task(task_id).get()      # any sidecar of the tenant answers
        if asking.state is TaskState.INPUT_REQUIRED:
            await mesh.task(task_id).answer(text="yes")

A task goes to an agent like a call (admission, priorities, policies, retries), with the
task id as its idempotency key; the agent's reply becomes the artifact ``result``.
Failures raise :class:`agent_reach.errors.MeshError` with the mesh's reason
(``TASK_NOT_FOUND``, ``TASK_FINISHED``, ``TASK_BAD_TRANSITION``...) in ``reason``.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import grpc

from agent_reach._proto.agentreach.v1 import common_pb2, task_pb2
from agent_reach._types import TEXT, Priority
from agent_reach.errors import InvalidArgument, from_rpc_error

_SUBMIT = "/agentreach.v1.Sidecar/SubmitTask"
_GET = "/agentreach.v1.Sidecar/GetTask"
_CANCEL = "/agentreach.v1.Sidecar/CancelTask"
_SUBSCRIBE = "/agentreach.v1.Sidecar/SubscribeTask"
_ANSWER = "/agentreach.v1.Sidecar/AnswerTask"

RESULT_ARTIFACT = "result"
"""The name of the artifact holding the agent's reply."""


class TaskState(enum.IntEnum):
    """A task's state (the numbers and meanings of A2A's task states)."""

    UNSPECIFIED = task_pb2.TASK_STATE_UNSPECIFIED
    SUBMITTED = task_pb2.TASK_STATE_SUBMITTED
    WORKING = task_pb2.TASK_STATE_WORKING
    COMPLETED = task_pb2.TASK_STATE_COMPLETED
    FAILED = task_pb2.TASK_STATE_FAILED
    CANCELED = task_pb2.TASK_STATE_CANCELED
    INPUT_REQUIRED = task_pb2.TASK_STATE_INPUT_REQUIRED
    REJECTED = task_pb2.TASK_STATE_REJECTED
    AUTH_REQUIRED = task_pb2.TASK_STATE_AUTH_REQUIRED

    @property
    def final(self) -> bool:
        """Whether the task has ended (it changes no more)."""
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED)


@dataclass(frozen=True)
class TaskView:
    """One version of a task as read."""

    raw: task_pb2.Task

    @property
    def id(self) -> str:
        return self.raw.id

    @property
    def state(self) -> TaskState:
        return TaskState(self.raw.status.state)

    @property
    def version(self) -> int:
        """Grows with every change; resume :meth:`TaskHandle.updates` after it."""
        return self.raw.version

    @property
    def reason(self) -> str:
        """Why the task failed or was refused (an ErrorInfo reason), else empty."""
        return self.raw.status.reason

    @property
    def status_text(self) -> str:
        """The text of the status message (a question, progress), else empty."""
        return "".join(p.data.decode("utf-8", "replace") for p in self.raw.status.message.parts)

    @property
    def states(self) -> list[TaskState]:
        """Every state the task went through, in order."""
        return [TaskState(s.state) for s in self.raw.history]

    def result(self) -> bytes | None:
        """The agent's reply (the ``result`` artifact), when the task has one."""
        for artifact in self.raw.artifacts:
            if artifact.name == RESULT_ARTIFACT and artifact.parts:
                return artifact.parts[0].data
        return None

    def result_text(self) -> str | None:
        """The reply as UTF-8 text, when the task has one."""
        result = self.result()
        return None if result is None else result.decode("utf-8", "replace")


@dataclass(frozen=True)
class Submitted:
    """The answer to :meth:`Tasks.submit`."""

    handle: TaskHandle
    task: TaskView
    created: bool
    """False when a task with the given id existed: this is that task."""
    push_secret: bytes
    """The HMAC key of the task's push notifications (only when created with a push URL)."""

    @property
    def id(self) -> str:
        return self.handle.id


def _part(payload: bytes | None, text: str | None, content_type: str) -> task_pb2.TaskPart:
    if (payload is None) == (text is None):
        raise InvalidArgument("give exactly one of text= and payload=", code=grpc.StatusCode.INVALID_ARGUMENT)
    if text is not None:
        return task_pb2.TaskPart(data=text.encode(), content_type=content_type or TEXT)
    return task_pb2.TaskPart(data=payload or b"", content_type=content_type)


class Tasks:
    """The task methods of a sidecar's local API on ``channel`` (see :meth:`Client.submit`)."""

    def __init__(self, channel: grpc.aio.Channel, caller: common_pb2.Caller | None = None) -> None:
        self._caller = caller
        self._submit = channel.unary_unary(
            _SUBMIT,
            request_serializer=task_pb2.SubmitTaskRequest.SerializeToString,
            response_deserializer=task_pb2.SubmitTaskReply.FromString,
        )
        self._get = channel.unary_unary(
            _GET,
            request_serializer=task_pb2.GetTaskRequest.SerializeToString,
            response_deserializer=task_pb2.Task.FromString,
        )
        self._cancel = channel.unary_unary(
            _CANCEL,
            request_serializer=task_pb2.CancelTaskRequest.SerializeToString,
            response_deserializer=task_pb2.Task.FromString,
        )
        self._subscribe = channel.unary_stream(
            _SUBSCRIBE,
            request_serializer=task_pb2.SubscribeTaskRequest.SerializeToString,
            response_deserializer=task_pb2.TaskEvent.FromString,
        )
        self._answer = channel.unary_unary(
            _ANSWER,
            request_serializer=task_pb2.AnswerTaskRequest.SerializeToString,
            response_deserializer=task_pb2.Task.FromString,
        )

    async def submit(
        self,
        capability: str | None = None,
        *,
        agent: str | None = None,
        tags: list[str] | None = None,
        text: str | None = None,
        payload: bytes | None = None,
        content_type: str = "",
        task_id: str = "",
        session: str = "",
        priority: Priority = Priority.NORMAL,
        metadata: Mapping[str, str] | None = None,
        run_once: bool = False,
        push_url: str | None = None,
    ) -> Submitted:
        """Stores a task for ``capability`` (or ``agent``) and returns at once; the mesh
        dispatches it. ``task_id`` (optional, yours) makes the submit idempotent."""
        if (capability is None) == (agent is None):
            raise InvalidArgument("give exactly one of capability and agent=", code=grpc.StatusCode.INVALID_ARGUMENT)
        target = common_pb2.Target(tags=tags or [])
        if capability is not None:
            target.capability = capability
        else:
            target.agent = agent or ""
        request = task_pb2.SubmitTaskRequest(
            target=target,
            message=task_pb2.TaskMessage(parts=[_part(payload, text, content_type)]),
            session_id=session,
            priority=int(priority),  # type: ignore[arg-type]
            metadata=dict(metadata or {}),
            task_id=task_id,
            run_once=run_once,
        )
        if self._caller is not None:
            request.caller.CopyFrom(self._caller)
        if push_url:
            request.push.url = push_url
        try:
            reply = await self._submit(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return Submitted(TaskHandle(self, reply.task.id), TaskView(reply.task), reply.created, reply.push_secret)

    def task(self, task_id: str) -> TaskHandle:
        """The task ``task_id`` of the tenant (submitted by anyone, through any sidecar)."""
        return TaskHandle(self, task_id)


class TaskHandle:
    """One task: read it, follow it, wait for it, answer it, cancel it."""

    def __init__(self, tasks: Tasks, task_id: str) -> None:
        self._tasks = tasks
        self.id = task_id

    async def get(self) -> TaskView:
        """The task now."""
        try:
            return TaskView(await self._tasks._get(task_pb2.GetTaskRequest(task_id=self.id)))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def updates(self, after_version: int = 0) -> AsyncIterator[TaskView]:
        """The task at every change after ``after_version`` (0: the current task first),
        until it ends. The sidecar resumes its watch across control restarts, so no change
        is skipped; after a break of this stream, resume with the last ``version`` seen."""
        call = self._tasks._subscribe(task_pb2.SubscribeTaskRequest(task_id=self.id, after_version=after_version))
        try:
            async for event in call:
                yield TaskView(event.task)
                if event.final:
                    return
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    async def wait(self, timeout: float | None = None) -> TaskView:
        """The task once it has ended (``asyncio.TimeoutError`` after ``timeout`` seconds)."""

        async def last() -> TaskView:
            end: TaskView | None = None
            async for view in self.updates():
                end = view
                if view.state.final:
                    break
            return end if end is not None else await self.get()

        return await asyncio.wait_for(last(), timeout)

    async def cancel(self, reason: str = "") -> TaskView:
        """Ends the task CANCELED; the agent working on it sees its call canceled."""
        try:
            return TaskView(await self._tasks._cancel(task_pb2.CancelTaskRequest(task_id=self.id, reason=reason)))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def answer(self, text: str | None = None, *, payload: bytes | None = None, content_type: str = "") -> TaskView:
        """Answers the question of a task that waits for input (INPUT_REQUIRED)."""
        message = task_pb2.TaskMessage(parts=[_part(payload, text, content_type)])
        try:
            return TaskView(await self._tasks._answer(task_pb2.AnswerTaskRequest(task_id=self.id, message=message)))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
