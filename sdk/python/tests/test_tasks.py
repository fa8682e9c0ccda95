"""Durable tasks from Python against real sidecars, control and etcd: submit through
sidecar a to an agent behind sidecar b, follow the updates, wait, read from the other
sidecar, idempotent submit by id, and the refusals (with their mesh reasons)."""

from __future__ import annotations

import pytest

from agent_reach import Agent, Call, Client, InvalidArgument, MeshError, Reply, TaskState
from conftest import run
from harness import Mesh
from test_smoke import wait_routable


def test_submit_follow_wait_and_read_from_another_sidecar(mesh: Mesh, unique: str) -> None:
    async def main() -> None:
        worker = Agent(f"worker-{unique}", sidecar=mesh.b.local)
        seen: list[str] = []

        @worker.capability(f"work.{unique}")
        async def work(call: Call) -> Reply:
            seen.append(call.metadata.get("ar-task-id", ""))
            return Reply.text("done:" + call.text())

        async with worker, Client(mesh.a.local) as on_a, Client(mesh.b.local) as on_b:
            await wait_routable(on_a, f"work.{unique}")
            submitted = await on_a.submit(f"work.{unique}", text="x", task_id=f"t-{unique}")
            assert submitted.created
            assert submitted.id == f"t-{unique}"
            assert submitted.task.state in (TaskState.SUBMITTED, TaskState.WORKING)

            views = [v async for v in submitted.handle.updates()]
            versions = [v.version for v in views]
            assert versions == sorted(set(versions)), versions
            assert views[-1].state is TaskState.COMPLETED
            assert views[-1].state.final

            done = await on_a.task(submitted.id).wait(timeout=30)
            assert done.result_text() == "done:x"
            assert done.states[0] is TaskState.SUBMITTED
            assert done.states[-1] is TaskState.COMPLETED
            assert seen == [submitted.id], "the agent saw the task id once"

            # Any sidecar of the tenant reads the same task at the same version.
            other = await on_b.task(submitted.id).get()
            assert (other.state, other.version) == (done.state, done.version)

            # The same id again answers the existing task.
            again = await on_a.submit(f"work.{unique}", text="y", task_id=f"t-{unique}")
            assert not again.created
            assert again.task.version == done.version

            # Refusals carry the mesh's reasons.
            with pytest.raises(MeshError) as finished:
                await on_a.task(submitted.id).cancel("too late")
            assert finished.value.reason == "TASK_FINISHED"
            with pytest.raises(MeshError) as not_waiting:
                await on_a.task(submitted.id).answer("nobody asked")
            assert not_waiting.value.reason == "TASK_BAD_TRANSITION"
            with pytest.raises(MeshError) as missing:
                await on_a.task(f"no-such-{unique}").get()
            assert missing.value.reason == "TASK_NOT_FOUND"
            with pytest.raises(InvalidArgument):
                await on_a.submit(f"work.{unique}")

    run(main())
