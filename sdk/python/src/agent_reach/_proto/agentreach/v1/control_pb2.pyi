from agent_reach._proto.agentreach.v1 import common_pb2 as _common_pb2
from agent_reach._proto.agentreach.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SidecarIdentity(_message.Message):
    __slots__ = ("sidecar_id", "mesh_address")
    SIDECAR_ID_FIELD_NUMBER: _ClassVar[int]
    MESH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    sidecar_id: str
    mesh_address: str
    def __init__(self, sidecar_id: _Optional[str] = ..., mesh_address: _Optional[str] = ...) -> None: ...

class ControlRegisterRequest(_message.Message):
    __slots__ = ("tenant", "sidecar", "instance_id", "registration", "state", "lease_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sidecar: SidecarIdentity
    instance_id: str
    registration: _common_pb2.AgentRegistration
    state: _common_pb2.HealthState
    lease_id: int
    def __init__(self, tenant: _Optional[str] = ..., sidecar: _Optional[_Union[SidecarIdentity, _Mapping]] = ..., instance_id: _Optional[str] = ..., registration: _Optional[_Union[_common_pb2.AgentRegistration, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class ControlRegisterReply(_message.Message):
    __slots__ = ("lease_id", "lease_ttl_ms", "revision", "generation")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    lease_ttl_ms: int
    revision: int
    generation: int
    def __init__(self, lease_id: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., revision: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class InstanceHeartbeat(_message.Message):
    __slots__ = ("instance_id", "agent", "lease_id", "state", "load")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    agent: str
    lease_id: int
    state: _common_pb2.HealthState
    load: _common_pb2.Load
    def __init__(self, instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., lease_id: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ..., load: _Optional[_Union[_common_pb2.Load, _Mapping]] = ...) -> None: ...

class ControlHeartbeatRequest(_message.Message):
    __slots__ = ("tenant", "sidecar", "instances", "lease_id", "report")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sidecar: SidecarIdentity
    instances: _containers.RepeatedCompositeFieldContainer[InstanceHeartbeat]
    lease_id: int
    report: SidecarReport
    def __init__(self, tenant: _Optional[str] = ..., sidecar: _Optional[_Union[SidecarIdentity, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[InstanceHeartbeat, _Mapping]]] = ..., lease_id: _Optional[int] = ..., report: _Optional[_Union[SidecarReport, _Mapping]] = ...) -> None: ...

class SidecarReport(_message.Message):
    __slots__ = ("window_ms", "edges", "open_breakers", "instances", "spans", "received_at_ms", "sidecar_id", "latency_bucket_bounds_ms", "interval_ms")
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    OPEN_BREAKERS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_ID_FIELD_NUMBER: _ClassVar[int]
    LATENCY_BUCKET_BOUNDS_MS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    window_ms: int
    edges: _containers.RepeatedCompositeFieldContainer[EdgeReport]
    open_breakers: _containers.RepeatedScalarFieldContainer[str]
    instances: _containers.RepeatedCompositeFieldContainer[LocalInstanceReport]
    spans: _containers.RepeatedCompositeFieldContainer[SpanSummary]
    received_at_ms: int
    sidecar_id: str
    latency_bucket_bounds_ms: _containers.RepeatedScalarFieldContainer[float]
    interval_ms: int
    def __init__(self, window_ms: _Optional[int] = ..., edges: _Optional[_Iterable[_Union[EdgeReport, _Mapping]]] = ..., open_breakers: _Optional[_Iterable[str]] = ..., instances: _Optional[_Iterable[_Union[LocalInstanceReport, _Mapping]]] = ..., spans: _Optional[_Iterable[_Union[SpanSummary, _Mapping]]] = ..., received_at_ms: _Optional[int] = ..., sidecar_id: _Optional[str] = ..., latency_bucket_bounds_ms: _Optional[_Iterable[float]] = ..., interval_ms: _Optional[int] = ...) -> None: ...

class EdgeReport(_message.Message):
    __slots__ = ("caller", "target", "agent", "calls", "errors", "fallback_calls", "latency_buckets")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CALLS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    caller: str
    target: str
    agent: str
    calls: int
    errors: int
    fallback_calls: int
    latency_buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, caller: _Optional[str] = ..., target: _Optional[str] = ..., agent: _Optional[str] = ..., calls: _Optional[int] = ..., errors: _Optional[int] = ..., fallback_calls: _Optional[int] = ..., latency_buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class LocalInstanceReport(_message.Message):
    __slots__ = ("instance_id", "agent", "last_heartbeat_age_ms")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    agent: str
    last_heartbeat_age_ms: int
    def __init__(self, instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., last_heartbeat_age_ms: _Optional[int] = ...) -> None: ...

class SpanSummary(_message.Message):
    __slots__ = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_unix_us", "duration_us", "status", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_US_FIELD_NUMBER: _ClassVar[int]
    DURATION_US_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_unix_us: int
    duration_us: int
    status: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, trace_id: _Optional[str] = ..., span_id: _Optional[str] = ..., parent_span_id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., start_unix_us: _Optional[int] = ..., duration_us: _Optional[int] = ..., status: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ControlHeartbeatReply(_message.Message):
    __slots__ = ("expired_instance_ids", "replaced_instance_ids", "lease_expired")
    EXPIRED_INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    expired_instance_ids: _containers.RepeatedScalarFieldContainer[str]
    replaced_instance_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_expired: bool
    def __init__(self, expired_instance_ids: _Optional[_Iterable[str]] = ..., replaced_instance_ids: _Optional[_Iterable[str]] = ..., lease_expired: _Optional[bool] = ...) -> None: ...

class ControlDeregisterRequest(_message.Message):
    __slots__ = ("tenant", "instance_id", "agent", "lease_id", "expected_lease_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    instance_id: str
    agent: str
    lease_id: int
    expected_lease_id: int
    def __init__(self, tenant: _Optional[str] = ..., instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., lease_id: _Optional[int] = ..., expected_lease_id: _Optional[int] = ...) -> None: ...

class ControlDeregisterReply(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("tenant", "sidecar", "from_revision")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_FIELD_NUMBER: _ClassVar[int]
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sidecar: SidecarIdentity
    from_revision: int
    def __init__(self, tenant: _Optional[str] = ..., sidecar: _Optional[_Union[SidecarIdentity, _Mapping]] = ..., from_revision: _Optional[int] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("revision", "instances", "resync", "policies", "more")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    resync: bool
    policies: _containers.RepeatedCompositeFieldContainer[_policy_pb2.Policy]
    more: bool
    def __init__(self, revision: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., resync: _Optional[bool] = ..., policies: _Optional[_Iterable[_Union[_policy_pb2.Policy, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class PolicyRef(_message.Message):
    __slots__ = ("kind", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: _policy_pb2.PolicyKind
    name: str
    def __init__(self, kind: _Optional[_Union[_policy_pb2.PolicyKind, str]] = ..., name: _Optional[str] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("revision", "upserted", "removed_instance_ids", "upserted_policies", "removed_policies", "prev_revision")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_POLICIES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_POLICIES_FIELD_NUMBER: _ClassVar[int]
    PREV_REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    upserted: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    removed_instance_ids: _containers.RepeatedScalarFieldContainer[str]
    upserted_policies: _containers.RepeatedCompositeFieldContainer[_policy_pb2.Policy]
    removed_policies: _containers.RepeatedCompositeFieldContainer[PolicyRef]
    prev_revision: int
    def __init__(self, revision: _Optional[int] = ..., upserted: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., removed_instance_ids: _Optional[_Iterable[str]] = ..., upserted_policies: _Optional[_Iterable[_Union[_policy_pb2.Policy, _Mapping]]] = ..., removed_policies: _Optional[_Iterable[_Union[PolicyRef, _Mapping]]] = ..., prev_revision: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("snapshot", "delta")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    delta: Delta
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ...) -> None: ...

class LookupGrantedRequest(_message.Message):
    __slots__ = ("tenant", "sidecar", "target_tenant", "capability")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_FIELD_NUMBER: _ClassVar[int]
    TARGET_TENANT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sidecar: SidecarIdentity
    target_tenant: str
    capability: str
    def __init__(self, tenant: _Optional[str] = ..., sidecar: _Optional[_Union[SidecarIdentity, _Mapping]] = ..., target_tenant: _Optional[str] = ..., capability: _Optional[str] = ...) -> None: ...

class LookupGrantedReply(_message.Message):
    __slots__ = ("instances", "revision")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    revision: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...
