"""The agent's side: :class:`Agent` turns decorated handlers into a mesh agent.

    agent = Agent("summarizer", version="1.2.0", max_concurrency=8)

    @agent.capability("text.summarize", tags=["en", "zh"])
    async def summarize(call: Call) -> Reply:
        return Reply.text(call.text()[:200])

    @agent.capability("text.generate")
    async def generate(call: Call):            # an async generator streams its answer
        for word in call.text().split():
            yield Reply.text(word)

    agent.run()

``run()`` serves ``agentreach.v1.Agent`` and ``grpc.health.v1`` on a free local port,
registers with the local sidecar (``AGENT_REACH_SIDECAR`` or 127.0.0.1:7700), heartbeats
its state and load (from the SDK's own counters) from a thread of its own, so a blocked
event loop does not silence it, and on SIGTERM/SIGINT reports PAUSED, lets calls in flight
finish, deregisters and exits.
"""

from __future__ import annotations

import asyncio
import inspect
import json as _json
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, Union

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from agent_reach import _context
from agent_reach._proto.agentreach.v1 import agent_pb2, common_pb2, sidecar_pb2
from agent_reach._types import HealthState, Priority, Reply, as_reply
from agent_reach.client import CHANNEL_OPTIONS, Client, api_token_metadata, sidecar_address, sidecar_channel
from agent_reach.errors import HandlerError, MeshError, from_rpc_error
from agent_reach.session import Session, _Delivered

log = logging.getLogger("agent_reach")

HandlerResult = Union[Reply, str, bytes, None]
UnaryHandler = Callable[["Call"], Awaitable[HandlerResult]]
StreamHandler = Callable[["Call"], AsyncIterator[HandlerResult]]
SyncHandler = Callable[["Call"], HandlerResult]
AnyHandler = Union[UnaryHandler, StreamHandler, SyncHandler]
H = TypeVar("H", bound=Callable[..., Any])

_SIDECAR = "agentreach.v1.Sidecar"


class Call:
    """A call delivered to a handler: the payload, who asked, and the call's deadline.

    Nested calls made while handling it (through any :class:`~agent_reach.Client`, or
    :attr:`client`) inherit its deadline and trace context.
    """

    def __init__(
        self,
        request: agent_pb2.HandleRequest,
        capability: str,
        *,
        deadline: float | None = None,
        traceparent: str | None = None,
        context: grpc.aio.ServicerContext[Any, Any] | None = None,
        client: Client | None = None,
        verified_caller: tuple[str, str] | None = None,
        verified_caller_tenant: str | None = None,
    ) -> None:
        self.request = request
        self.verified_caller = verified_caller
        """The calling agent and instance id as the mesh verified them (the caller's agent
        credential, vouched for by its sidecar over mutual TLS); None for anonymous calls."""
        self.verified_caller_tenant = verified_caller_tenant if verified_caller is not None else None
        """The verified caller's tenant: this agent's own, or another tenant that both
        tenants' policies granted the call (from the calling sidecar's certificate); None for
        anonymous calls."""
        self.capability = capability
        """The capability the call was routed by."""
        self.deadline = deadline
        """When the caller stops waiting, in ``time.monotonic()`` seconds (None: no deadline)."""
        self.traceparent = traceparent
        """The W3C trace context of the call, if any."""
        self._context = context
        self._client = client
        caller = getattr(client, "_caller", None) if client is not None else None
        self._delivered = _Delivered.of(request.session_id, request, getattr(caller, "agent", ""))

    @classmethod
    def for_test(cls, capability: str, payload: bytes | str = b"", **fields: Any) -> Call:
        """A call built by hand, to unit-test a handler without a mesh.

        >>> Call.for_test("text.summarize", "hello").text()
        'hello'
        """
        data = payload.encode() if isinstance(payload, str) else payload
        return cls(agent_pb2.HandleRequest(payload=data, **fields), capability)

    @property
    def payload(self) -> bytes:
        return self.request.payload

    def text(self) -> str:
        """The payload as UTF-8; a payload that is not UTF-8 fails the call with
        INVALID_ARGUMENT."""
        try:
            return self.request.payload.decode("utf-8")
        except UnicodeDecodeError:
            raise HandlerError.invalid_argument("payload is not valid UTF-8") from None

    def json(self) -> Any:
        """The payload parsed as JSON (INVALID_ARGUMENT when it is not JSON)."""
        try:
            return _json.loads(self.request.payload)
        except ValueError as e:
            raise HandlerError.invalid_argument(f"payload is not JSON: {e}") from None

    @property
    def content_type(self) -> str:
        return self.request.content_type

    @property
    def session_id(self) -> str:
        return self.request.session_id

    @property
    def message_id(self) -> str:
        return self.request.message_id

    @property
    def idempotency_key(self) -> str:
        return self.request.idempotency_key

    @property
    def priority(self) -> Priority:
        return Priority(self.request.priority)

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.request.metadata

    @property
    def caller(self) -> tuple[str, str] | None:
        """The calling agent and instance id, as the caller said (not verified; see
        :attr:`verified_caller`)."""
        if not self.request.HasField("caller"):
            return None
        return (self.request.caller.agent, self.request.caller.instance_id)

    @property
    def instance_id(self) -> str:
        """The instance handling the call."""
        return self.request.instance_id

    @property
    def attempt(self) -> int:
        """1 for a first try, 2 or more when the caller's sidecar retried here."""
        return self.request.attempt

    @property
    def tenant(self) -> str:
        return self.request.tenant

    def time_remaining(self) -> float | None:
        """Seconds until the deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def cancelled(self) -> bool:
        """Whether the caller cancelled (or the deadline passed). A cancelled handler also
        gets ``asyncio.CancelledError`` at its next await (``GeneratorExit`` at a
        streaming handler's ``yield``)."""
        if self._context is not None and self._context.cancelled():
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a worker thread: no task of its own
            return False
        cancelling = getattr(task, "cancelling", None)  # Python 3.11+
        return bool(cancelling and cancelling() > 0)

    @property
    def client(self) -> Client:
        """A client of the agent's sidecar whose calls name this agent as the caller."""
        if self._client is None:
            raise RuntimeError("this call has no client (built by hand)")
        return self._client

    def session(self) -> Session:
        """The call's session context, written as the serving instance (see
        :mod:`agent_reach.session`)."""
        session = self.client.session(self.session_id, instance_id=self.instance_id)
        session._delivered = self._delivered
        return session


@dataclass
class _Handler:
    name: str
    fn: Callable[[Call], Any]
    streaming: bool
    is_async: bool


class _Stats:
    """The SDK's own counters, read by the heartbeat thread."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.queued = 0
        self.handled = 0
        self.peak_in_flight = 0
        self.latency_ms = 0.0

    def load(self, max_concurrency: int) -> common_pb2.Load:
        ratio = (self.in_flight + self.queued) / max_concurrency if max_concurrency else 0.0
        return common_pb2.Load(
            in_flight=self.in_flight,
            queue_length=self.queued,
            load_ratio=ratio,
            avg_latency_ms=int(self.latency_ms),
        )

    def done(self, started: float) -> None:
        self.handled += 1
        sample = (time.monotonic() - started) * 1000
        self.latency_ms = sample if self.latency_ms == 0 else (self.latency_ms * 7 + sample) / 8


class AgentStartError(Exception):
    """The agent could not start (bad configuration, or the sidecar refused it)."""


class Agent:
    """A mesh agent: a name, capabilities with their handlers, and the SDK around them.

    :param name: the agent's name; several instances may share it.
    :param version: reported to the mesh (canary splits route by it).
    :param max_concurrency: calls run at once (0: unlimited); more wait in the SDK's queue
        and the sidecar's admission control knows the limit.
    :param sidecar: the local sidecar (default ``AGENT_REACH_SIDECAR`` or 127.0.0.1:7700).
    :param listen: where to serve the Agent API (default 127.0.0.1, a free port).
    :param instance_id: a stable instance id (e.g. the pod name); empty: assigned.
    :param drain_timeout: how long shutdown waits for calls in flight, in seconds.
    :param register_timeout: how long :meth:`start` retries while the sidecar is
        unavailable (None: until it succeeds).
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "",
        max_concurrency: int = 0,
        sidecar: str | None = None,
        listen: str = "127.0.0.1:0",
        instance_id: str = "",
        metadata: Mapping[str, str] | None = None,
        drain_timeout: float = 30.0,
        register_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.max_concurrency = max_concurrency
        self.sidecar = sidecar_address(sidecar)
        self.listen = listen
        self.metadata = dict(metadata or {})
        self.drain_timeout = drain_timeout
        self.register_timeout = register_timeout
        self._requested_id = instance_id
        self._capabilities: dict[str, list[str]] = {}
        self._handlers: dict[str, _Handler] = {}
        self._stats = _Stats()
        self._state = HealthState.UP
        self._instance_id = ""
        # The agent credential of the current registration (see Client.with_credential).
        self._credential = ""
        self._endpoint = ""
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._client: Client | None = None
        self._heartbeats: _Heartbeats | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._idle: asyncio.Event | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._health: HealthServicer | None = None
        self.loop_tick = time.monotonic()

    # -- declaring --------------------------------------------------------------------

    def capability(self, name: str, tags: Iterable[str] = ()) -> Callable[[H], H]:
        """Decorator: handles calls to capability ``name`` (declared with ``tags``).

        The handler takes a :class:`Call` and may be ``async def`` (one answer), an
        ``async def`` with ``yield`` (a streamed answer, one chunk per yield), or a plain
        ``def`` (run in a worker thread). It returns (or yields) a :class:`Reply`, ``str``
        or ``bytes``; raising :class:`HandlerError` fails the call with its code.
        """

        def register(fn: H) -> H:
            self.add_handler(name, fn, tags)
            return fn

        return register

    def add_handler(self, name: str, fn: Callable[[Call], Any], tags: Iterable[str] = ()) -> None:
        """Like :meth:`capability`, without the decorator syntax."""
        if self._server is not None:
            raise RuntimeError("capabilities must be declared before the agent starts")
        self._capabilities.setdefault(name, [])
        self._capabilities[name].extend(t for t in tags if t not in self._capabilities[name])
        streaming = inspect.isasyncgenfunction(fn)
        is_async = streaming or inspect.iscoroutinefunction(fn)
        self._handlers[name] = _Handler(name, fn, streaming, is_async)

    # -- state ------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """The instance id the sidecar assigned (it changes if the agent registers again)."""
        return self._instance_id

    @property
    def endpoint(self) -> str:
        """Where the agent serves its API, e.g. ``http://127.0.0.1:50123``."""
        return self._endpoint

    @property
    def state(self) -> HealthState:
        return self._state

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return self._stats.in_flight

    @property
    def queued(self) -> int:
        """Calls waiting for a ``max_concurrency`` slot."""
        return self._stats.queued

    @property
    def handled(self) -> int:
        """Calls finished so far."""
        return self._stats.handled

    @property
    def peak_in_flight(self) -> int:
        """The most handlers that ever ran at once."""
        return self._stats.peak_in_flight

    @property
    def client(self) -> Client:
        """A client of the same sidecar whose calls are made as this agent (they present
        its agent credential, so its sidecar vouches for it)."""
        if self._client is None:
            raise RuntimeError("the agent has not started")
        return self._client

    def set_state(self, state: HealthState) -> None:
        """Reports a state of the agent's own (e.g. DEGRADED while a model reloads, PAUSED
        to take no new calls); sent to the sidecar at once."""
        self._state = HealthState(state)
        if self._heartbeats is not None:
            self._heartbeats.wake()

    # -- running ----------------------------------------------------------------------

    def registration(self) -> common_pb2.AgentRegistration:
        """What the agent tells the mesh about itself."""
        return common_pb2.AgentRegistration(
            agent=self.name,
            version=self.version,
            capabilities=[common_pb2.Capability(name=n, tags=t) for n, t in self._capabilities.items()],
            endpoint=self._endpoint,
            transport=common_pb2.TRANSPORT_GRPC,
            max_concurrency=self.max_concurrency,
            metadata=self.metadata,
        )

    async def start(self) -> Agent:
        """Starts serving and registers with the sidecar; returns once registered."""
        if not self._handlers:
            raise AgentStartError(f"agent {self.name!r} has no capabilities")
        loop = asyncio.get_running_loop()
        self._semaphore = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        self._idle = asyncio.Event()
        self._idle.set()
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *CHANNEL_OPTIONS[:2]])
        server.add_generic_rpc_handlers((self._rpc_handlers(),))
        self._health = HealthServicer()
        server.add_generic_rpc_handlers((_health_handlers(self._health),))
        try:
            port = server.add_insecure_port(self.listen)
        except RuntimeError as e:
            raise AgentStartError(f"cannot listen on {self.listen}: {e}") from e
        host = self.listen.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        self._endpoint = f"http://{host}:{port}"
        await server.start()
        self._server = server
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("agentreach.v1.Agent", health_pb2.HealthCheckResponse.SERVING)
        self._channel = sidecar_channel(self.sidecar)
        try:
            reply = await self._register()
        except BaseException:
            await server.stop(None)
            await self._channel.close()
            self._server = None
            raise
        self._instance_id = reply.instance_id
        self._credential = reply.credential
        self._client = Client(
            self.sidecar, caller_agent=self.name, caller_instance=self._instance_id, credential=reply.credential
        )
        interval = max(reply.heartbeat_interval_ms, 50) / 1000
        self.loop_tick = time.monotonic()
        self._watchdog = loop.create_task(self._tick())
        self._heartbeats = _Heartbeats(self, interval)
        self._heartbeats.start()
        log.info("agent %s registered as %s (serving %s)", self.name, self._instance_id, self._endpoint)
        return self

    async def _register(self) -> sidecar_pb2.RegisterReply:
        assert self._channel is not None
        register = self._channel.unary_unary(
            f"/{_SIDECAR}/Register",
            request_serializer=sidecar_pb2.RegisterRequest.SerializeToString,
            response_deserializer=sidecar_pb2.RegisterReply.FromString,
        )
        request = sidecar_pb2.RegisterRequest(registration=self.registration(), instance_id=self._requested_id)
        give_up = None if self.register_timeout is None else time.monotonic() + self.register_timeout
        wait = 0.1
        while True:
            try:
                return await register(request, timeout=5)
            except grpc.aio.AioRpcError as e:
                retryable = e.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.UNKNOWN,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
                if not retryable or (give_up is not None and time.monotonic() + wait > give_up):
                    raise AgentStartError(f"sidecar {self.sidecar} refused the registration: {from_rpc_error(e)}") from e
                log.warning("registration with %s failed, retrying in %.1fs: %s", self.sidecar, wait, e.details())
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)

    async def _tick(self) -> None:
        """Proves to the heartbeat thread that the event loop runs."""
        while True:
            self.loop_tick = time.monotonic()
            await asyncio.sleep(0.25)

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Graceful shutdown, in order: report PAUSED (the sidecar stops handing this
        instance new calls), let calls in flight and queued finish (up to the drain
        timeout), deregister, stop serving."""
        if self._server is None:
            return
        timeout = self.drain_timeout if drain_timeout is None else drain_timeout
        give_up = time.monotonic() + timeout
        self._state = HealthState.PAUSED
        heartbeats = self._heartbeats
        if heartbeats is not None:
            await asyncio.get_running_loop().run_in_executor(None, heartbeats.beat_now)
        assert self._idle is not None
        # Calls routed before the PAUSED report spread may still arrive for a moment.
        for settle in (0.0, 0.3):
            await asyncio.sleep(settle)
            try:
                await asyncio.wait_for(self._idle.wait(), max(give_up - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                log.warning("agent %s: %d call(s) still in flight after the drain timeout", self.name, self.in_flight)
                break
        if heartbeats is not None:
            heartbeats.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self._deregister()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        await self._server.stop(max(give_up - time.monotonic(), 0.5))
        if self._client is not None:
            await self._client.close()
        if self._channel is not None:
            await self._channel.close()
        self._server = None
        log.info("agent %s (%s) stopped", self.name, self._instance_id)

    async def _deregister(self) -> None:
        assert self._channel is not None
        deregister = self._channel.unary_unary(
            f"/{_SIDECAR}/Deregister",
            request_serializer=sidecar_pb2.DeregisterRequest.SerializeToString,
            response_deserializer=sidecar_pb2.DeregisterReply.FromString,
        )
        try:
            await deregister(sidecar_pb2.DeregisterRequest(instance_id=self._instance_id), timeout=5)
        except grpc.aio.AioRpcError as e:
            log.warning("deregister of %s failed (its registration will expire): %s", self._instance_id, e.details())

    async def __aenter__(self) -> Agent:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def serve(self) -> None:
        """Starts the agent and runs it until SIGTERM or SIGINT, then shuts down
        gracefully."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
                pass
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
            await self.stop()

    def run(self) -> None:
        """``asyncio.run(agent.serve())``: the agent's whole life in one call."""
        asyncio.run(self.serve())

    # -- serving ----------------------------------------------------------------------

    def _rpc_handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "agentreach.v1.Agent",
            {
                "Handle": grpc.unary_unary_rpc_method_handler(
                    self._handle,
                    request_deserializer=agent_pb2.HandleRequest.FromString,
                    response_serializer=agent_pb2.HandleReply.SerializeToString,
                ),
                "HandleStream": grpc.unary_stream_rpc_method_handler(
                    self._handle_stream,
                    request_deserializer=agent_pb2.HandleRequest.FromString,
                    response_serializer=agent_pb2.Chunk.SerializeToString,
                ),
            },
        )

    def _handler_for(self, request: agent_pb2.HandleRequest, streaming: bool) -> _Handler:
        capability = request.capability
        if not capability and request.target.WhichOneof("kind") == "capability":
            capability = request.target.capability
        if not capability:
            if len(self._handlers) != 1:
                raise HandlerError.invalid_argument("this agent offers several capabilities; call it by capability")
            capability = next(iter(self._handlers))
        handler = self._handlers.get(capability)
        if handler is None or handler.streaming != streaming:
            kind = "streaming" if streaming else "unary"
            raise HandlerError(grpc.StatusCode.UNIMPLEMENTED, f"agent {self.name} has no {kind} handler for {capability!r}")
        return handler

    def _call(self, request: agent_pb2.HandleRequest, handler: _Handler, context: grpc.aio.ServicerContext[Any, Any]) -> Call:
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        seen: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            if key in ("traceparent", "ar-caller-agent", "ar-caller-instance", "ar-caller-tenant"):
                seen[key] = value if isinstance(value, str) else value.decode()
        verified = (seen["ar-caller-agent"], seen.get("ar-caller-instance", "")) if "ar-caller-agent" in seen else None
        return Call(
            request,
            handler.name,
            deadline=deadline,
            traceparent=seen.get("traceparent"),
            context=context,
            client=self._client,
            verified_caller=verified,
            verified_caller_tenant=seen.get("ar-caller-tenant"),
        )

    async def _admit(self) -> None:
        """Waits for a ``max_concurrency`` slot and counts the call in flight."""
        stats = self._stats
        if self._semaphore is not None:
            stats.queued += 1
            try:
                await self._semaphore.acquire()
            except BaseException:
                stats.queued -= 1
                if stats.in_flight == 0 and stats.queued == 0 and self._idle is not None:
                    self._idle.set()
                raise
            stats.queued -= 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        assert self._idle is not None
        self._idle.clear()

    def _release(self, started: float) -> None:
        stats = self._stats
        stats.in_flight -= 1
        stats.done(started)
        if self._semaphore is not None:
            self._semaphore.release()
        if stats.in_flight == 0 and stats.queued == 0 and self._idle is not None:
            self._idle.set()

    async def _handle(self, request: agent_pb2.HandleRequest, context: grpc.aio.ServicerContext[Any, Any]) -> agent_pb2.HandleReply:
        try:
            handler = self._handler_for(request, streaming=False)
        except HandlerError as e:
            await context.abort(e.code, e.message)
        call = self._call(request, handler, context)
        self._idle_clear_for_queue()
        await self._admit()
        started = time.monotonic()
        try:
            with _context.handling(self._inherited(call)):
                if handler.is_async:
                    result = await handler.fn(call)
                else:
                    result = await asyncio.to_thread(handler.fn, call)
            reply = as_reply(result)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            code, message = _status_of(e, handler.name)
            await context.abort(code, message)
        finally:
            self._release(started)
        return agent_pb2.HandleReply(payload=reply.payload, content_type=reply.content_type, metadata=dict(reply.metadata))

    async def _handle_stream(self, request: agent_pb2.HandleRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            handler = self._handler_for(request, streaming=True)
        except HandlerError as e:
            await context.abort(e.code, e.message)
        call = self._call(request, handler, context)
        self._idle_clear_for_queue()
        await self._admit()
        started = time.monotonic()
        stream: AsyncIterator[HandlerResult] = handler.fn(call)
        try:
            with _context.handling(self._inherited(call)):
                async for item in stream:
                    reply = as_reply(item)
                    await context.write(
                        agent_pb2.Chunk(payload=reply.payload, content_type=reply.content_type, metadata=dict(reply.metadata))
                    )
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            code, message = _status_of(e, handler.name)
            await context.abort(code, message)
        finally:
            # Cancelled (the caller left, or the deadline passed) or done: the generator's
            # own cleanup runs now, with GeneratorExit at its yield.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # noqa: BLE001
                    pass
            self._release(started)

    def _idle_clear_for_queue(self) -> None:
        if self._idle is not None:
            self._idle.clear()

    def _inherited(self, call: Call) -> _context.Inherited:
        return _context.Inherited(call.deadline, call.traceparent, self.name, self._instance_id, self._credential)


def _status_of(error: BaseException, capability: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, HandlerError):
        return error.code, error.message
    if isinstance(error, MeshError):
        return error.code, f"a call made by the {capability} handler failed: {error}"
    log.exception("handler for %s failed", capability, exc_info=error)
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


def _health_handlers(servicer: HealthServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                servicer.Check,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                servicer.Watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
        },
    )


class _Heartbeats(threading.Thread):
    """Heartbeats from a thread of their own, over a synchronous channel: a handler that
    blocks the event loop (a long synchronous step) does not silence the agent. While the
    loop is stuck for more than two intervals the agent reports DEGRADED, and UP again
    when it runs."""

    def __init__(self, agent: Agent, interval: float) -> None:
        super().__init__(name=f"agent-reach-heartbeat-{agent.name}", daemon=True)
        self.agent = agent
        self.interval = interval
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(agent.sidecar)
        self._heartbeat = self._channel.unary_unary(
            f"/{_SIDECAR}/Heartbeat",
            request_serializer=sidecar_pb2.HeartbeatRequest.SerializeToString,
            response_deserializer=sidecar_pb2.HeartbeatReply.FromString,
        )
        self._register = self._channel.unary_unary(
            f"/{_SIDECAR}/Register",
            request_serializer=sidecar_pb2.RegisterRequest.SerializeToString,
            response_deserializer=sidecar_pb2.RegisterReply.FromString,
        )

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self.join(timeout=5)
        self._channel.close()

    def state(self) -> HealthState:
        state = self.agent.state
        stalled = time.monotonic() - self.agent.loop_tick > max(2 * self.interval, 1.0)
        if stalled and state == HealthState.UP:
            return HealthState.DEGRADED
        return state

    def beat_now(self) -> None:
        """One heartbeat at once (the caller's thread)."""
        with self._lock:
            agent = self.agent
            request = sidecar_pb2.HeartbeatRequest(
                instance_id=agent.instance_id,
                state=int(self.state()),  # type: ignore[arg-type]
                load=agent._stats.load(agent.max_concurrency),
            )
            try:
                self._heartbeat(request, timeout=max(self.interval, 1.0), metadata=api_token_metadata())
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code == grpc.StatusCode.NOT_FOUND and not self._stopped.is_set():
                    self._register_again()
                else:
                    log.debug("heartbeat of %s failed: %s", agent.instance_id, e)

    def _register_again(self) -> None:
        """The sidecar lost us (it restarted, or our registration expired): join again
        with the same instance id."""
        agent = self.agent
        log.warning("sidecar no longer knows %s; registering again", agent.instance_id)
        request = sidecar_pb2.RegisterRequest(registration=agent.registration(), instance_id=agent.instance_id)
        try:
            reply = self._register(request, timeout=5, metadata=api_token_metadata())
        except grpc.RpcError as e:
            log.warning("registering %s again failed: %s", agent.instance_id, e)
            return
        agent._instance_id = reply.instance_id
        agent._credential = reply.credential
        if agent._client is not None:
            agent._client.credential = reply.credential

    def run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopped.is_set():
                return
            self.beat_now()
