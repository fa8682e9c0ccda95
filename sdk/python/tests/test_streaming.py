"""Streaming handlers are async generators: chunks flow as the consumer reads them
(back-pressure through both sidecars), and a caller that leaves cancels the handler."""

from __future__ import annotations

import asyncio

from agent_reach import Agent, Call, Client, Reply
from conftest import run
from harness import Mesh
from util import wait_routable

CHUNK = 64 * 1024


def test_streamed_chunks_arrive_in_order(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"words-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"words.{unique}")
        async def words(call: Call):  # type: ignore[no-untyped-def]
            for i, word in enumerate(call.text().split()):
                yield Reply.text(word, index=str(i))

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"words.{unique}")
            stream = client.invoke_stream(f"words.{unique}", text="one two three four", timeout=5)
            chunks = [c async for c in stream]
            assert [c.text() for c in chunks] == ["one", "two", "three", "four"]
            assert [c.metadata["index"] for c in chunks] == ["0", "1", "2", "3"]
            assert stream.instance == agent.instance_id

    run(main())


def test_a_slow_consumer_holds_the_producer_back_and_cancelling_reaches_the_handler(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"firehose-{unique}", sidecar=mesh.b.local)
        produced = 0
        cancelled = asyncio.Event()
        finished_normally = False

        @agent.capability(f"firehose.{unique}")
        async def firehose(call: Call):  # type: ignore[no-untyped-def]
            nonlocal produced, finished_normally
            try:
                for _ in range(2000):  # 125 MiB if nothing held it back
                    produced += 1
                    yield Reply.bytes(b"x" * CHUNK)
                finished_normally = True
            except (asyncio.CancelledError, GeneratorExit):
                cancelled.set()
                raise

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"firehose.{unique}")
            stream = client.invoke_stream(f"firehose.{unique}", text="go", timeout=60)
            consumed = 0
            async for chunk in stream:
                assert len(chunk.payload) == CHUNK
                consumed += 1
                if consumed == 10:
                    break
                await asyncio.sleep(0.05)
            # Reading slowly, the consumer took 10 chunks; flow control through the agent's
            # HTTP/2 window, both sidecars and the client's window holds the producer to a
            # bounded lead instead of the whole 2,000.
            await asyncio.sleep(1.0)
            lead = produced - consumed
            assert lead < 500, f"the producer ran {lead} chunks ({lead * CHUNK >> 20} MiB) ahead"
            # Leaving the loop cancelled the call; the handler sees it.
            await asyncio.wait_for(cancelled.wait(), 10)
            assert not finished_normally
            await asyncio.sleep(0.2)
            assert agent.in_flight == 0

    run(main())


def test_a_cancelled_unary_call_and_its_deadline_reach_the_handler(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        agent = Agent(f"sleeper-{unique}", sidecar=mesh.b.local)
        seen: dict[str, object] = {}
        cancelled = asyncio.Event()

        @agent.capability(f"sleep.{unique}")
        async def sleep(call: Call) -> Reply:
            seen["remaining"] = call.time_remaining()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen["cancelled"] = call.cancelled()
                cancelled.set()
                raise
            return Reply.text("woke")

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"sleep.{unique}")
            task = asyncio.create_task(client.invoke(f"sleep.{unique}", text="x", timeout=20))
            while "remaining" not in seen:
                await asyncio.sleep(0.01)
            remaining = seen["remaining"]
            assert isinstance(remaining, float) and 15 < remaining <= 20.5, remaining
            task.cancel()
            await asyncio.wait_for(cancelled.wait(), 10)
            assert seen["cancelled"] is True

    run(main())


def test_the_synchronous_facade_invokes_and_streams(mesh: Mesh, unique: str) -> None:
    import threading

    from agent_reach import SyncClient

    ready, done = threading.Event(), threading.Event()

    async def serve_agent() -> None:
        agent = Agent(f"sync-{unique}", sidecar=mesh.b.local)

        @agent.capability(f"sync.echo.{unique}")
        async def echo(call: Call) -> str:
            return call.text()

        @agent.capability(f"sync.count.{unique}")
        async def count(call: Call):  # type: ignore[no-untyped-def]
            for i in range(3):
                yield str(i)

        async with agent, Client(mesh.a.local) as client:
            await wait_routable(client, f"sync.count.{unique}")
            await wait_routable(client, f"sync.echo.{unique}")
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(serve_agent()))
    thread.start()
    try:
        assert ready.wait(20)
        with SyncClient(mesh.a.local) as mesh_client:
            assert mesh_client.invoke(f"sync.echo.{unique}", text="hi", timeout=5).text() == "hi"
            assert [c.text() for c in mesh_client.invoke_stream(f"sync.count.{unique}", timeout=5)] == ["0", "1", "2"]
            assert mesh_client.route(f"sync.echo.{unique}").candidates
    finally:
        done.set()
        thread.join(30)
