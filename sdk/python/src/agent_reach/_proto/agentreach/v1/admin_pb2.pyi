from agent_reach._proto.agentreach.v1 import common_pb2 as _common_pb2
from agent_reach._proto.agentreach.v1 import policy_pb2 as _policy_pb2
from agent_reach._proto.agentreach.v1 import session_pb2 as _session_pb2
from agent_reach._proto.agentreach.v1 import sidecar_pb2 as _sidecar_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperatorRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATOR_ROLE_UNSPECIFIED: _ClassVar[OperatorRole]
    OPERATOR_ROLE_VIEWER: _ClassVar[OperatorRole]
    OPERATOR_ROLE_OPERATOR: _ClassVar[OperatorRole]
    OPERATOR_ROLE_ADMIN: _ClassVar[OperatorRole]
OPERATOR_ROLE_UNSPECIFIED: OperatorRole
OPERATOR_ROLE_VIEWER: OperatorRole
OPERATOR_ROLE_OPERATOR: OperatorRole
OPERATOR_ROLE_ADMIN: OperatorRole

class InstanceFilter(_message.Message):
    __slots__ = ("agent", "capability", "tags", "states")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    agent: str
    capability: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.HealthState]
    def __init__(self, agent: _Optional[str] = ..., capability: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., states: _Optional[_Iterable[_Union[_common_pb2.HealthState, str]]] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("tenant", "filter")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    filter: InstanceFilter
    def __init__(self, tenant: _Optional[str] = ..., filter: _Optional[_Union[InstanceFilter, _Mapping]] = ...) -> None: ...

class ListInstancesReply(_message.Message):
    __slots__ = ("instances", "revision")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    revision: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetInstanceRequest(_message.Message):
    __slots__ = ("tenant", "instance_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    instance_id: str
    def __init__(self, tenant: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class GetInstanceReply(_message.Message):
    __slots__ = ("instance", "revision")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    instance: _common_pb2.Instance
    revision: int
    def __init__(self, instance: _Optional[_Union[_common_pb2.Instance, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class AgentSummary(_message.Message):
    __slots__ = ("agent", "versions", "capabilities", "instances", "instances_by_state", "hold")
    class InstancesByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    AGENT_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    agent: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.RepeatedCompositeFieldContainer[_common_pb2.Capability]
    instances: int
    instances_by_state: _containers.ScalarMap[str, int]
    hold: _common_pb2.StateHold
    def __init__(self, agent: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Iterable[_Union[_common_pb2.Capability, _Mapping]]] = ..., instances: _Optional[int] = ..., instances_by_state: _Optional[_Mapping[str, int]] = ..., hold: _Optional[_Union[_common_pb2.StateHold, _Mapping]] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ("tenant", "filter")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    filter: InstanceFilter
    def __init__(self, tenant: _Optional[str] = ..., filter: _Optional[_Union[InstanceFilter, _Mapping]] = ...) -> None: ...

class ListAgentsReply(_message.Message):
    __slots__ = ("agents", "revision")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSummary]
    revision: int
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentSummary, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ("tenant", "agent")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    agent: str
    def __init__(self, tenant: _Optional[str] = ..., agent: _Optional[str] = ...) -> None: ...

class GetAgentReply(_message.Message):
    __slots__ = ("agent", "instances", "revision")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    agent: AgentSummary
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    revision: int
    def __init__(self, agent: _Optional[_Union[AgentSummary, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class SetInstanceStateRequest(_message.Message):
    __slots__ = ("tenant", "instance_id", "state", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    instance_id: str
    state: _common_pb2.HealthState
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., instance_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetAgentStateRequest(_message.Message):
    __slots__ = ("tenant", "agent", "state", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    agent: str
    state: _common_pb2.HealthState
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., agent: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.HealthState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetStateReply(_message.Message):
    __slots__ = ("instances", "revision")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.Instance]
    revision: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_common_pb2.Instance, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class PutPolicyRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: _policy_pb2.Policy
    def __init__(self, policy: _Optional[_Union[_policy_pb2.Policy, _Mapping]] = ...) -> None: ...

class PutPolicyReply(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: _policy_pb2.Policy
    def __init__(self, policy: _Optional[_Union[_policy_pb2.Policy, _Mapping]] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("tenant", "kind", "name")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    kind: _policy_pb2.PolicyKind
    name: str
    def __init__(self, tenant: _Optional[str] = ..., kind: _Optional[_Union[_policy_pb2.PolicyKind, str]] = ..., name: _Optional[str] = ...) -> None: ...

class GetPolicyReply(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: _policy_pb2.Policy
    def __init__(self, policy: _Optional[_Union[_policy_pb2.Policy, _Mapping]] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ("tenant", "kind")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    kind: _policy_pb2.PolicyKind
    def __init__(self, tenant: _Optional[str] = ..., kind: _Optional[_Union[_policy_pb2.PolicyKind, str]] = ...) -> None: ...

class ListPoliciesReply(_message.Message):
    __slots__ = ("policies", "revision")
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[_policy_pb2.Policy]
    revision: int
    def __init__(self, policies: _Optional[_Iterable[_Union[_policy_pb2.Policy, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class DeletePolicyRequest(_message.Message):
    __slots__ = ("tenant", "kind", "name")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    kind: _policy_pb2.PolicyKind
    name: str
    def __init__(self, tenant: _Optional[str] = ..., kind: _Optional[_Union[_policy_pb2.PolicyKind, str]] = ..., name: _Optional[str] = ...) -> None: ...

class DeletePolicyReply(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "description", "created_at_ms", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    created_at_ms: int
    revision: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class PutTenantRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class PutTenantReply(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTenantsReply(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ...) -> None: ...

class ExplainRouteRequest(_message.Message):
    __slots__ = ("tenant", "target", "max_candidates", "priority", "session_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: _common_pb2.Target
    max_candidates: int
    priority: _common_pb2.Priority
    session_id: str
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., max_candidates: _Optional[int] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., session_id: _Optional[str] = ...) -> None: ...

class ExplainRouteReply(_message.Message):
    __slots__ = ("candidates", "skipped", "revision", "strategy")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[_sidecar_pb2.RouteCandidate]
    skipped: _containers.RepeatedCompositeFieldContainer[_sidecar_pb2.SkippedInstance]
    revision: int
    strategy: str
    def __init__(self, candidates: _Optional[_Iterable[_Union[_sidecar_pb2.RouteCandidate, _Mapping]]] = ..., skipped: _Optional[_Iterable[_Union[_sidecar_pb2.SkippedInstance, _Mapping]]] = ..., revision: _Optional[int] = ..., strategy: _Optional[str] = ...) -> None: ...

class JoinToken(_message.Message):
    __slots__ = ("id", "tenant", "created_unix_ms", "expires_unix_ms", "single_use", "used_by", "revoked_unix_ms", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SINGLE_USE_FIELD_NUMBER: _ClassVar[int]
    USED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    created_unix_ms: int
    expires_unix_ms: int
    single_use: bool
    used_by: str
    revoked_unix_ms: int
    description: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., single_use: _Optional[bool] = ..., used_by: _Optional[str] = ..., revoked_unix_ms: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateJoinTokenRequest(_message.Message):
    __slots__ = ("tenant", "ttl_ms", "single_use", "description")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SINGLE_USE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    ttl_ms: int
    single_use: bool
    description: str
    def __init__(self, tenant: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., single_use: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class CreateJoinTokenReply(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: JoinToken
    secret: str
    def __init__(self, token: _Optional[_Union[JoinToken, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListJoinTokensRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListJoinTokensReply(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[JoinToken]
    def __init__(self, tokens: _Optional[_Iterable[_Union[JoinToken, _Mapping]]] = ...) -> None: ...

class RevokeJoinTokenRequest(_message.Message):
    __slots__ = ("tenant", "id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    id: str
    def __init__(self, tenant: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class RevokeJoinTokenReply(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: JoinToken
    def __init__(self, token: _Optional[_Union[JoinToken, _Mapping]] = ...) -> None: ...

class OperatorToken(_message.Message):
    __slots__ = ("id", "role", "tenants", "created_unix_ms", "expires_unix_ms", "revoked_unix_ms", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: OperatorRole
    tenants: _containers.RepeatedScalarFieldContainer[str]
    created_unix_ms: int
    expires_unix_ms: int
    revoked_unix_ms: int
    description: str
    def __init__(self, id: _Optional[str] = ..., role: _Optional[_Union[OperatorRole, str]] = ..., tenants: _Optional[_Iterable[str]] = ..., created_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., revoked_unix_ms: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateOperatorTokenRequest(_message.Message):
    __slots__ = ("role", "tenants", "ttl_ms", "description")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    role: OperatorRole
    tenants: _containers.RepeatedScalarFieldContainer[str]
    ttl_ms: int
    description: str
    def __init__(self, role: _Optional[_Union[OperatorRole, str]] = ..., tenants: _Optional[_Iterable[str]] = ..., ttl_ms: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateOperatorTokenReply(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: OperatorToken
    secret: str
    def __init__(self, token: _Optional[_Union[OperatorToken, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListOperatorTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListOperatorTokensReply(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[OperatorToken]
    def __init__(self, tokens: _Optional[_Iterable[_Union[OperatorToken, _Mapping]]] = ...) -> None: ...

class RevokeOperatorTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeOperatorTokenReply(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: OperatorToken
    def __init__(self, token: _Optional[_Union[OperatorToken, _Mapping]] = ...) -> None: ...
