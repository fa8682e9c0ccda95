from agent_reach._proto.agentreach.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_SUBMITTED: _ClassVar[TaskState]
    TASK_STATE_WORKING: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELED: _ClassVar[TaskState]
    TASK_STATE_INPUT_REQUIRED: _ClassVar[TaskState]
    TASK_STATE_REJECTED: _ClassVar[TaskState]
    TASK_STATE_AUTH_REQUIRED: _ClassVar[TaskState]

class TaskRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_ROLE_UNSPECIFIED: _ClassVar[TaskRole]
    TASK_ROLE_USER: _ClassVar[TaskRole]
    TASK_ROLE_AGENT: _ClassVar[TaskRole]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_SUBMITTED: TaskState
TASK_STATE_WORKING: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELED: TaskState
TASK_STATE_INPUT_REQUIRED: TaskState
TASK_STATE_REJECTED: TaskState
TASK_STATE_AUTH_REQUIRED: TaskState
TASK_ROLE_UNSPECIFIED: TaskRole
TASK_ROLE_USER: TaskRole
TASK_ROLE_AGENT: TaskRole

class TaskPart(_message.Message):
    __slots__ = ("data", "content_type", "name", "uri", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    content_type: str
    name: str
    uri: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, data: _Optional[bytes] = ..., content_type: _Optional[str] = ..., name: _Optional[str] = ..., uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskMessage(_message.Message):
    __slots__ = ("message_id", "role", "parts", "metadata", "at_ms")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    role: TaskRole
    parts: _containers.RepeatedCompositeFieldContainer[TaskPart]
    metadata: _containers.ScalarMap[str, str]
    at_ms: int
    def __init__(self, message_id: _Optional[str] = ..., role: _Optional[_Union[TaskRole, str]] = ..., parts: _Optional[_Iterable[_Union[TaskPart, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., at_ms: _Optional[int] = ...) -> None: ...

class TaskArtifact(_message.Message):
    __slots__ = ("artifact_id", "name", "description", "parts", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    name: str
    description: str
    parts: _containers.RepeatedCompositeFieldContainer[TaskPart]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, artifact_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[TaskPart, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("state", "at_ms", "message", "reason", "detail")
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    at_ms: int
    message: TaskMessage
    reason: str
    detail: str
    def __init__(self, state: _Optional[_Union[TaskState, str]] = ..., at_ms: _Optional[int] = ..., message: _Optional[_Union[TaskMessage, _Mapping]] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class TaskAttempt(_message.Message):
    __slots__ = ("number", "instance_id", "agent", "started_at_ms", "ended_at_ms", "outcome")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    number: int
    instance_id: str
    agent: str
    started_at_ms: int
    ended_at_ms: int
    outcome: str
    def __init__(self, number: _Optional[int] = ..., instance_id: _Optional[str] = ..., agent: _Optional[str] = ..., started_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ...) -> None: ...

class TaskPush(_message.Message):
    __slots__ = ("url", "target")
    URL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    url: str
    target: _common_pb2.Target
    def __init__(self, url: _Optional[str] = ..., target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "tenant", "context_id", "target", "priority", "session_id", "submitter", "status", "history", "messages", "artifacts", "attempts", "metadata", "push", "version", "created_at_ms", "updated_at_ms", "dispatcher", "claim_until_ms", "expires_at_ms", "run_once", "verified_submitter")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    CLAIM_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_ONCE_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_SUBMITTER_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    context_id: str
    target: _common_pb2.Target
    priority: _common_pb2.Priority
    session_id: str
    submitter: _common_pb2.Caller
    status: TaskStatus
    history: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    messages: _containers.RepeatedCompositeFieldContainer[TaskMessage]
    artifacts: _containers.RepeatedCompositeFieldContainer[TaskArtifact]
    attempts: _containers.RepeatedCompositeFieldContainer[TaskAttempt]
    metadata: _containers.ScalarMap[str, str]
    push: TaskPush
    version: int
    created_at_ms: int
    updated_at_ms: int
    dispatcher: str
    claim_until_ms: int
    expires_at_ms: int
    run_once: bool
    verified_submitter: _common_pb2.Caller
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., context_id: _Optional[str] = ..., target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., session_id: _Optional[str] = ..., submitter: _Optional[_Union[_common_pb2.Caller, _Mapping]] = ..., status: _Optional[_Union[TaskStatus, _Mapping]] = ..., history: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., messages: _Optional[_Iterable[_Union[TaskMessage, _Mapping]]] = ..., artifacts: _Optional[_Iterable[_Union[TaskArtifact, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[TaskAttempt, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., push: _Optional[_Union[TaskPush, _Mapping]] = ..., version: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., dispatcher: _Optional[str] = ..., claim_until_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., run_once: _Optional[bool] = ..., verified_submitter: _Optional[_Union[_common_pb2.Caller, _Mapping]] = ...) -> None: ...

class CreateTaskRequest(_message.Message):
    __slots__ = ("tenant", "task", "push_secret")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PUSH_SECRET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    task: Task
    push_secret: bytes
    def __init__(self, tenant: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., push_secret: _Optional[bytes] = ...) -> None: ...

class CreateTaskReply(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    created: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("tenant", "task_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    task_id: str
    def __init__(self, tenant: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("tenant", "states", "context_id", "submitter_agent", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTER_AGENT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    context_id: str
    submitter_agent: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., states: _Optional[_Iterable[_Union[TaskState, str]]] = ..., context_id: _Optional[str] = ..., submitter_agent: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksReply(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateTaskRequest(_message.Message):
    __slots__ = ("tenant", "task_id", "expected_version", "status", "messages", "artifacts", "attempt", "dispatcher", "claim_until_ms")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    CLAIM_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    task_id: str
    expected_version: int
    status: TaskStatus
    messages: _containers.RepeatedCompositeFieldContainer[TaskMessage]
    artifacts: _containers.RepeatedCompositeFieldContainer[TaskArtifact]
    attempt: TaskAttempt
    dispatcher: str
    claim_until_ms: int
    def __init__(self, tenant: _Optional[str] = ..., task_id: _Optional[str] = ..., expected_version: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[TaskMessage, _Mapping]]] = ..., artifacts: _Optional[_Iterable[_Union[TaskArtifact, _Mapping]]] = ..., attempt: _Optional[_Union[TaskAttempt, _Mapping]] = ..., dispatcher: _Optional[str] = ..., claim_until_ms: _Optional[int] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("tenant", "task_id", "after_version", "with_push_secret")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    WITH_PUSH_SECRET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    task_id: str
    after_version: int
    with_push_secret: bool
    def __init__(self, tenant: _Optional[str] = ..., task_id: _Optional[str] = ..., after_version: _Optional[int] = ..., with_push_secret: _Optional[bool] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ("task", "final", "push_secret")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    PUSH_SECRET_FIELD_NUMBER: _ClassVar[int]
    task: Task
    final: bool
    push_secret: bytes
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., final: _Optional[bool] = ..., push_secret: _Optional[bytes] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("target", "message", "session_id", "priority", "metadata", "caller", "task_id", "context_id", "push", "run_once")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    RUN_ONCE_FIELD_NUMBER: _ClassVar[int]
    target: _common_pb2.Target
    message: TaskMessage
    session_id: str
    priority: _common_pb2.Priority
    metadata: _containers.ScalarMap[str, str]
    caller: _common_pb2.Caller
    task_id: str
    context_id: str
    push: TaskPush
    run_once: bool
    def __init__(self, target: _Optional[_Union[_common_pb2.Target, _Mapping]] = ..., message: _Optional[_Union[TaskMessage, _Mapping]] = ..., session_id: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., caller: _Optional[_Union[_common_pb2.Caller, _Mapping]] = ..., task_id: _Optional[str] = ..., context_id: _Optional[str] = ..., push: _Optional[_Union[TaskPush, _Mapping]] = ..., run_once: _Optional[bool] = ...) -> None: ...

class SubmitTaskReply(_message.Message):
    __slots__ = ("task", "push_secret", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PUSH_SECRET_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    push_secret: bytes
    created: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., push_secret: _Optional[bytes] = ..., created: _Optional[bool] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SubscribeTaskRequest(_message.Message):
    __slots__ = ("task_id", "after_version")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    after_version: int
    def __init__(self, task_id: _Optional[str] = ..., after_version: _Optional[int] = ...) -> None: ...

class ReportTaskRequest(_message.Message):
    __slots__ = ("task_id", "instance_id", "state", "message", "artifacts")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    instance_id: str
    state: TaskState
    message: TaskMessage
    artifacts: _containers.RepeatedCompositeFieldContainer[TaskArtifact]
    def __init__(self, task_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., message: _Optional[_Union[TaskMessage, _Mapping]] = ..., artifacts: _Optional[_Iterable[_Union[TaskArtifact, _Mapping]]] = ...) -> None: ...

class AnswerTaskRequest(_message.Message):
    __slots__ = ("task_id", "message")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    message: TaskMessage
    def __init__(self, task_id: _Optional[str] = ..., message: _Optional[_Union[TaskMessage, _Mapping]] = ...) -> None: ...
