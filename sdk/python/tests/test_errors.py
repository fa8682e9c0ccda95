"""Every error reason surfaces as its exception type, with its fields, attempts and
instances tried: from a real mesh where the mesh can produce the reason, and for every
reason of the wire contract from a stand-in sidecar that answers with it."""

from __future__ import annotations

import asyncio


import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

import agent_reach
from agent_reach import (
    Agent,
    AgentNotFound,
    AgentOverloaded,
    Call,
    CircuitOpen,
    Client,
    DeadlineExceeded,
    HandlerError,
    HealthState,
    InvalidArgument,
    MeshError,
    NoHealthyInstance,
    PayloadTooLarge,
    Priority,
    RateLimited,
    Reply,
)
from agent_reach._proto.agentreach.v1 import policy_pb2, sidecar_pb2
from agent_reach.errors import exception_for
from conftest import run
from harness import Mesh
from util import put_capability_policy, wait_route, wait_routable


def test_unknown_capability_is_agent_not_found_with_suggestions(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"summarizer-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"text.summarize{unique}")
        async def summarize(call: Call) -> str:
            return call.text()

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"text.summarize{unique}")
            with pytest.raises(AgentNotFound) as caught:
                await client.invoke(f"text.sumarize{unique}", text="x", timeout=5)
            e = caught.value
            assert e.code == grpc.StatusCode.NOT_FOUND
            assert e.reason == "AGENT_NOT_FOUND"
            assert f"text.summarize{unique}" in e.suggestions
            assert e.target == f"capability text.sumarize{unique}"

    run(main())


def test_a_paused_agent_gives_no_healthy_instance_and_an_open_breaker_too(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        paused = Agent(f"paused-{unique}", sidecar=mesh.b.local)

        @paused.capability(f"paused.{unique}")
        async def work(call: Call) -> str:
            return "ok"

        flaky = Agent(f"flaky-{unique}", sidecar=mesh.b.local)

        @flaky.capability(f"flaky.{unique}")
        async def fail(call: Call) -> str:
            raise HandlerError.unavailable("down for maintenance")

        async with paused, flaky, Client(mesh.a.local) as client:
            await wait_routable(client, f"paused.{unique}")
            paused.set_state(HealthState.PAUSED)  # the agent reports PAUSED itself
            await wait_route(client, f"paused.{unique}", lambda r: not r.candidates, 10, "without candidates")
            with pytest.raises(NoHealthyInstance) as caught:
                await client.invoke(f"paused.{unique}", text="x", timeout=5)
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
            assert caught.value.target == f"capability paused.{unique}"
            assert "STATE_PAUSED" in caught.value.message or "PAUSED" in caught.value.message

            await wait_routable(client, f"flaky.{unique}")
            await put_capability_policy(mesh.control_addr, f"flaky.{unique}", policy_pb2.PolicySpec(
                breaker=policy_pb2.CircuitBreaker(consecutive_failures=2, open_ms=60_000)))
            await asyncio.sleep(1.0)  # the policy reaches sidecar a
            for _ in range(2):
                with pytest.raises(MeshError) as failed:
                    await client.invoke(f"flaky.{unique}", text="x", timeout=5)
                # The handler's own failure: its code and message, no mesh reason.
                assert type(failed.value) is MeshError and failed.value.reason is None
                assert failed.value.code == grpc.StatusCode.UNAVAILABLE
                assert failed.value.message == "down for maintenance"
                assert failed.value.attempts == 1
                assert failed.value.instances_tried == [flaky.instance_id]
            # The caller's sidecar has opened the instance's breaker; with no other
            # instance, routing has nowhere to go (the breaker is named in the message).
            with pytest.raises(NoHealthyInstance) as caught:
                await client.invoke(f"flaky.{unique}", text="x", timeout=5)
            assert "BREAKER_OPEN" in caught.value.message

    run(main())


def test_rate_limited_carries_retry_after_and_the_policy(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"limited-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"limited.{unique}")
        async def work(call: Call) -> str:
            return "ok"

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"limited.{unique}")
            await put_capability_policy(mesh.control_addr, f"limited.{unique}", policy_pb2.PolicySpec(
                rate_limit=policy_pb2.RateLimit(per_second=0.2, burst=1)))
            await asyncio.sleep(1.0)
            refused: RateLimited | None = None
            for _ in range(5):
                try:
                    await client.invoke(f"limited.{unique}", text="x", timeout=5)
                except RateLimited as e:
                    refused = e
                    break
            assert refused is not None, "the bucket never refused"
            assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.retry_after is not None and 0 < refused.retry_after <= 5.0
            assert refused.policy == f"capability/limited.{unique}"
            assert refused.bucket

    run(main())


def test_an_overloaded_agent_gives_agent_overloaded(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"busy-{unique}", sidecar=mesh.b.local, max_concurrency=1)

        @agent.capability(f"busy.{unique}")
        async def slow(call: Call) -> str:
            await asyncio.sleep(1.0)
            return "done"

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"busy.{unique}")
            await put_capability_policy(mesh.control_addr, f"busy-{unique}", policy_pb2.PolicySpec(
                admission=policy_pb2.Admission(queue_length=1, queue_timeout_ms=50)),
                kind=policy_pb2.POLICY_KIND_AGENT)
            await asyncio.sleep(1.0)
            results = await asyncio.gather(*(
                client.invoke(f"busy.{unique}", text="x", timeout=10, priority=Priority.HIGH) for _ in range(6)
            ), return_exceptions=True)
            ok = [r for r in results if isinstance(r, agent_reach.Response)]
            shed = [r for r in results if isinstance(r, AgentOverloaded)]
            assert len(ok) >= 1 and len(ok) + len(shed) == 6, results
            assert shed, results
            e = shed[0]
            assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert e.instance == agent.instance_id
            assert e.policy == f"agent/busy-{unique}"
            assert e.retry_after is not None and e.retry_after > 0
            assert e.attempts >= 1 and agent.instance_id in e.instances_tried
            assert agent.peak_in_flight == 1

    run(main())


def test_payload_too_large_and_invalid_argument_and_deadline(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"sink-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"sink.{unique}")
        async def sink(call: Call) -> str:
            if call.text() == "slow":
                await asyncio.sleep(3)
            return "ok"

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"sink.{unique}")
            with pytest.raises(PayloadTooLarge) as too_large:
                await client.invoke(f"sink.{unique}", payload=b"x" * (5 << 20), timeout=10)
            assert too_large.value.limit == 4 << 20
            assert too_large.value.size is not None and too_large.value.size > 5 << 20

            with pytest.raises(InvalidArgument) as invalid:
                await client.invoke(text="no target", timeout=5)
            assert invalid.value.field == "target"
            assert "target" in invalid.value.field_violations

            with pytest.raises(DeadlineExceeded) as late:
                await client.invoke(f"sink.{unique}", text="slow", timeout=0.5)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    run(main())


# -- every reason of the wire contract, from a stand-in sidecar --------------------------

def _status_details(reason: str, metadata: dict[str, str], retry_ms: int | None, field: str | None) -> bytes:
    status = status_pb2.Status(code=14, message="refused")
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="agent-reach.dev", metadata=metadata))
    status.details.append(info)
    if retry_ms is not None:
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=retry_ms * 1_000_000)))
        status.details.append(retry)
    if field is not None:
        bad = any_pb2.Any()
        bad.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description="must be set")]))
        status.details.append(bad)
    return status.SerializeToString()


CASES: list[tuple[str, type[MeshError], grpc.StatusCode, dict[str, str]]] = [
    ("AGENT_NOT_FOUND", AgentNotFound, grpc.StatusCode.NOT_FOUND, {"suggestions": "a.b,a.c", "target": "capability a"}),
    ("NO_HEALTHY_INSTANCE", NoHealthyInstance, grpc.StatusCode.UNAVAILABLE, {"instances_tried": "i-1,i-2"}),
    ("RATE_LIMITED", RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED, {"policy": "capability/a", "bucket": "x"}),
    ("AGENT_OVERLOADED", AgentOverloaded, grpc.StatusCode.RESOURCE_EXHAUSTED, {"instance": "i-1"}),
    ("CIRCUIT_OPEN", CircuitOpen, grpc.StatusCode.UNAVAILABLE, {"instance": "i-1", "mechanism": "circuit_breaker"}),
    ("PAYLOAD_TOO_LARGE", PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED, {"size": "10", "limit": "5"}),
    ("INVALID_ARGUMENT", InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, {"field": "target"}),
    ("DEADLINE_EXCEEDED", DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, {"attempts": "2"}),
    ("CONTROL_UNAVAILABLE", agent_reach.ControlUnavailable, grpc.StatusCode.UNAVAILABLE, {}),
    ("INSTANCE_NOT_FOUND", agent_reach.InstanceNotFound, grpc.StatusCode.NOT_FOUND, {"instance": "i-9"}),
    ("SHUTTING_DOWN", agent_reach.ShuttingDown, grpc.StatusCode.UNAVAILABLE, {}),
    ("IDEMPOTENT_REPLY_NOT_STORED", agent_reach.IdempotentReplyNotStored, grpc.StatusCode.FAILED_PRECONDITION, {}),
    ("IDEMPOTENCY_KEY_REUSED", agent_reach.IdempotencyKeyReused, grpc.StatusCode.FAILED_PRECONDITION,
     {"key_prefix": "order-42"}),
    ("PERMISSION_DENIED", agent_reach.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, {}),
]


def test_every_reason_decodes_to_its_exception_over_the_wire() -> None:
    async def main() -> None:
        current: dict[str, object] = {}

        async def invoke(request: sidecar_pb2.InvokeRequest, context: grpc.aio.ServicerContext) -> sidecar_pb2.InvokeReply:
            reason, _, code, meta = current["case"]  # type: ignore[misc]
            retry = 250 if reason in ("RATE_LIMITED", "AGENT_OVERLOADED") else None
            field = "target" if reason == "INVALID_ARGUMENT" else None
            await context.abort(code, f"{reason} here", trailing_metadata=(
                ("grpc-status-details-bin", _status_details(reason, meta, retry, field)),
                ("ar-attempts", "2"),
                ("ar-instances-tried", "i-1,i-2"),
            ))
            raise AssertionError("unreachable")

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("agentreach.v1.Sidecar", {
            "Invoke": grpc.unary_unary_rpc_method_handler(
                invoke, request_deserializer=sidecar_pb2.InvokeRequest.FromString,
                response_serializer=sidecar_pb2.InvokeReply.SerializeToString),
        }),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with Client(f"127.0.0.1:{port}") as client:
                for case in CASES:
                    reason, cls, code, meta = case
                    current["case"] = case
                    with pytest.raises(cls) as caught:
                        await client.invoke("a", text="x", timeout=5)
                    e = caught.value
                    assert type(e) is cls and exception_for(reason) is cls
                    assert (e.reason, e.code, e.message) == (reason, code, f"{reason} here")
                    assert e.attempts == 2 and e.instances_tried == ["i-1", "i-2"], repr(e)
                    assert all(e.metadata[k] == v for k, v in meta.items())
                    if isinstance(e, AgentNotFound):
                        assert e.suggestions == ["a.b", "a.c"]
                    if isinstance(e, (RateLimited, AgentOverloaded)):
                        assert e.retry_after == pytest.approx(0.25)
                    if isinstance(e, InvalidArgument):
                        assert e.field == "target" and e.field_violations == {"target": "must be set"}
                    if isinstance(e, PayloadTooLarge):
                        assert (e.size, e.limit) == (10, 5)
                    if isinstance(e, CircuitOpen):
                        assert e.instance == "i-1"
        finally:
            await server.stop(None)

    run(main())


