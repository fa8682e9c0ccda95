from agent_reach._proto.agentreach.v1 import common_pb2 as _common_pb2
from agent_reach._proto.agentreach.v1 import agent_pb2 as _agent_pb2
from agent_reach._proto.agentreach.v1 import session_pb2 as _session_pb2
from agent_reach._proto.agentreach.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("registration", "instance_id", "state")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    registration: _common_pb2.AgentRegistration
    instance_id: str
    state: _common_pb2.HealthState
    def __init__(self, registration: _Optional[_Union[_common_pb2.AgentRegistration, _Mapping]] = ..., instance_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("instance_id", "heartbeat_interval_ms", "lease_ttl_ms", "tenant", "credential")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    tenant: str
    credential: str
    def __init__(self, instance_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., tenant: _Optional[str] = ..., credential: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("instance_id", "state", "load")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    state: _common_pb2.HealthState
    load: _common_pb2.Load
    def __init__(self, instance_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ..., load: _Optional[_Union[_common_pb2.Load, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class DeregisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("target", "session_id", "priority", "max_candidates")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    target: _common_pb2.Target
    session_id: str
    priority: _common_pb2.Priority
    max_candidates: int
    def __init__(self, target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., session_id: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., max_candidates: _Optional[int] = ...) -> None: ...

class RouteCandidate(_message.Message):
    __slots__ = ("instance", "score", "note")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.Instance
    score: float
    note: str
    def __init__(self, instance: _Optional[_Union[_common_pb2.Instance, _Mapping]] = ..., score: _Optional[float] = ..., note: _Optional[str] = ...) -> None: ...

class SkippedInstance(_message.Message):
    __slots__ = ("instance_id", "agent", "reason", "detail")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    agent: str
    reason: str
    detail: str
    def __init__(self, instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RouteReply(_message.Message):
    __slots__ = ("candidates", "skipped", "table_revision", "strategy", "table_stale", "table_age_ms")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    TABLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TABLE_STALE_FIELD_NUMBER: _ClassVar[int]
    TABLE_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[RouteCandidate]
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedInstance]
    table_revision: int
    strategy: str
    table_stale: bool
    table_age_ms: int
    def __init__(self, candidates: _Optional[_Iterable[_Union[RouteCandidate, _Mapping]]] = ..., skipped: _Optional[_Iterable[_Union[SkippedInstance, _Mapping]]] = ..., table_revision: _Optional[int] = ..., strategy: _Optional[str] = ..., table_stale: _Optional[bool] = ..., table_age_ms: _Optional[int] = ...) -> None: ...

class InvokeRequest(_message.Message):
    __slots__ = ("target", "payload", "content_type", "session_id", "priority", "idempotency_key", "metadata", "message_id", "caller")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    target: _common_pb2.Target
    payload: bytes
    content_type: str
    session_id: str
    priority: _common_pb2.Priority
    idempotency_key: str
    metadata: _containers.ScalarMap[str, str]
    message_id: str
    caller: _common_pb2.Caller
    def __init__(self, target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., session_id: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., message_id: _Optional[str] = ..., caller: _Optional[_Union[_common_pb2.Caller, _Mapping]] = ...) -> None: ...

class InvokeReply(_message.Message):
    __slots__ = ("payload", "content_type", "metadata", "instance_id", "agent", "agent_version", "attempts", "fallback_from")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FROM_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    content_type: str
    metadata: _containers.ScalarMap[str, str]
    instance_id: str
    agent: str
    agent_version: str
    attempts: int
    fallback_from: str
    def __init__(self, payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., agent_version: _Optional[str] = ..., attempts: _Optional[int] = ..., fallback_from: _Optional[str] = ...) -> None: ...
