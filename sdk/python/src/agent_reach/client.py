"""The caller's side: :class:`Client` calls capabilities and agents through the local
sidecar.

    async with Client.local() as mesh:
        reply = await mesh.invoke("text.translate", tags=["zh"], session="s-42",
                                  priority=Priority.HIGH, timeout=3, text="hello")
        print(reply.text(), reply.instance, reply.attempts)

        async for chunk in mesh.invoke_stream("text.generate", text="a poem"):
            print(chunk.text(), end="")

Failures raise :class:`agent_reach.errors.MeshError` subclasses (``AgentNotFound``,
``RateLimited``...). The client does not retry: the caller's sidecar already retries on
another instance where that is safe. Inside a handler, calls inherit the handled call's
deadline and trace context.
"""

from __future__ import annotations

import json as _json
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc

from agent_reach import _context
from agent_reach._proto.agentreach.v1 import agent_pb2, common_pb2, sidecar_pb2
from agent_reach._types import JSON, TEXT, Priority
from agent_reach.errors import MeshError, SidecarUnreachable, from_rpc_error
from agent_reach.session import Session
from agent_reach.tasks import Submitted, TaskHandle, Tasks

DEFAULT_SIDECAR = "127.0.0.1:7700"
"""Where the local sidecar listens unless ``AGENT_REACH_SIDECAR`` says otherwise."""

_INVOKE = "/agentreach.v1.Sidecar/Invoke"
_INVOKE_STREAM = "/agentreach.v1.Sidecar/InvokeStream"
_ROUTE = "/agentreach.v1.Sidecar/Route"

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]


def api_token_metadata() -> tuple[tuple[str, str], ...]:
    """The sidecar's local API token (``AGENT_REACH_API_TOKEN``) as call metadata, if set."""
    token = os.environ.get("AGENT_REACH_API_TOKEN", "").strip()
    return (("ar-api-token", token),) if token else ()


class _ApiToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds the local API token to every call on a channel to the sidecar."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata()
        for key, value in details.metadata or ():
            metadata.add(key, value)
        for key, value in self._metadata:
            metadata.add(key, value)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def sidecar_channel(address: str) -> grpc.aio.Channel:
    """An asyncio channel to the sidecar at ``address``; every call carries the local API
    token when ``AGENT_REACH_API_TOKEN`` is set."""
    token = api_token_metadata()
    interceptors = [_ApiToken(token)] if token else None
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)


def sidecar_address(address: str | None = None) -> str:
    """``address``, else ``AGENT_REACH_SIDECAR``, else 127.0.0.1:7700, without a scheme."""
    addr = address or os.environ.get("AGENT_REACH_SIDECAR") or DEFAULT_SIDECAR
    for scheme in ("http://", "grpc://"):
        if addr.startswith(scheme):
            addr = addr[len(scheme) :]
    return addr.rstrip("/")


@dataclass(frozen=True)
class Response:
    """The answer to :meth:`Client.invoke`."""

    payload: bytes
    content_type: str
    metadata: Mapping[str, str]
    instance: str
    """The instance that served the call."""
    agent: str
    agent_version: str
    attempts: int
    """Attempts the caller's sidecar made (2 when it retried on another instance)."""
    fallback_from: str | None = None
    """When a policy's fallback served the call: the target that could not."""
    route: str = ""
    """The routing digest (strategy, target, instance, attempt) from ``ar-route``."""
    trace_id: str | None = None
    """The trace the call was recorded in, when it was traced."""

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self.payload.decode("utf-8", "replace")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return _json.loads(self.payload)


@dataclass(frozen=True)
class Chunk:
    """One piece of a streamed answer."""

    payload: bytes
    content_type: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def json(self) -> Any:
        return _json.loads(self.payload)


@dataclass(frozen=True)
class Candidate:
    """One instance a call could go to, best first (see :meth:`Client.route`)."""

    instance_id: str
    agent: str
    version: str
    state: str
    score: float
    note: str
    raw: sidecar_pb2.RouteCandidate


@dataclass(frozen=True)
class Skipped:
    """An instance routing passed over, with the machine-readable reason."""

    instance_id: str
    agent: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Route:
    """Where a call would go, without making it."""

    candidates: list[Candidate]
    skipped: list[Skipped]
    strategy: str
    table_revision: int
    table_stale: bool
    raw: sidecar_pb2.RouteReply


def _header(pairs: Iterable[tuple[str, str | bytes]] | None, name: str) -> str:
    for key, value in pairs or ():
        if key == name:
            return value.decode() if isinstance(value, bytes) else value
    return ""


class Client:
    """A connection to a sidecar's local API.

    Use :meth:`local` (``AGENT_REACH_SIDECAR`` or 127.0.0.1:7700) or pass an address; the
    connection is made on first use. Close it with ``await client.close()`` or use it as an
    async context manager. One client serves any number of concurrent calls.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        caller_agent: str = "",
        caller_instance: str = "",
        credential: str = "",
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.address = sidecar_address(address)
        # The agent credential presented on calls (``ar-agent-credential``); empty: the
        # handled call's agent's inside a handler, else anonymous.
        self.credential = credential
        self._own_channel = channel is None
        self._channel = channel or sidecar_channel(self.address)
        self._caller = (
            common_pb2.Caller(agent=caller_agent, instance_id=caller_instance) if caller_agent else None
        )
        self._invoke = self._channel.unary_unary(
            _INVOKE,
            request_serializer=sidecar_pb2.InvokeRequest.SerializeToString,
            response_deserializer=sidecar_pb2.InvokeReply.FromString,
        )
        self._invoke_stream = self._channel.unary_stream(
            _INVOKE_STREAM,
            request_serializer=sidecar_pb2.InvokeRequest.SerializeToString,
            response_deserializer=agent_pb2.Chunk.FromString,
        )
        self._route = self._channel.unary_unary(
            _ROUTE,
            request_serializer=sidecar_pb2.RouteRequest.SerializeToString,
            response_deserializer=sidecar_pb2.RouteReply.FromString,
        )

    @classmethod
    def local(cls) -> Client:
        """A client of the local sidecar (``AGENT_REACH_SIDECAR`` or 127.0.0.1:7700)."""
        return cls()

    def with_caller(self, agent: str, instance_id: str = "") -> Client:
        """The same connection, with calls naming ``agent`` / ``instance_id`` as their caller.
        The name is not verified: rate limits, metrics and authorization use the caller an
        agent credential proves (see :meth:`with_credential`)."""
        clone = Client(
            self.address,
            caller_agent=agent,
            caller_instance=instance_id,
            credential=self.credential,
            channel=self._channel,
        )
        return clone

    def with_credential(self, credential: str) -> Client:
        """The same connection, presenting the agent credential ``Register`` returned on
        every call, so the sidecar vouches for that agent as the caller."""
        clone = Client(self.address, credential=credential, channel=self._channel)
        clone._caller = self._caller
        return clone

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection (only if this client opened it)."""
        if self._own_channel:
            await self._channel.close()

    def session(self, session_id: str, *, instance_id: str | None = None) -> Session:
        """Session ``session_id`` of the caller's tenant, written as ``instance_id`` (default:
        this client's caller instance, which must be registered with the sidecar to write).
        Writes present this client's agent credential, if any (the writer is then verified).
        See :mod:`agent_reach.session`."""
        writer = instance_id if instance_id is not None else (self._caller.instance_id if self._caller else "")
        return Session(self._channel, session_id, writer, self.credential)

    async def submit(self, capability: str | None = None, **options: Any) -> Submitted:
        """Submits a durable task as this client's caller; returns at once. The options are
        those of :meth:`agent_reach.tasks.Tasks.submit` (``agent=``, ``text=``, ``task_id=``...)."""
        return await Tasks(self._channel, self._caller).submit(capability, **options)

    def task(self, task_id: str) -> TaskHandle:
        """The durable task ``task_id`` of the tenant. See :mod:`agent_reach.tasks`."""
        return Tasks(self._channel, self._caller).task(task_id)

    def _request(
        self,
        capability: str | None,
        agent: str | None,
        tags: Sequence[str],
        payload: bytes | None,
        text: str | None,
        json: Any,
        content_type: str | None,
        session: str | None,
        priority: Priority | None,
        idempotency_key: str | None,
        metadata: Mapping[str, str] | None,
        message_id: str | None,
    ) -> sidecar_pb2.InvokeRequest:
        target = common_pb2.Target(tags=list(tags))
        if agent is not None:
            target.agent = agent
        elif capability is not None:
            target.capability = capability
        request = sidecar_pb2.InvokeRequest(
            target=target,
            session_id=session or "",
            priority=int(priority) if priority is not None else 0,  # type: ignore[arg-type]
            idempotency_key=idempotency_key or "",
            message_id=message_id or "",
        )
        if text is not None:
            request.payload = text.encode()
            request.content_type = TEXT
        elif json is not None:
            request.payload = _json.dumps(json).encode()
            request.content_type = JSON
        elif payload is not None:
            request.payload = bytes(payload)
        if content_type is not None:
            request.content_type = content_type
        if metadata:
            request.metadata.update(metadata)
        caller = self._caller
        current = _context.CURRENT.get()
        if caller is None and current is not None:
            caller = common_pb2.Caller(agent=current.agent, instance_id=current.instance_id)
        if caller is not None:
            request.caller.CopyFrom(caller)
        return request

    def _call_metadata(self, force_trace: bool, headers: Mapping[str, str] | None) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        credential = self.credential
        current = _context.CURRENT.get()
        if not credential and self._caller is None and current is not None:
            credential = current.credential
        if credential:
            out.append(("ar-agent-credential", credential))
        traceparent = _context.outgoing_traceparent()
        if traceparent:
            out.append(("traceparent", traceparent))
        if force_trace:
            out.append(("ar-trace", "force"))
        for k, v in (headers or {}).items():
            out.append((k.lower(), v))
        return out

    async def invoke(
        self,
        capability: str | None = None,
        *,
        agent: str | None = None,
        tags: Sequence[str] = (),
        payload: bytes | None = None,
        text: str | None = None,
        json: Any = None,
        content_type: str | None = None,
        session: str | None = None,
        priority: Priority | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        message_id: str | None = None,
        force_trace: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Calls any instance offering ``capability`` (or one of ``agent``) and waits for
        the answer.

        Give the payload as ``text=``, ``json=`` or ``payload=`` (bytes). ``timeout`` is in
        seconds and becomes the gRPC deadline, which every hop propagates; inside a handler
        it is capped at the handled call's remaining time. ``tags`` must all be carried by
        the chosen instance.

        >>> reply = await mesh.invoke("text.summarize", text="long text", timeout=3)  # doctest: +SKIP
        """
        request = self._request(
            capability, agent, tags, payload, text, json, content_type, session, priority,
            idempotency_key, metadata, message_id,
        )  # fmt: skip
        call = self._invoke(
            request,
            timeout=_context.effective_timeout(timeout),
            metadata=self._call_metadata(force_trace, headers),
        )
        try:
            reply = await call
            initial = await call.initial_metadata()
        except grpc.RpcError as e:
            raise self._error(e) from None
        return Response(
            payload=reply.payload,
            content_type=reply.content_type,
            metadata=dict(reply.metadata),
            instance=reply.instance_id,
            agent=reply.agent,
            agent_version=reply.agent_version,
            attempts=reply.attempts,
            fallback_from=reply.fallback_from or None,
            route=_header(initial, "ar-route"),
            trace_id=_header(initial, "ar-trace-id") or None,
        )

    def invoke_stream(
        self,
        capability: str | None = None,
        *,
        agent: str | None = None,
        tags: Sequence[str] = (),
        payload: bytes | None = None,
        text: str | None = None,
        json: Any = None,
        content_type: str | None = None,
        session: str | None = None,
        priority: Priority | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        message_id: str | None = None,
        force_trace: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> ChunkStream:
        """Calls a streaming capability; returns an async iterator of :class:`Chunk`.

        Chunks are read as the consumer asks for them, so a slow consumer slows the
        producing handler down (HTTP/2 flow control through every hop). Leaving the loop
        early (or :meth:`ChunkStream.cancel`) cancels the call, and the handler sees it.

        >>> async for chunk in mesh.invoke_stream("text.generate", text="hi"):  # doctest: +SKIP
        ...     print(chunk.text())
        """
        request = self._request(
            capability, agent, tags, payload, text, json, content_type, session, priority,
            idempotency_key, metadata, message_id,
        )  # fmt: skip
        call = self._invoke_stream(
            request,
            timeout=_context.effective_timeout(timeout),
            metadata=self._call_metadata(force_trace, headers),
        )
        return ChunkStream(call, self)

    async def route(
        self,
        capability: str | None = None,
        *,
        agent: str | None = None,
        tags: Sequence[str] = (),
        session: str | None = None,
        priority: Priority | None = None,
        max_candidates: int = 0,
        timeout: float | None = 5.0,
    ) -> Route:
        """Asks the sidecar where a call would go (ranked candidates and skipped instances
        with reasons), without making it."""
        target = common_pb2.Target(tags=list(tags))
        if agent is not None:
            target.agent = agent
        elif capability is not None:
            target.capability = capability
        request = sidecar_pb2.RouteRequest(
            target=target,
            session_id=session or "",
            priority=int(priority) if priority is not None else 0,  # type: ignore[arg-type]
            max_candidates=max_candidates,
        )
        try:
            reply = await self._route(request, timeout=timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return Route(
            candidates=[
                Candidate(
                    instance_id=c.instance.instance_id,
                    agent=c.instance.registration.agent,
                    version=c.instance.registration.version,
                    state=common_pb2.HealthState.Name(c.instance.state).removeprefix("HEALTH_STATE_"),
                    score=c.score,
                    note=c.note,
                    raw=c,
                )
                for c in reply.candidates
            ],
            skipped=[Skipped(s.instance_id, s.agent, s.reason, s.detail) for s in reply.skipped],
            strategy=reply.strategy,
            table_revision=reply.table_revision,
            table_stale=reply.table_stale,
            raw=reply,
        )

    def _error(self, error: grpc.RpcError) -> MeshError:
        mesh_error = from_rpc_error(error)
        if mesh_error.reason is None and mesh_error.code == grpc.StatusCode.UNAVAILABLE and not mesh_error.attempts:
            # No answer from the sidecar itself (connection refused, reset...).
            if "connect" in mesh_error.message.lower() or "unavailable" in mesh_error.message.lower():
                return SidecarUnreachable(
                    f"sidecar at {self.address}: {mesh_error.message}", code=mesh_error.code
                )
        return mesh_error


class ChunkStream:
    """The chunks of a streamed answer, as an async iterator.

    ``instance`` names the serving instance once the first chunk (or the headers) arrived.
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, agent_pb2.Chunk], client: Client) -> None:
        self._call = call
        self._client = client
        self.instance: str | None = None

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Chunk]:
        try:
            if self.instance is None:
                self.instance = _header(await self._call.initial_metadata(), "ar-instance") or None
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    return
                assert isinstance(message, agent_pb2.Chunk)
                yield Chunk(message.payload, message.content_type, dict(message.metadata))
        except grpc.RpcError as e:
            if self._call.cancelled():
                return
            raise self._client._error(e) from None
        finally:
            if not self._call.done():
                self._call.cancel()

    async def initial(self) -> str | None:
        """Waits for the response headers; returns the serving instance."""
        try:
            self.instance = _header(await self._call.initial_metadata(), "ar-instance") or None
        except grpc.RpcError as e:
            raise self._client._error(e) from None
        return self.instance

    def cancel(self) -> bool:
        """Cancels the call; the handler sees the cancellation."""
        return self._call.cancel()
