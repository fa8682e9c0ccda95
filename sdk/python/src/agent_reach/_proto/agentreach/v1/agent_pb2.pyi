from agent_reach._proto.agentreach.v1 import common_pb2 as _common_pb2
from agent_reach._proto.agentreach.v1 import session_pb2 as _session_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandleRequest(_message.Message):
    __slots__ = ("target", "payload", "content_type", "session_id", "priority", "idempotency_key", "metadata", "message_id", "caller", "instance_id", "attempt", "capability", "tenant", "session")
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
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    target: _common_pb2.Target
    payload: bytes
    content_type: str
    session_id: str
    priority: _common_pb2.Priority
    idempotency_key: str
    metadata: _containers.ScalarMap[str, str]
    message_id: str
    caller: _common_pb2.Caller
    instance_id: str
    attempt: int
    capability: str
    tenant: str
    session: _session_pb2.DeliveredSession
    def __init__(self, target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., session_id: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., message_id: _Optional[str] = ..., caller: _Optional[_Union[_common_pb2.Caller, _Mapping]] = ..., instance_id: _Optional[str] = ..., attempt: _Optional[int] = ..., capability: _Optional[str] = ..., tenant: _Optional[str] = ..., session: _Optional[_Union[_session_pb2.DeliveredSession, _Mapping]] = ...) -> None: ...

class HandleReply(_message.Message):
    __slots__ = ("payload", "content_type", "metadata")
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
    payload: bytes
    content_type: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("payload", "content_type", "metadata")
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
    payload: bytes
    content_type: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...
