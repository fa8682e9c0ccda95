"""Session context from Python against real sidecars, control and etcd: reads and writes
with their policies, refusals as typed exceptions, watch, delete, a handler reading the
call's session, and a policy declared through the Admin API."""

from __future__ import annotations

import asyncio

import grpc

from agent_reach import (
    Agent,
    Call,
    Client,
    ContextConflict,
    ContextFieldLocked,
    ContextPolicyOverride,
    ContextTooLarge,
    ContextWriterMismatch,
    ContextWriterNotAllowed,
    FieldWrite,
    PermissionDenied,
    Reply,
    WritePolicy,
)
from agent_reach._proto.agentreach.v1 import admin_pb2, admin_pb2_grpc, policy_pb2, session_pb2
from conftest import run
from harness import Mesh
from test_smoke import wait_routable


def test_first_writer_compare_and_set_limits_watch_and_delete(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        intake = Agent(f"intake-{unique}", sidecar=mesh.a.local)
        audit = Agent(f"audit-{unique}", sidecar=mesh.b.local)

        @intake.capability(f"intake.{unique}")
        async def noop_a(call: Call) -> Reply:
            return Reply.text("")

        @audit.capability(f"audit.{unique}")
        async def read_it(call: Call) -> Reply:
            field = await call.session().get("user_id")
            return Reply.text(field.text() if field else "<none>")

        async with intake, audit:
            sid = f"s-{unique}"
            on_a = intake.client.session(sid)
            on_b = audit.client.session(sid)

            # first_writer: of 10 racing writers exactly one wins; the others name it.
            async def first(n: int) -> int | ContextFieldLocked:
                try:
                    return await (on_a if n % 2 == 0 else on_b).put_first("user_id", f"u-{n}")
                except ContextFieldLocked as e:
                    return e

            results = await asyncio.gather(*(first(n) for n in range(10)))
            won = [r for r in results if isinstance(r, int)]
            lost = [r for r in results if isinstance(r, ContextFieldLocked)]
            assert (len(won), len(lost)) == (1, 9), results
            snapshot = await on_a.read(min_version=won[0])
            winner = snapshot.fields["user_id"]
            assert winner.locked and winner.version == won[0]
            for e in lost:
                assert e.code == grpc.StatusCode.FAILED_PRECONDITION
                assert (e.field, e.writer_agent, e.writer_instance, e.version) == (
                    "user_id", winner.writer_agent, winner.writer_instance, won[0]
                )

            # compare_and_set: 2 writers x 10 increments with retries on conflict -> 20.
            await on_a.compare_and_set("n", "0", 0)
            conflicts = 0

            async def increments(session_n: int) -> None:
                nonlocal conflicts
                session = on_a if session_n == 0 else on_b
                for _ in range(10):
                    while True:
                        current = await session.get("n")
                        assert current is not None
                        try:
                            await session.compare_and_set("n", str(int(current.text()) + 1), current.version)
                            break
                        except ContextConflict as e:
                            assert e.field == "n" and e.current_version >= current.version
                            conflicts += 1

            await asyncio.gather(increments(0), increments(1))
            n = await on_b.read()
            assert n.fields["n"].text() == "20", n.fields["n"]

            # Limits: an oversize field is refused with its reason and nothing is stored.
            before = (await on_a.read()).version
            try:
                await on_a.put_many([FieldWrite("small", "x"), FieldWrite("big", b"x" * (65 * 1024))])
                raise AssertionError("an oversize field was accepted")
            except ContextTooLarge as e:
                assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert (e.limit_name, e.limit) == ("max_field_bytes", 64 * 1024)
            after = await on_a.read(min_version=before)
            assert after.version == before and "small" not in after.fields

            # A handler reads the call's session through call.session().
            async with Client(mesh.a.local) as client:
                await wait_routable(client, f"audit.{unique}")
                reply = await client.invoke(f"audit.{unique}", session=sid, text="", timeout=10)
                assert reply.text() == winner.text()

            # Watch: changes after a version, in order, then the session's end.
            seen: list[tuple[int, dict[str, str], bool]] = []

            async def watch() -> None:
                async for change in on_b.watch(after_version=after.version):
                    seen.append((change.version, {k: f.text() for k, f in change.put.items()}, change.ended))

            watcher = asyncio.create_task(watch())
            v1 = await on_a.set("status", "open")
            v2 = await on_a.put("status", "closed", policy=WritePolicy.LAST_WRITER)
            assert await on_a.delete("status")
            assert not await on_a.delete("status")
            assert await on_b.delete()
            await asyncio.wait_for(watcher, 10)
            assert [s[:2] for s in seen[:2]] == [(v1, {"status": "open"}), (v2, {"status": "closed"})]
            assert len(seen) == 4 and seen[-1][2], seen
            # Sidecar A's cache learns of B's delete from its watch of control: reads there are
            # eventually consistent across sidecars (read-your-writes holds for A's own writes).
            for _ in range(50):
                if not (await on_a.read()).found:
                    break
                await asyncio.sleep(0.1)
            assert not (await on_a.read()).found

    run(main())


def test_a_declared_policy_refuses_an_override(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"clerk-{unique}", sidecar=mesh.a.local)

        @agent.capability(f"clerk.{unique}")
        async def noop(call: Call) -> Reply:
            return Reply.text("")

        rule = session_pb2.SessionFieldRule(policy=session_pb2.WRITE_POLICY_FIRST_WRITER)
        policy = policy_pb2.Policy(
            tenant="default",
            kind=policy_pb2.POLICY_KIND_AGENT,
            name=f"clerk-{unique}",
            spec=policy_pb2.PolicySpec(session={"ticket": rule}),
        )
        async with grpc.aio.insecure_channel(mesh.control_addr) as channel:
            await admin_pb2_grpc.AdminStub(channel).PutPolicy(admin_pb2.PutPolicyRequest(policy=policy))
        async with agent:
            session = agent.client.session(f"p-{unique}")
            deadline = asyncio.get_running_loop().time() + 15
            while True:  # until control's feed has the policy
                try:
                    await session.put("ticket", "t-1", policy=WritePolicy.LAST_WRITER)
                except ContextPolicyOverride as e:
                    assert (e.field, e.declared_policy, e.requested_policy) == (
                        "ticket", "first_writer", "last_writer"
                    )
                    break
                assert asyncio.get_running_loop().time() < deadline, "the declared policy never applied"
                await session.delete("ticket")
                await asyncio.sleep(0.1)
            version = await session.set("ticket", "t-2")
            field = (await session.read(min_version=version)).fields["ticket"]
            assert field.locked and field.text() == "t-2"
            try:
                await session.set("ticket", "t-3")
                raise AssertionError("a locked field changed")
            except ContextFieldLocked as e:
                assert e.version == version

    run(main())


def test_session_writers_refuse_other_agents_and_unverified_writers(mesh: Mesh, unique: str) -> None:
    """The tenant policy's ``session_writers``: only the named agent writes the covered
    fields; others get ``ContextWriterNotAllowed`` (a ``PermissionDenied``) naming the field,
    the rule and the writer, and the session is unchanged."""

    async def main() -> None:
        refund = Agent(f"refund-{unique}", sidecar=mesh.a.local)
        support = Agent(f"support-{unique}", sidecar=mesh.a.local)

        @refund.capability(f"refund.{unique}")
        async def noop_r(call: Call) -> Reply:
            return Reply.text("")

        @support.capability(f"support.{unique}")
        async def noop_s(call: Call) -> Reply:
            return Reply.text("")

        covered = f"refund-{unique}.*"
        field = f"refund-{unique}.amount"
        policy = policy_pb2.Policy(
            tenant="default",
            kind=policy_pb2.POLICY_KIND_TENANT,
            name="default",
            spec=policy_pb2.PolicySpec(
                session_writers=[session_pb2.SessionWriters(fields=covered, agents=[f"refund-{unique}"])]
            ),
        )
        async with grpc.aio.insecure_channel(mesh.control_addr) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            await admin.PutPolicy(admin_pb2.PutPolicyRequest(policy=policy))
            try:
                async with refund, support:
                    sid = f"w-{unique}"
                    by_refund = refund.client.session(sid)
                    by_support = support.client.session(sid)
                    deadline = asyncio.get_running_loop().time() + 15
                    while True:  # until control's feed has the tenant policy
                        try:
                            await by_support.set(field, "probe")
                        except ContextWriterNotAllowed as e:
                            denied = e
                            break
                        assert asyncio.get_running_loop().time() < deadline, "the rule never applied"
                        await by_refund.delete(field)
                        await asyncio.sleep(0.1)
                    assert isinstance(denied, PermissionDenied)
                    assert denied.code == grpc.StatusCode.PERMISSION_DENIED
                    assert (denied.field, denied.rule, denied.writer_agent, denied.verified) == (
                        field, covered, f"support-{unique}", True
                    )
                    assert denied.writer_instance == support.instance_id

                    version = await by_refund.set(field, "120")
                    before = await by_refund.read(min_version=version)
                    assert before.fields[field].writer_instance == refund.instance_id
                    # A multi-field write with one covered field stores nothing.
                    try:
                        await by_support.put_many([FieldWrite("note", "n"), FieldWrite(field, "0")])
                        raise AssertionError("support wrote a refund field")
                    except ContextWriterNotAllowed as e:
                        assert e.field == field
                    # Without a credential, naming refund's own instance is not verified.
                    async with Client(mesh.a.local) as anonymous:
                        try:
                            await anonymous.session(sid, instance_id=refund.instance_id).set(field, "1")
                            raise AssertionError("an unverified writer wrote a covered field")
                        except ContextWriterNotAllowed as e:
                            assert (e.writer_agent, e.verified) == (f"refund-{unique}", False)
                    # A credential names its own instance only.
                    try:
                        await support.client.session(sid, instance_id=refund.instance_id).set(field, "2")
                        raise AssertionError("a credential wrote as another instance")
                    except ContextWriterMismatch as e:
                        assert (e.writer_instance, e.credential_instance) == (refund.instance_id, support.instance_id)
                    try:
                        await by_support.delete(field)
                        raise AssertionError("support deleted a refund field")
                    except ContextWriterNotAllowed as e:
                        assert e.field == field
                    after = await by_refund.read()
                    assert after.version == before.version and "note" not in after.fields
                    assert after.fields[field].text() == "120"
                    assert await by_refund.delete()
            finally:
                await admin.DeletePolicy(
                    admin_pb2.DeletePolicyRequest(tenant="default", kind=policy_pb2.POLICY_KIND_TENANT, name="default")
                )

    run(main())
