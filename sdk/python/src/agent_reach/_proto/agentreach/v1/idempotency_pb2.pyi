from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClaimState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_STATE_UNSPECIFIED: _ClassVar[ClaimState]
    CLAIM_STATE_CLAIMED: _ClassVar[ClaimState]
    CLAIM_STATE_RUNNING: _ClassVar[ClaimState]
    CLAIM_STATE_DONE: _ClassVar[ClaimState]
    CLAIM_STATE_TOO_LARGE: _ClassVar[ClaimState]
    CLAIM_STATE_ABANDONED: _ClassVar[ClaimState]
    CLAIM_STATE_KEY_REUSED: _ClassVar[ClaimState]

class SettleOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTLE_OUTCOME_UNSPECIFIED: _ClassVar[SettleOutcome]
    SETTLE_OUTCOME_ANSWERED: _ClassVar[SettleOutcome]
    SETTLE_OUTCOME_TOO_LARGE: _ClassVar[SettleOutcome]
    SETTLE_OUTCOME_FAILED: _ClassVar[SettleOutcome]
    SETTLE_OUTCOME_ABANDONED: _ClassVar[SettleOutcome]
CLAIM_STATE_UNSPECIFIED: ClaimState
CLAIM_STATE_CLAIMED: ClaimState
CLAIM_STATE_RUNNING: ClaimState
CLAIM_STATE_DONE: ClaimState
CLAIM_STATE_TOO_LARGE: ClaimState
CLAIM_STATE_ABANDONED: ClaimState
CLAIM_STATE_KEY_REUSED: ClaimState
SETTLE_OUTCOME_UNSPECIFIED: SettleOutcome
SETTLE_OUTCOME_ANSWERED: SettleOutcome
SETTLE_OUTCOME_TOO_LARGE: SettleOutcome
SETTLE_OUTCOME_FAILED: SettleOutcome
SETTLE_OUTCOME_ABANDONED: SettleOutcome

class ClaimKeyRequest(_message.Message):
    __slots__ = ("tenant", "agent", "key", "lease_id", "window_ms", "instance_id", "payload_digest")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    agent: str
    key: str
    lease_id: int
    window_ms: int
    instance_id: str
    payload_digest: bytes
    def __init__(self, tenant: _Optional[str] = ..., agent: _Optional[str] = ..., key: _Optional[str] = ..., lease_id: _Optional[int] = ..., window_ms: _Optional[int] = ..., instance_id: _Optional[str] = ..., payload_digest: _Optional[bytes] = ...) -> None: ...

class ClaimKeyReply(_message.Message):
    __slots__ = ("state", "claim_revision", "reply", "owner_instance")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_REVISION_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    OWNER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    state: ClaimState
    claim_revision: int
    reply: StoredReply
    owner_instance: str
    def __init__(self, state: _Optional[_Union[ClaimState, str]] = ..., claim_revision: _Optional[int] = ..., reply: _Optional[_Union[StoredReply, _Mapping]] = ..., owner_instance: _Optional[str] = ...) -> None: ...

class StoredReply(_message.Message):
    __slots__ = ("headers", "data", "trailers")
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRAILERS_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.RepeatedCompositeFieldContainer[ReplyHeader]
    data: bytes
    trailers: _containers.RepeatedCompositeFieldContainer[ReplyHeader]
    def __init__(self, headers: _Optional[_Iterable[_Union[ReplyHeader, _Mapping]]] = ..., data: _Optional[bytes] = ..., trailers: _Optional[_Iterable[_Union[ReplyHeader, _Mapping]]] = ...) -> None: ...

class ReplyHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class SettleKeyRequest(_message.Message):
    __slots__ = ("tenant", "agent", "key", "claim_revision", "outcome", "reply", "window_ms", "instance_id", "payload_digest")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_REVISION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    agent: str
    key: str
    claim_revision: int
    outcome: SettleOutcome
    reply: StoredReply
    window_ms: int
    instance_id: str
    payload_digest: bytes
    def __init__(self, tenant: _Optional[str] = ..., agent: _Optional[str] = ..., key: _Optional[str] = ..., claim_revision: _Optional[int] = ..., outcome: _Optional[_Union[SettleOutcome, str]] = ..., reply: _Optional[_Union[StoredReply, _Mapping]] = ..., window_ms: _Optional[int] = ..., instance_id: _Optional[str] = ..., payload_digest: _Optional[bytes] = ...) -> None: ...

class SettleKeyReply(_message.Message):
    __slots__ = ("settled",)
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    settled: bool
    def __init__(self, settled: _Optional[bool] = ...) -> None: ...
