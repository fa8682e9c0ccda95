"""Plain types shared by the client and the agent: priorities, health states, targets."""

from __future__ import annotations

import enum
import json as _json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_reach._proto.agentreach.v1 import common_pb2

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


class Priority(enum.IntEnum):
    """How urgent a call is; the mesh admits and queues calls by priority."""

    UNSPECIFIED = common_pb2.PRIORITY_UNSPECIFIED
    HIGH = common_pb2.PRIORITY_HIGH
    NORMAL = common_pb2.PRIORITY_NORMAL
    LOW = common_pb2.PRIORITY_LOW


class HealthState(enum.IntEnum):
    """Health of one instance, as it reports it and as routing sees it."""

    UNSPECIFIED = common_pb2.HEALTH_STATE_UNSPECIFIED
    STARTING = common_pb2.HEALTH_STATE_STARTING
    UP = common_pb2.HEALTH_STATE_UP
    DEGRADED = common_pb2.HEALTH_STATE_DEGRADED
    PAUSED = common_pb2.HEALTH_STATE_PAUSED
    DOWN = common_pb2.HEALTH_STATE_DOWN
    UNKNOWN = common_pb2.HEALTH_STATE_UNKNOWN


@dataclass(frozen=True)
class Reply:
    """A handler's answer, or one chunk of a streamed answer.

    >>> Reply.text("hello").payload
    b'hello'
    """

    payload: bytes = b""
    content_type: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, text: str, **metadata: str) -> Reply:
        """A UTF-8 text answer (content type ``text/plain``)."""
        return cls(text.encode(), TEXT, metadata)

    @classmethod
    def bytes(cls, payload: bytes, content_type: str = "", **metadata: str) -> Reply:
        """A binary answer."""
        return cls(payload, content_type, metadata)

    @classmethod
    def json(cls, value: Any, **metadata: str) -> Reply:
        """A JSON answer (content type ``application/json``)."""
        return cls(_json.dumps(value).encode(), JSON, metadata)


def as_reply(value: Reply | str | bytes | None) -> Reply:
    """What a handler returned (or yielded), as a :class:`Reply`."""
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply.text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Reply(bytes(value))
    if value is None:
        return Reply()
    raise TypeError(f"a handler must return Reply, str or bytes, not {type(value).__name__}")
