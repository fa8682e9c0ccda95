from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_UNSPECIFIED: _ClassVar[Transport]
    TRANSPORT_GRPC: _ClassVar[Transport]
    TRANSPORT_HTTP: _ClassVar[Transport]
    TRANSPORT_A2A: _ClassVar[Transport]

class HealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_STATE_UNSPECIFIED: _ClassVar[HealthState]
    HEALTH_STATE_STARTING: _ClassVar[HealthState]
    HEALTH_STATE_UP: _ClassVar[HealthState]
    HEALTH_STATE_DEGRADED: _ClassVar[HealthState]
    HEALTH_STATE_PAUSED: _ClassVar[HealthState]
    HEALTH_STATE_DOWN: _ClassVar[HealthState]
    HEALTH_STATE_UNKNOWN: _ClassVar[HealthState]

class HoldScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOLD_SCOPE_UNSPECIFIED: _ClassVar[HoldScope]
    HOLD_SCOPE_INSTANCE: _ClassVar[HoldScope]
    HOLD_SCOPE_AGENT: _ClassVar[HoldScope]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_HIGH: Priority
PRIORITY_NORMAL: Priority
PRIORITY_LOW: Priority
TRANSPORT_UNSPECIFIED: Transport
TRANSPORT_GRPC: Transport
TRANSPORT_HTTP: Transport
TRANSPORT_A2A: Transport
HEALTH_STATE_UNSPECIFIED: HealthState
HEALTH_STATE_STARTING: HealthState
HEALTH_STATE_UP: HealthState
HEALTH_STATE_DEGRADED: HealthState
HEALTH_STATE_PAUSED: HealthState
HEALTH_STATE_DOWN: HealthState
HEALTH_STATE_UNKNOWN: HealthState
HOLD_SCOPE_UNSPECIFIED: HoldScope
HOLD_SCOPE_INSTANCE: HoldScope
HOLD_SCOPE_AGENT: HoldScope

class Capability(_message.Message):
    __slots__ = ("name", "tags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentRegistration(_message.Message):
    __slots__ = ("agent", "version", "capabilities", "endpoint", "transport", "max_concurrency", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    agent: str
    version: str
    capabilities: _containers.RepeatedCompositeFieldContainer[Capability]
    endpoint: str
    transport: Transport
    max_concurrency: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, agent: _Optional[str] = ..., version: _Optional[str] = ..., capabilities: _Optional[_Iterable[_Union[Capability, _Mapping]]] = ..., endpoint: _Optional[str] = ..., transport: _Optional[_Union[Transport, str]] = ..., max_concurrency: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("in_flight", "queue_length", "load_ratio", "avg_latency_ms")
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LOAD_RATIO_FIELD_NUMBER: _ClassVar[int]
    AVG_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    queue_length: int
    load_ratio: float
    avg_latency_ms: int
    def __init__(self, in_flight: _Optional[int] = ..., queue_length: _Optional[int] = ..., load_ratio: _Optional[float] = ..., avg_latency_ms: _Optional[int] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("instance_id", "tenant", "registration", "sidecar_id", "sidecar_address", "state", "load", "revision", "registered_at_ms", "reported_state", "holds", "generation")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_ID_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    tenant: str
    registration: AgentRegistration
    sidecar_id: str
    sidecar_address: str
    state: HealthState
    load: Load
    revision: int
    registered_at_ms: int
    reported_state: HealthState
    holds: _containers.RepeatedCompositeFieldContainer[StateHold]
    generation: int
    def __init__(self, instance_id: _Optional[str] = ..., tenant: _Optional[str] = ..., registration: _Optional[_Union[AgentRegistration, _Mapping]] = ..., sidecar_id: _Optional[str] = ..., sidecar_address: _Optional[str] = ..., state: _Optional[_Union[HealthState, str]] = ..., load: _Optional[_Union[Load, _Mapping]] = ..., revision: _Optional[int] = ..., registered_at_ms: _Optional[int] = ..., reported_state: _Optional[_Union[HealthState, str]] = ..., holds: _Optional[_Iterable[_Union[StateHold, _Mapping]]] = ..., generation: _Optional[int] = ...) -> None: ...

class StateHold(_message.Message):
    __slots__ = ("state", "reason", "scope", "set_at_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SET_AT_MS_FIELD_NUMBER: _ClassVar[int]
    state: HealthState
    reason: str
    scope: HoldScope
    set_at_ms: int
    def __init__(self, state: _Optional[_Union[HealthState, str]] = ..., reason: _Optional[str] = ..., scope: _Optional[_Union[HoldScope, str]] = ..., set_at_ms: _Optional[int] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("agent", "capability", "tags")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    capability: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent: _Optional[str] = ..., capability: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class Caller(_message.Message):
    __slots__ = ("agent", "instance_id")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    agent: str
    instance_id: str
    def __init__(self, agent: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...
