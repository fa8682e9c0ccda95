from agent_reach._proto.agentreach.v1 import session_pb2 as _session_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_KIND_UNSPECIFIED: _ClassVar[PolicyKind]
    POLICY_KIND_CAPABILITY: _ClassVar[PolicyKind]
    POLICY_KIND_AGENT: _ClassVar[PolicyKind]
    POLICY_KIND_TENANT: _ClassVar[PolicyKind]

class Strategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STRATEGY_UNSPECIFIED: _ClassVar[Strategy]
    STRATEGY_LEAST_LOADED: _ClassVar[Strategy]
    STRATEGY_ROUND_ROBIN: _ClassVar[Strategy]
    STRATEGY_RANDOM: _ClassVar[Strategy]
    STRATEGY_WEIGHTED: _ClassVar[Strategy]
    STRATEGY_CONSISTENT_HASH: _ClassVar[Strategy]
POLICY_KIND_UNSPECIFIED: PolicyKind
POLICY_KIND_CAPABILITY: PolicyKind
POLICY_KIND_AGENT: PolicyKind
POLICY_KIND_TENANT: PolicyKind
STRATEGY_UNSPECIFIED: Strategy
STRATEGY_LEAST_LOADED: Strategy
STRATEGY_ROUND_ROBIN: Strategy
STRATEGY_RANDOM: Strategy
STRATEGY_WEIGHTED: Strategy
STRATEGY_CONSISTENT_HASH: Strategy

class RateLimit(_message.Message):
    __slots__ = ("per_second", "burst")
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    per_second: float
    burst: int
    def __init__(self, per_second: _Optional[float] = ..., burst: _Optional[int] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("idempotent", "budget_ratio", "budget_min_per_second", "max_payload_bytes")
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_RATIO_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MIN_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    idempotent: bool
    budget_ratio: float
    budget_min_per_second: int
    max_payload_bytes: int
    def __init__(self, idempotent: _Optional[bool] = ..., budget_ratio: _Optional[float] = ..., budget_min_per_second: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ...) -> None: ...

class Fallback(_message.Message):
    __slots__ = ("capability", "agent")
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    capability: str
    agent: str
    def __init__(self, capability: _Optional[str] = ..., agent: _Optional[str] = ...) -> None: ...

class CircuitBreaker(_message.Message):
    __slots__ = ("consecutive_failures", "failure_rate", "window_ms", "min_requests", "open_ms", "max_open_ms", "half_open_probes")
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OPEN_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_OPEN_MS_FIELD_NUMBER: _ClassVar[int]
    HALF_OPEN_PROBES_FIELD_NUMBER: _ClassVar[int]
    consecutive_failures: int
    failure_rate: float
    window_ms: int
    min_requests: int
    open_ms: int
    max_open_ms: int
    half_open_probes: int
    def __init__(self, consecutive_failures: _Optional[int] = ..., failure_rate: _Optional[float] = ..., window_ms: _Optional[int] = ..., min_requests: _Optional[int] = ..., open_ms: _Optional[int] = ..., max_open_ms: _Optional[int] = ..., half_open_probes: _Optional[int] = ...) -> None: ...

class VersionWeight(_message.Message):
    __slots__ = ("version", "percent")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    version: str
    percent: int
    def __init__(self, version: _Optional[str] = ..., percent: _Optional[int] = ...) -> None: ...

class VersionSplit(_message.Message):
    __slots__ = ("weights", "match_key", "match_value", "match_version")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MATCH_KEY_FIELD_NUMBER: _ClassVar[int]
    MATCH_VALUE_FIELD_NUMBER: _ClassVar[int]
    MATCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.RepeatedCompositeFieldContainer[VersionWeight]
    match_key: str
    match_value: str
    match_version: str
    def __init__(self, weights: _Optional[_Iterable[_Union[VersionWeight, _Mapping]]] = ..., match_key: _Optional[str] = ..., match_value: _Optional[str] = ..., match_version: _Optional[str] = ...) -> None: ...

class Admission(_message.Message):
    __slots__ = ("normal_percent", "low_percent", "queue_length", "queue_timeout_ms")
    NORMAL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LOW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    normal_percent: int
    low_percent: int
    queue_length: int
    queue_timeout_ms: int
    def __init__(self, normal_percent: _Optional[int] = ..., low_percent: _Optional[int] = ..., queue_length: _Optional[int] = ..., queue_timeout_ms: _Optional[int] = ...) -> None: ...

class Authorization(_message.Message):
    __slots__ = ("allowed_agents", "allow_anonymous", "allowed_tenants")
    ALLOWED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ANONYMOUS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TENANTS_FIELD_NUMBER: _ClassVar[int]
    allowed_agents: _containers.RepeatedScalarFieldContainer[str]
    allow_anonymous: bool
    allowed_tenants: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allowed_agents: _Optional[_Iterable[str]] = ..., allow_anonymous: _Optional[bool] = ..., allowed_tenants: _Optional[_Iterable[str]] = ...) -> None: ...

class PolicySpec(_message.Message):
    __slots__ = ("strategy", "hash_key", "weights", "default_timeout_ms", "retry", "fallback", "rate_limit", "breaker", "split", "read_only", "cache_ttl_ms", "admission", "authorization", "session", "session_writers", "egress", "alerts")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SessionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _session_pb2.SessionFieldRule
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_session_pb2.SessionFieldRule, _Mapping]] = ...) -> None: ...
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    HASH_KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    CACHE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_WRITERS_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    strategy: Strategy
    hash_key: str
    weights: _containers.ScalarMap[str, int]
    default_timeout_ms: int
    retry: RetryPolicy
    fallback: Fallback
    rate_limit: RateLimit
    breaker: CircuitBreaker
    split: VersionSplit
    read_only: bool
    cache_ttl_ms: int
    admission: Admission
    authorization: Authorization
    session: _containers.MessageMap[str, _session_pb2.SessionFieldRule]
    session_writers: _containers.RepeatedCompositeFieldContainer[_session_pb2.SessionWriters]
    egress: _containers.RepeatedScalarFieldContainer[str]
    alerts: AlertThresholds
    def __init__(self, strategy: _Optional[_Union[Strategy, str]] = ..., hash_key: _Optional[str] = ..., weights: _Optional[_Mapping[str, int]] = ..., default_timeout_ms: _Optional[int] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., fallback: _Optional[_Union[Fallback, _Mapping]] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., breaker: _Optional[_Union[CircuitBreaker, _Mapping]] = ..., split: _Optional[_Union[VersionSplit, _Mapping]] = ..., read_only: _Optional[bool] = ..., cache_ttl_ms: _Optional[int] = ..., admission: _Optional[_Union[Admission, _Mapping]] = ..., authorization: _Optional[_Union[Authorization, _Mapping]] = ..., session: _Optional[_Mapping[str, _session_pb2.SessionFieldRule]] = ..., session_writers: _Optional[_Iterable[_Union[_session_pb2.SessionWriters, _Mapping]]] = ..., egress: _Optional[_Iterable[str]] = ..., alerts: _Optional[_Union[AlertThresholds, _Mapping]] = ...) -> None: ...

class AlertThresholds(_message.Message):
    __slots__ = ("min_healthy", "lost_count", "lost_window_ms", "fallback_calls", "breakers_open_percent")
    MIN_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    LOST_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOST_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CALLS_FIELD_NUMBER: _ClassVar[int]
    BREAKERS_OPEN_PERCENT_FIELD_NUMBER: _ClassVar[int]
    min_healthy: int
    lost_count: int
    lost_window_ms: int
    fallback_calls: int
    breakers_open_percent: int
    def __init__(self, min_healthy: _Optional[int] = ..., lost_count: _Optional[int] = ..., lost_window_ms: _Optional[int] = ..., fallback_calls: _Optional[int] = ..., breakers_open_percent: _Optional[int] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("tenant", "kind", "name", "spec", "revision", "description")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    kind: PolicyKind
    name: str
    spec: PolicySpec
    revision: int
    description: str
    def __init__(self, tenant: _Optional[str] = ..., kind: _Optional[_Union[PolicyKind, str]] = ..., name: _Optional[str] = ..., spec: _Optional[_Union[PolicySpec, _Mapping]] = ..., revision: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...
