"""What a handler's nested calls inherit: the call's deadline and trace context."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

try:  # opentelemetry-api is optional
    from opentelemetry import context as _otel_context
    from opentelemetry import propagate as _otel_propagate
    from opentelemetry import trace as _otel_trace

    HAVE_OTEL = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_OTEL = False


@dataclass(frozen=True)
class Inherited:
    """The deadline (``time.monotonic()`` seconds) and traceparent of the call being
    handled, and who is handling it."""

    deadline: float | None
    traceparent: str | None
    agent: str
    instance_id: str
    # The handling agent's credential: nested calls are made as that agent.
    credential: str = ""


CURRENT: contextvars.ContextVar[Inherited | None] = contextvars.ContextVar("agent_reach_current_call", default=None)


def effective_timeout(timeout: float | None) -> float | None:
    """``timeout`` shrunk to the remaining time of the call being handled, if any."""
    current = CURRENT.get()
    if current is None or current.deadline is None:
        return timeout
    remaining = max(current.deadline - time.monotonic(), 0.001)
    return remaining if timeout is None else min(timeout, remaining)


def outgoing_traceparent() -> str | None:
    """The W3C traceparent for an outgoing call: the current OpenTelemetry span's when
    opentelemetry-api is installed and a span is active, else the handled call's."""
    if HAVE_OTEL:
        span_context = _otel_trace.get_current_span().get_span_context()
        if span_context.is_valid:
            carrier: dict[str, str] = {}
            _otel_propagate.inject(carrier)
            if "traceparent" in carrier:
                return carrier["traceparent"]
    current = CURRENT.get()
    return current.traceparent if current is not None else None


@contextmanager
def handling(inherited: Inherited) -> Iterator[None]:
    """Runs the body as the handler of a call: nested calls inherit its deadline and
    trace, and with opentelemetry-api the call's trace context is the current context."""
    token = CURRENT.set(inherited)
    otel_token: Any = None
    if HAVE_OTEL and inherited.traceparent:
        otel_token = _otel_context.attach(_otel_propagate.extract({"traceparent": inherited.traceparent}))
    try:
        yield
    finally:
        if otel_token is not None:
            try:
                _otel_context.detach(otel_token)
            except Exception:  # detaching in another context (a generator resumed elsewhere)
                pass
        CURRENT.reset(token)
