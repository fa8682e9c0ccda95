"""Typed exceptions for failed mesh calls.

Every error the mesh returns is a gRPC status whose ``grpc-status-details-bin`` trailer
holds a ``google.rpc.Status`` with a ``google.rpc.ErrorInfo`` (domain ``agent-reach.dev``)
naming the reason, plus reason-specific metadata. :func:`from_rpc_error` turns such a
status into the matching :class:`MeshError` subclass::

    try:
        await mesh.invoke("text.sumarize", text="...")
    except AgentNotFound as e:
        print(e.suggestions)          # ['text.summarize']
    except RateLimited as e:
        await asyncio.sleep(e.retry_after or 1.0)

Every exception carries :attr:`MeshError.attempts` and :attr:`MeshError.instances_tried`
(from the ``ar-attempts`` / ``ar-instances-tried`` response metadata or the ErrorInfo).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import grpc
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "agent-reach.dev"
"""The ``ErrorInfo.domain`` of every Agent-Reach error."""

_DETAILS_KEY = "grpc-status-details-bin"


class MeshError(Exception):
    """A failed call or request: the gRPC code, the mesh's reason and its details.

    Subclasses exist for each reason; an error without a known reason (e.g. a handler's own
    failure passed through unchanged) is a plain ``MeshError`` with ``reason`` ``None``.
    """

    REASON: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        attempts: int = 0,
        instances_tried: Iterable[str] = (),
        retry_after: float | None = None,
        field_violations: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason if reason is not None else self.REASON
        self.metadata: dict[str, str] = dict(metadata or {})
        self.attempts = attempts
        self.instances_tried: list[str] = list(instances_tried)
        self.retry_after = retry_after
        self.field_violations: dict[str, str] = dict(field_violations or {})

    def __str__(self) -> str:
        head = f"{self.reason} ({self.code.name})" if self.reason else self.code.name
        return f"{head}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, message={self.message!r}, "
            f"attempts={self.attempts}, instances_tried={self.instances_tried!r})"
        )

    def detail(self, key: str) -> str | None:
        """One ErrorInfo metadata value (e.g. ``"policy"``, ``"instance"``)."""
        return self.metadata.get(key)

    @property
    def instance(self) -> str | None:
        """The instance the error is about, when the mesh named one."""
        return self.metadata.get("instance") or None

    @property
    def policy(self) -> str | None:
        """The policy whose mechanism refused the call (e.g. ``"capability/echo"``)."""
        return self.metadata.get("policy") or None

    @property
    def target(self) -> str | None:
        """The target the call named, when the mesh reported it."""
        return self.metadata.get("target") or None


class AgentNotFound(MeshError):
    """No agent offers the capability (or has the name); see :attr:`suggestions`."""

    REASON = "AGENT_NOT_FOUND"

    @property
    def suggestions(self) -> list[str]:
        """Close capability or agent names, best first."""
        return [s for s in self.metadata.get("suggestions", "").split(",") if s]


class NoHealthyInstance(MeshError):
    """Instances exist, but none can take the call now (paused, down, open breakers...)."""

    REASON = "NO_HEALTHY_INSTANCE"


class InvalidArgument(MeshError):
    """The request was malformed; :attr:`field` names the offending field."""

    REASON = "INVALID_ARGUMENT"

    @property
    def field(self) -> str | None:
        """The request field at fault, e.g. ``"target"``."""
        return self.metadata.get("field") or next(iter(self.field_violations), None)


class PayloadTooLarge(MeshError):
    """The payload exceeds the sidecar's limit (:attr:`size` and :attr:`limit` in bytes)."""

    REASON = "PAYLOAD_TOO_LARGE"

    @property
    def size(self) -> int | None:
        return _int(self.metadata.get("size"))

    @property
    def limit(self) -> int | None:
        return _int(self.metadata.get("limit"))


class RateLimited(MeshError):
    """A token bucket refused the call; try again after :attr:`retry_after` seconds."""

    REASON = "RATE_LIMITED"

    @property
    def bucket(self) -> str | None:
        return self.metadata.get("bucket") or None


class AgentOverloaded(MeshError):
    """The target instance's admission queue was full or its wait ran out."""

    REASON = "AGENT_OVERLOADED"


class CircuitOpen(MeshError):
    """The caller's sidecar holds the instance's circuit breaker open."""

    REASON = "CIRCUIT_OPEN"


class DeadlineExceeded(MeshError):
    """The call's deadline passed before an answer came."""

    REASON = "DEADLINE_EXCEEDED"


class ControlUnavailable(MeshError):
    REASON = "CONTROL_UNAVAILABLE"


class StoreUnavailable(MeshError):
    REASON = "STORE_UNAVAILABLE"


class InstanceNotFound(MeshError):
    REASON = "INSTANCE_NOT_FOUND"


class PolicyNotFound(MeshError):
    REASON = "POLICY_NOT_FOUND"


class LeaseNotFound(MeshError):
    REASON = "LEASE_NOT_FOUND"


class Conflict(MeshError):
    REASON = "CONFLICT"


class InstanceUnreachable(MeshError):
    REASON = "INSTANCE_UNREACHABLE"


class SidecarUnreachable(MeshError):
    """The local sidecar could not be reached at all."""

    REASON = "SIDECAR_UNREACHABLE"


class PermissionDenied(MeshError):
    REASON = "PERMISSION_DENIED"


class NotAuthorized(PermissionDenied):
    """The target's authorization policy (``policy`` in details) does not allow the caller."""

    REASON = "NOT_AUTHORIZED"


class AgentCredentialInvalid(MeshError):
    """The agent credential presented is not (or no longer) one the sidecar issued."""

    REASON = "AGENT_CREDENTIAL_INVALID"


class ShuttingDown(MeshError):
    REASON = "SHUTTING_DOWN"


class IdempotentReplyNotStored(MeshError):
    REASON = "IDEMPOTENT_REPLY_NOT_STORED"


class IdempotencyKeyReused(MeshError):
    """The idempotency key was first used for a call with another payload (capability,
    content type or payload); metadata ``key_prefix`` names the key's first characters."""

    REASON = "IDEMPOTENCY_KEY_REUSED"


class Internal(MeshError):
    REASON = "INTERNAL"


class ContextFieldLocked(MeshError):
    """A session field set by a first writer cannot change; names that writer."""

    REASON = "CONTEXT_FIELD_LOCKED"

    @property
    def field(self) -> str:
        return self.metadata.get("field", "")

    @property
    def writer_agent(self) -> str:
        return self.metadata.get("writer_agent", "")

    @property
    def writer_instance(self) -> str:
        return self.metadata.get("writer_instance", "")

    @property
    def version(self) -> int:
        return _int(self.metadata.get("version")) or 0


class ContextConflict(MeshError):
    """A compare-and-set write expected another version of the field: read again, retry."""

    REASON = "CONTEXT_CONFLICT"

    @property
    def field(self) -> str:
        return self.metadata.get("field", "")

    @property
    def expected_version(self) -> int:
        return _int(self.metadata.get("expected_version")) or 0

    @property
    def current_version(self) -> int:
        return _int(self.metadata.get("current_version")) or 0


class ContextTooLarge(MeshError):
    """A field, the session or its number of fields would pass a limit (``limit_name``)."""

    REASON = "CONTEXT_TOO_LARGE"

    @property
    def limit_name(self) -> str:
        return self.metadata.get("limit_name", "")

    @property
    def limit(self) -> int:
        return _int(self.metadata.get("limit")) or 0

    @property
    def size(self) -> int:
        return _int(self.metadata.get("size")) or 0


class ContextTooManySessions(MeshError):
    """The tenant has as many live sessions as it may."""

    REASON = "CONTEXT_TOO_MANY_SESSIONS"


class ContextHistoryCompacted(MeshError):
    """A watch asked for changes no longer kept: read the session and watch from its version."""

    REASON = "CONTEXT_HISTORY_COMPACTED"


class ContextPolicyOverride(MeshError):
    """A write named another policy than the one an agent or capability policy declares for
    the field, and that policy allows no override."""

    REASON = "CONTEXT_POLICY_OVERRIDE"

    @property
    def field(self) -> str:
        return self.metadata.get("field", "")

    @property
    def declared_policy(self) -> str:
        return self.metadata.get("declared_policy", "")

    @property
    def requested_policy(self) -> str:
        return self.metadata.get("requested_policy", "")


class ContextWriterNotAllowed(PermissionDenied):
    """The tenant policy's ``session_writers`` rule (``rule``) covering ``field`` does not
    allow this writer, or the writer is not verified (``verified`` false: write with the
    agent's credential, e.g. through ``call.session()`` or the agent's client). Nothing
    was written."""

    REASON = "CONTEXT_WRITER_NOT_ALLOWED"

    @property
    def field(self) -> str:
        return self.metadata.get("field", "")

    @property
    def rule(self) -> str:
        return self.metadata.get("rule", "")

    @property
    def writer_agent(self) -> str:
        return self.metadata.get("writer_agent", "")

    @property
    def writer_instance(self) -> str:
        return self.metadata.get("writer_instance", "")

    @property
    def verified(self) -> bool:
        return self.metadata.get("verified") == "true"


class ContextWriterMismatch(PermissionDenied):
    """A write presented an agent credential but named another writer instance."""

    REASON = "CONTEXT_WRITER_MISMATCH"

    @property
    def writer_instance(self) -> str:
        return self.metadata.get("writer_instance", "")

    @property
    def credential_instance(self) -> str:
        return self.metadata.get("credential_instance", "")


_BY_REASON: dict[str, type[MeshError]] = {
    cls.REASON: cls
    for cls in (
        AgentNotFound,
        NoHealthyInstance,
        InvalidArgument,
        PayloadTooLarge,
        RateLimited,
        AgentOverloaded,
        CircuitOpen,
        DeadlineExceeded,
        ControlUnavailable,
        StoreUnavailable,
        InstanceNotFound,
        PolicyNotFound,
        LeaseNotFound,
        Conflict,
        InstanceUnreachable,
        SidecarUnreachable,
        PermissionDenied,
        NotAuthorized,
        AgentCredentialInvalid,
        ShuttingDown,
        IdempotentReplyNotStored,
        IdempotencyKeyReused,
        ContextFieldLocked,
        ContextConflict,
        ContextTooLarge,
        ContextTooManySessions,
        ContextHistoryCompacted,
        ContextPolicyOverride,
        ContextWriterNotAllowed,
        ContextWriterMismatch,
        Internal,
    )
    if cls.REASON is not None
}


def exception_for(reason: str) -> type[MeshError]:
    """The exception class for a reason string (``MeshError`` for unknown ones)."""
    return _BY_REASON.get(reason, MeshError)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


MetadataLike = Iterable[tuple[str, str | bytes]]


def _pairs(*groups: MetadataLike | None) -> dict[str, str | bytes]:
    out: dict[str, str | bytes] = {}
    for group in groups:
        for key, value in group or ():
            out.setdefault(key, value)
    return out


def from_status(
    code: grpc.StatusCode,
    message: str,
    metadata: Mapping[str, str | bytes],
) -> MeshError:
    """Builds the typed exception from a status code, message and the response metadata
    (initial and trailing, merged)."""
    reason: str | None = None
    info: dict[str, str] = {}
    retry_after: float | None = None
    violations: dict[str, str] = {}
    raw = metadata.get(_DETAILS_KEY)
    if isinstance(raw, bytes):
        status = status_pb2.Status()
        try:
            status.ParseFromString(raw)
        except Exception:  # a malformed trailer: keep what the code and message say
            status = status_pb2.Status()
        for any_detail in status.details:
            error_info = error_details_pb2.ErrorInfo()
            retry_info = error_details_pb2.RetryInfo()
            bad_request = error_details_pb2.BadRequest()
            if any_detail.Is(error_info.DESCRIPTOR) and any_detail.Unpack(error_info):
                reason = error_info.reason or reason
                info.update(error_info.metadata)
            elif any_detail.Is(retry_info.DESCRIPTOR) and any_detail.Unpack(retry_info):
                retry_after = retry_info.retry_delay.seconds + retry_info.retry_delay.nanos / 1e9
            elif any_detail.Is(bad_request.DESCRIPTOR) and any_detail.Unpack(bad_request):
                violations.update({v.field: v.description for v in bad_request.field_violations})
    if retry_after is None and "retry_after_ms" in info:
        ms = _int(info["retry_after_ms"])
        retry_after = ms / 1000 if ms is not None else None
    attempts = _int(_text(metadata.get("ar-attempts"))) or _int(info.get("attempts")) or 0
    tried_raw = _text(metadata.get("ar-instances-tried")) or info.get("instances_tried", "")
    tried = [t for t in tried_raw.split(",") if t]
    if reason:
        cls = exception_for(reason)
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        cls = DeadlineExceeded  # the caller's own deadline ran out before the mesh said why
    else:
        cls = MeshError
    return cls(
        message,
        code=code,
        reason=reason,
        metadata=info,
        attempts=attempts,
        instances_tried=tried,
        retry_after=retry_after,
        field_violations=violations,
    )


def _text(value: str | bytes | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def from_rpc_error(error: grpc.RpcError) -> MeshError:
    """The typed exception for a failed call of the synchronous ``grpc`` API (or an
    ``AioRpcError``)."""
    if isinstance(error, grpc.aio.AioRpcError):
        metadata = _pairs(error.trailing_metadata(), error.initial_metadata())
        return from_status(error.code(), error.details() or "", metadata)
    call = error if isinstance(error, grpc.Call) else None
    if call is None:
        return MeshError(str(error))
    metadata = _pairs(call.trailing_metadata(), call.initial_metadata())
    return from_status(call.code(), call.details() or "", metadata)


class HandlerError(Exception):
    """Raise from a handler to fail the call with a gRPC code the caller sees.

    Any other exception fails the call with ``INTERNAL``. ``InvalidArgument`` raised by a
    handler keeps its field::

        raise HandlerError(grpc.StatusCode.INVALID_ARGUMENT, "text must not be empty")
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def invalid_argument(cls, message: str) -> HandlerError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, message)

    @classmethod
    def unavailable(cls, message: str) -> HandlerError:
        return cls(grpc.StatusCode.UNAVAILABLE, message)
