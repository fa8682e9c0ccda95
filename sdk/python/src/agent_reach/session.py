"""Session context: the fields the agents working on one session share, through the local
sidecar (which answers reads of sessions it follows from its cache).

In a handler, ``call.session()`` addresses the call's session as the serving instance;
outside one, ``client.session("s-42")`` does the same as the client's caller instance::

    session = call.session()
    order = await session.get("order_id")              # SessionField | None
    await session.put_first("user_id", "u-42")         # the first value stands
    await session.set("status", "open")                # the declared policy, else last writer
    snapshot = await session.read()
    version = snapshot.fields["counter"].version
    await session.compare_and_set("counter", "8", version)
    async for change in session.watch(after_version=snapshot.version):
        ...

In a handler, reads are answered in-process when the sidecar delivered the session with the
call (``HandleRequest.session``: it does when it follows the session and the session is at
most ``--session-snapshot-max-bytes``, 64 KiB by default). Such a read sees the session as
of delivery plus the handler's own successful writes and deletes; ``read(min_version=...)``
newer than the delivered version, ``read()`` after the handler's own writes, and every read
after a ``ContextConflict`` or ``ContextFieldLocked`` (which show the snapshot is behind) go
to the sidecar as before.

Refusals raise the typed errors of :mod:`agent_reach.errors`: ``ContextFieldLocked`` (naming
the first writer), ``ContextConflict`` (with the current version), ``ContextTooLarge``,
``ContextTooManySessions``, ``ContextPolicyOverride`` and ``ContextHistoryCompacted``. Nothing
here retries.
"""

from __future__ import annotations

import enum
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

import grpc

from agent_reach._proto.agentreach.v1 import session_pb2
from agent_reach.errors import ContextConflict, ContextFieldLocked, InvalidArgument, MeshError, from_rpc_error

_GET = "/agentreach.v1.Sidecar/GetSession"
_PUT = "/agentreach.v1.Sidecar/PutSession"
_DELETE = "/agentreach.v1.Sidecar/DeleteSession"
_WATCH = "/agentreach.v1.Sidecar/WatchSession"


class WritePolicy(enum.IntEnum):
    """How a write treats a field's current value."""

    DECLARED = session_pb2.WRITE_POLICY_UNSPECIFIED
    """The policy an agent or capability policy declares for the field; last writer if none."""
    FIRST_WRITER = session_pb2.WRITE_POLICY_FIRST_WRITER
    """Only if the field does not exist; then the value stands for the session's life."""
    LAST_WRITER = session_pb2.WRITE_POLICY_LAST_WRITER
    """Whatever the current value (unless a first writer locked the field)."""
    COMPARE_AND_SET = session_pb2.WRITE_POLICY_COMPARE_AND_SET
    """Only if the field is still at ``expected_version`` (0: it must not exist)."""


@dataclass(frozen=True)
class SessionField:
    """One field as read."""

    name: str
    value: bytes
    content_type: str
    version: int
    """The version of the write that set it."""
    writer_agent: str
    writer_instance: str
    written_at_ms: int
    locked: bool
    """Set by a first writer: no later write or field delete can change it."""

    def text(self) -> str:
        return self.value.decode("utf-8", "replace")

    @classmethod
    def _of(cls, f: session_pb2.SessionField) -> SessionField:
        return cls(
            name=f.name,
            value=f.value,
            content_type=f.content_type,
            version=f.version,
            writer_agent=f.writer_agent,
            writer_instance=f.writer_instance,
            written_at_ms=f.written_at_ms,
            locked=f.locked,
        )


@dataclass(frozen=True)
class SessionSnapshot:
    """A session as read."""

    found: bool
    """False when the session does not exist (never written, deleted or expired)."""
    version: int
    fields: Mapping[str, SessionField] = field(default_factory=dict)
    cached: bool = False
    """Answered from the local sidecar's cache, without a round trip to control."""
    delivered: bool = False
    """Answered in-process from the session delivered with the call (no RPC)."""


class _Delivered:
    """The session a sidecar delivered with a call, shared by the call's sessions: the
    session as of delivery plus the handler's own successful writes."""

    def __init__(self, session: session_pb2.DeliveredSession, writer_agent: str = "") -> None:
        self.live = True
        self.found = True
        self.version = int(session.version)
        self.fields = {f.name: SessionField._of(f) for f in session.fields}
        self.own_writes = False
        self.hits = 0
        self.writer_agent = writer_agent

    @classmethod
    def of(cls, session_id: str, request: object, writer_agent: str = "") -> _Delivered | None:
        """The session delivered with ``request`` (a ``HandleRequest``), if it is ``session_id``'s."""
        has = getattr(request, "HasField", None)
        if not session_id or has is None or not has("session"):
            return None
        session: session_pb2.DeliveredSession = request.session  # type: ignore[attr-defined]
        return cls(session, writer_agent) if session.session_id == session_id else None

    def get(self, name: str) -> tuple[bool, SessionField | None]:
        if not self.live:
            return False, None
        self.hits += 1
        return True, self.fields.get(name)

    def read(self, min_version: int, names: list[str]) -> SessionSnapshot | None:
        if not self.live or self.own_writes or min_version > self.version:
            return None
        self.hits += 1
        fields = {n: f for n, f in self.fields.items() if not names or n in names}
        return SessionSnapshot(found=self.found, version=self.version, fields=fields, cached=True, delivered=True)

    def wrote(self, writes: list[session_pb2.SessionFieldWrite], instance_id: str, version: int) -> None:
        now = int(time.time() * 1000)
        for w in writes:
            self.fields[w.name] = SessionField(
                name=w.name,
                value=w.value,
                content_type=w.content_type,
                version=version,
                writer_agent=self.writer_agent,
                writer_instance=instance_id,
                written_at_ms=now,
                locked=w.policy == session_pb2.WRITE_POLICY_FIRST_WRITER,
            )
        self.found, self.own_writes = True, True

    def deleted(self, names: list[str]) -> None:
        if not names:
            self.fields.clear()
            self.found = False
        for n in names:
            self.fields.pop(n, None)
        self.own_writes = True

    def refused(self, e: MeshError) -> None:
        if isinstance(e, (ContextConflict, ContextFieldLocked)):
            self.live = False


@dataclass(frozen=True)
class FieldWrite:
    """One field of a :meth:`Session.put_many`."""

    name: str
    value: bytes | str
    policy: WritePolicy = WritePolicy.DECLARED
    expected_version: int = 0
    content_type: str = ""

    def _proto(self) -> session_pb2.SessionFieldWrite:
        if self.expected_version and self.policy not in (WritePolicy.COMPARE_AND_SET, WritePolicy.DECLARED):
            raise InvalidArgument("only compare_and_set writes expect a version", code=grpc.StatusCode.INVALID_ARGUMENT)
        value = self.value.encode() if isinstance(self.value, str) else self.value
        return session_pb2.SessionFieldWrite(
            name=self.name,
            value=value,
            content_type=self.content_type,
            policy=int(self.policy),  # type: ignore[arg-type]
            expected_version=self.expected_version,
        )


@dataclass(frozen=True)
class SessionChange:
    """One write of the session, as a watch reports it."""

    version: int
    put: Mapping[str, SessionField]
    removed: list[str]
    ended: bool
    """The session was deleted or expired; the watch ends after this change."""


class Session:
    """A session of the caller's tenant, addressed as one instance (the writer of its puts).

    Writes and deletes present the agent ``credential`` when there is one, so the sidecar
    verifies the writer; fields the tenant policy's ``session_writers`` rules cover need
    that, and refusals raise :class:`~agent_reach.errors.ContextWriterNotAllowed` (or
    :class:`~agent_reach.errors.ContextWriterMismatch` when ``instance_id`` is not the
    credential's instance)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        session_id: str,
        instance_id: str,
        credential: str = "",
        delivered: _Delivered | None = None,
    ) -> None:
        self.session_id = session_id
        self.instance_id = instance_id
        self._credential = credential
        self._delivered = delivered
        self._get = channel.unary_unary(
            _GET,
            request_serializer=session_pb2.GetSessionRequest.SerializeToString,
            response_deserializer=session_pb2.GetSessionReply.FromString,
        )
        self._put = channel.unary_unary(
            _PUT,
            request_serializer=session_pb2.PutSessionRequest.SerializeToString,
            response_deserializer=session_pb2.PutSessionReply.FromString,
        )
        self._delete = channel.unary_unary(
            _DELETE,
            request_serializer=session_pb2.DeleteSessionRequest.SerializeToString,
            response_deserializer=session_pb2.DeleteSessionReply.FromString,
        )
        self._watch = channel.unary_stream(
            _WATCH,
            request_serializer=session_pb2.WatchSessionRequest.SerializeToString,
            response_deserializer=session_pb2.SessionChange.FromString,
        )

    def _writer_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("ar-agent-credential", self._credential),) if self._credential else ()

    @property
    def delivered_version(self) -> int | None:
        """The version of the session delivered with the call while reads are answered from
        it; None when none was (or after a refusal showed it is behind)."""
        d = self._delivered
        return d.version if d is not None and d.live else None

    @property
    def delivered_reads(self) -> int:
        """Reads of the call's session (through any of its sessions) answered in-process."""
        return self._delivered.hits if self._delivered is not None else 0

    def _check(self) -> None:
        if not self.session_id:
            raise InvalidArgument("this call carries no session id", code=grpc.StatusCode.FAILED_PRECONDITION)

    async def read(self, min_version: int = 0, fields: Iterable[str] = ()) -> SessionSnapshot:
        """The session (all fields, or ``fields``), at least at ``min_version`` (e.g. a
        version a write returned on another host)."""
        self._check()
        names = list(fields)
        if self._delivered is not None:
            snapshot = self._delivered.read(min_version, names)
            if snapshot is not None:
                return snapshot
        request = session_pb2.GetSessionRequest(session_id=self.session_id, min_version=min_version, fields=names)
        try:
            reply: session_pb2.GetSessionReply = await self._get(request)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        return SessionSnapshot(
            found=reply.found,
            version=reply.version,
            fields={f.name: SessionField._of(f) for f in reply.fields},
            cached=reply.cached,
        )

    async def get(self, name: str) -> SessionField | None:
        """One field, or ``None`` when the session or the field does not exist."""
        if self._delivered is not None:
            self._check()
            answered, found = self._delivered.get(name)
            if answered:
                return found
        snapshot = await self.read(fields=[name])
        return snapshot.fields.get(name)

    async def put_many(self, writes: Iterable[FieldWrite]) -> int:
        """Writes fields atomically (all or none), each with its policy; returns the version
        of the write."""
        self._check()
        if not self.instance_id and not self._credential:
            raise InvalidArgument(
                "writes need an instance to write as (use the agent's client or call.session())",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )
        protos = [w._proto() for w in writes]
        request = session_pb2.PutSessionRequest(
            session_id=self.session_id, fields=protos, writer_instance=self.instance_id
        )
        try:
            reply: session_pb2.PutSessionReply = await self._put(request, metadata=self._writer_metadata())
        except grpc.aio.AioRpcError as e:
            error = from_rpc_error(e)
            if self._delivered is not None:
                self._delivered.refused(error)
            raise error from None
        if self._delivered is not None:
            self._delivered.wrote(protos, self.instance_id, int(reply.version))
        return int(reply.version)

    async def put(
        self,
        name: str,
        value: bytes | str,
        *,
        policy: WritePolicy = WritePolicy.DECLARED,
        expected_version: int = 0,
        content_type: str = "",
    ) -> int:
        """Writes one field with ``policy``; returns the version of the write."""
        return await self.put_many([FieldWrite(name, value, policy, expected_version, content_type)])

    async def set(self, name: str, value: bytes | str) -> int:
        """Writes one field with its declared policy (last writer wins when none is declared)."""
        return await self.put(name, value)

    async def put_first(self, name: str, value: bytes | str) -> int:
        """Writes one field only if no one has: the first value stands."""
        return await self.put(name, value, policy=WritePolicy.FIRST_WRITER)

    async def compare_and_set(self, name: str, value: bytes | str, expected_version: int) -> int:
        """Writes one field only if it is still at ``expected_version`` (0: absent)."""
        return await self.put(
            name, value, policy=WritePolicy.COMPARE_AND_SET, expected_version=expected_version
        )

    async def delete(self, *fields: str) -> bool:
        """Deletes fields (never a first writer's), or the whole session when none is named.
        Returns whether anything was deleted."""
        self._check()
        request = session_pb2.DeleteSessionRequest(
            session_id=self.session_id, fields=list(fields), writer_instance=self.instance_id
        )
        try:
            reply: session_pb2.DeleteSessionReply = await self._delete(request, metadata=self._writer_metadata())
        except grpc.aio.AioRpcError as e:
            error = from_rpc_error(e)
            if self._delivered is not None:
                self._delivered.refused(error)
            raise error from None
        if self._delivered is not None:
            self._delivered.deleted(list(fields))
        return bool(reply.deleted)

    async def watch(self, after_version: int = 0) -> AsyncIterator[SessionChange]:
        """The session's changes after ``after_version``, then live ones, until the session
        ends. A broken watch raises (``ShuttingDown`` when the sidecar stops, with the
        ``resume_after_version`` detail); watch again from the last version seen."""
        self._check()
        call = self._watch(session_pb2.WatchSessionRequest(session_id=self.session_id, after_version=after_version))
        try:
            async for change in call:
                yield SessionChange(
                    version=change.version,
                    put={f.name: SessionField._of(f) for f in change.put},
                    removed=list(change.removed),
                    ended=change.ended,
                )
                if change.ended:
                    return
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()


__all__ = [
    "FieldWrite",
    "Session",
    "SessionChange",
    "SessionField",
    "SessionSnapshot",
    "WritePolicy",
]
