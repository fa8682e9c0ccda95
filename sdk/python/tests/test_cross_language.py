"""A Python agent and a Rust agent (the tests crate's test-agent) call each other, both
ways, through two sidecars; nested calls inherit the handler's deadline and trace."""

from __future__ import annotations

from agent_reach import Agent, Call, Client, Reply
from conftest import run
from harness import Mesh, start_rust_agent
from util import wait_routable

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def test_python_and_rust_agents_call_each_other_both_ways(mesh: Mesh, unique: str) -> None:
    rust = start_rust_agent(mesh.workdir, mesh.b.local, f"rust-{unique}", [f"rs.echo.{unique}"],
                            "--relay", f"rs.relay.{unique}=py.upper.{unique}")

    async def main() -> None:
        py = Agent(f"py-{unique}", version="2.0.0", sidecar=mesh.a.local)

        @py.capability(f"py.upper.{unique}")
        async def upper(call: Call) -> Reply:
            return Reply.text(f"py@{call.instance_id}:{call.text().upper()}")

        @py.capability(f"py.ask-rust.{unique}")
        async def ask_rust(call: Call) -> Reply:
            # A nested call from a Python handler to the Rust agent, on its own sidecar.
            reply = await call.client.invoke(f"rs.echo.{unique}", text=call.text())
            return Reply.text(f"py asked rust: {reply.text()}")

        async with py, Client(mesh.a.local) as client:
            await wait_routable(client, f"rs.echo.{unique}")
            await wait_routable(client, f"rs.relay.{unique}")
            await wait_routable(client, f"py.upper.{unique}")
            b = Client(mesh.b.local)
            await wait_routable(b, f"py.upper.{unique}")
            await b.close()

            # Python caller -> sidecar a -> sidecar b -> Rust agent.
            reply = await client.invoke(f"rs.echo.{unique}", text="hi", timeout=5)
            assert reply.text() == f"rust-{unique}@{rust.instance_id}:hi"
            assert reply.instance == rust.instance_id

            # Python caller -> Rust agent on b -> (Rust SDK client, sidecar b -> a) -> Python agent.
            reply = await client.invoke(f"rs.relay.{unique}", text="hello", timeout=5,
                                        headers={"traceparent": TRACEPARENT})
            assert reply.text() == f"rust-{unique}@{rust.instance_id}:py@{py.instance_id}:HELLO"

            # Python agent -> (nested call from its handler) -> Rust agent.
            reply = await client.invoke(f"py.ask-rust.{unique}", text="ping", timeout=5)
            assert reply.text() == f"py asked rust: rust-{unique}@{rust.instance_id}:ping"

    try:
        run(main())
    finally:
        rust.terminate()
        assert rust.wait(10) == 0, rust.log_text()


def test_nested_calls_inherit_the_handlers_deadline_and_trace(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        front = Agent(f"front-{unique}", sidecar=mesh.a.local)
        back = Agent(f"back-{unique}", sidecar=mesh.b.local)

        @back.capability(f"back.{unique}")
        async def report(call: Call) -> Reply:
            remaining = call.time_remaining()
            return Reply.json({
                "traceparent": call.traceparent,
                "remaining": remaining,
                "caller": list(call.caller or ()),
            })

        @front.capability(f"front.{unique}")
        async def forward(call: Call) -> Reply:
            # No timeout given: the nested call gets what is left of this call's deadline.
            reply = await Client(mesh.a.local).invoke(f"back.{unique}", text="x")
            return Reply.bytes(reply.payload, "application/json")

        async with front, back, Client(mesh.b.local) as client:
            await wait_routable(client, f"front.{unique}")
            a = Client(mesh.a.local)
            await wait_routable(a, f"back.{unique}")
            await a.close()
            reply = await client.invoke(f"front.{unique}", text="go", timeout=4,
                                        headers={"traceparent": TRACEPARENT})
            seen = reply.json()
            assert seen["traceparent"] is not None and TRACE_ID in seen["traceparent"], seen
            assert seen["remaining"] is not None and 2.0 < seen["remaining"] <= 4.0, seen
            assert seen["caller"] == [f"front-{unique}", front.instance_id], seen

    run(main())


def test_calls_carry_the_current_opentelemetry_span_as_traceparent(mesh: Mesh, unique: str) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    async def main() -> None:
        agent = Agent(f"otel-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"otel.{unique}")
        async def report(call: Call) -> Reply:
            # Inside the handler the call's trace is the current OpenTelemetry context.
            current = trace.get_current_span().get_span_context()
            return Reply.json({"traceparent": call.traceparent, "current": f"{current.trace_id:032x}"})

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"otel.{unique}")
            span = NonRecordingSpan(SpanContext(int(TRACE_ID, 16), 0x00F067AA0BA902B7, is_remote=False,
                                                trace_flags=TraceFlags(TraceFlags.SAMPLED)))
            with trace.use_span(span):
                seen = (await client.invoke(f"otel.{unique}", text="x", timeout=5)).json()
            assert TRACE_ID in seen["traceparent"], seen
            assert seen["current"] == TRACE_ID, seen

    run(main())


def test_the_sidecar_vouches_for_the_agent_whose_credential_a_call_presents(mesh: Mesh, unique: str) -> None:
    """Nested calls from a handler present the handling agent's credential: the target,
    here on the same sidecar, sees it as the verified caller; a client that names itself
    is not verified."""

    async def main() -> None:
        front = Agent(f"front-{unique}", sidecar=mesh.a.local)
        back = Agent(f"back-{unique}", sidecar=mesh.a.local)

        @back.capability(f"back.{unique}")
        async def report(call: Call) -> Reply:
            return Reply.json(
                {
                    "verified": list(call.verified_caller or ()),
                    "tenant": call.verified_caller_tenant,
                    "said": list(call.caller or ()),
                }
            )

        @front.capability(f"front.{unique}")
        async def forward(call: Call) -> Reply:
            reply = await Client(mesh.a.local).invoke(f"back.{unique}", text="x")
            return Reply.bytes(reply.payload, "application/json")

        async with front, back, Client(mesh.a.local) as client:
            await wait_routable(client, f"front.{unique}")
            await wait_routable(client, f"back.{unique}")
            seen = (await client.invoke(f"front.{unique}", text="go", timeout=4)).json()
            assert seen["verified"] == [f"front-{unique}", front.instance_id], seen
            # The caller's tenant, from its sidecar's certificate (the harness's sidecars
            # are of the default tenant).
            assert seen["tenant"] == "default", seen
            named = client.with_caller(f"front-{unique}", front.instance_id)
            seen = (await named.invoke(f"back.{unique}", text="x", timeout=4)).json()
            assert seen == {"verified": [], "tenant": None, "said": [f"front-{unique}", front.instance_id]}, seen
            seen = (await front.client.invoke(f"back.{unique}", text="x", timeout=4)).json()
            assert seen["verified"] == [f"front-{unique}", front.instance_id], seen

    run(main())
