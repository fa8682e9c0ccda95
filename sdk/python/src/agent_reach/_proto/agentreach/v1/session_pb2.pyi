from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WritePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_POLICY_UNSPECIFIED: _ClassVar[WritePolicy]
    WRITE_POLICY_FIRST_WRITER: _ClassVar[WritePolicy]
    WRITE_POLICY_LAST_WRITER: _ClassVar[WritePolicy]
    WRITE_POLICY_COMPARE_AND_SET: _ClassVar[WritePolicy]
WRITE_POLICY_UNSPECIFIED: WritePolicy
WRITE_POLICY_FIRST_WRITER: WritePolicy
WRITE_POLICY_LAST_WRITER: WritePolicy
WRITE_POLICY_COMPARE_AND_SET: WritePolicy

class SessionFieldRule(_message.Message):
    __slots__ = ("policy", "allow_override")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    policy: WritePolicy
    allow_override: bool
    def __init__(self, policy: _Optional[_Union[WritePolicy, str]] = ..., allow_override: _Optional[bool] = ...) -> None: ...

class SessionWriters(_message.Message):
    __slots__ = ("fields", "agents", "capabilities")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    fields: str
    agents: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fields: _Optional[str] = ..., agents: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionField(_message.Message):
    __slots__ = ("name", "value", "content_type", "version", "writer_agent", "writer_instance", "written_at_ms", "locked")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITER_AGENT_FIELD_NUMBER: _ClassVar[int]
    WRITER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    content_type: str
    version: int
    writer_agent: str
    writer_instance: str
    written_at_ms: int
    locked: bool
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ..., content_type: _Optional[str] = ..., version: _Optional[int] = ..., writer_agent: _Optional[str] = ..., writer_instance: _Optional[str] = ..., written_at_ms: _Optional[int] = ..., locked: _Optional[bool] = ...) -> None: ...

class DeliveredSession(_message.Message):
    __slots__ = ("session_id", "version", "fields")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    version: int
    fields: _containers.RepeatedCompositeFieldContainer[SessionField]
    def __init__(self, session_id: _Optional[str] = ..., version: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[SessionField, _Mapping]]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("tenant", "session_id", "fields", "min_version")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    min_version: int
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., min_version: _Optional[int] = ...) -> None: ...

class GetSessionReply(_message.Message):
    __slots__ = ("found", "version", "fields", "cached")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    version: int
    fields: _containers.RepeatedCompositeFieldContainer[SessionField]
    cached: bool
    def __init__(self, found: _Optional[bool] = ..., version: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[SessionField, _Mapping]]] = ..., cached: _Optional[bool] = ...) -> None: ...

class SessionFieldWrite(_message.Message):
    __slots__ = ("name", "value", "content_type", "policy", "expected_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    content_type: str
    policy: WritePolicy
    expected_version: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ..., content_type: _Optional[str] = ..., policy: _Optional[_Union[WritePolicy, str]] = ..., expected_version: _Optional[int] = ...) -> None: ...

class PutSessionRequest(_message.Message):
    __slots__ = ("tenant", "session_id", "fields", "writer_agent", "writer_instance", "writer_verified")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    WRITER_AGENT_FIELD_NUMBER: _ClassVar[int]
    WRITER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    WRITER_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    fields: _containers.RepeatedCompositeFieldContainer[SessionFieldWrite]
    writer_agent: str
    writer_instance: str
    writer_verified: bool
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[SessionFieldWrite, _Mapping]]] = ..., writer_agent: _Optional[str] = ..., writer_instance: _Optional[str] = ..., writer_verified: _Optional[bool] = ...) -> None: ...

class PutSessionReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("tenant", "session_id", "fields", "writer_instance", "writer_agent", "writer_verified")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    WRITER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    WRITER_AGENT_FIELD_NUMBER: _ClassVar[int]
    WRITER_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    writer_instance: str
    writer_agent: str
    writer_verified: bool
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., writer_instance: _Optional[str] = ..., writer_agent: _Optional[str] = ..., writer_verified: _Optional[bool] = ...) -> None: ...

class DeleteSessionReply(_message.Message):
    __slots__ = ("deleted", "version")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    version: int
    def __init__(self, deleted: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

class WatchSessionRequest(_message.Message):
    __slots__ = ("tenant", "session_id", "after_version")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    after_version: int
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., after_version: _Optional[int] = ...) -> None: ...

class SessionChange(_message.Message):
    __slots__ = ("version", "put", "removed", "ended")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    version: int
    put: _containers.RepeatedCompositeFieldContainer[SessionField]
    removed: _containers.RepeatedScalarFieldContainer[str]
    ended: bool
    def __init__(self, version: _Optional[int] = ..., put: _Optional[_Iterable[_Union[SessionField, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ..., ended: _Optional[bool] = ...) -> None: ...
