"""The session a sidecar delivers with a call (``HandleRequest.session``): reads answered
in-process from it, the fallbacks to the sidecar, and the handler's own writes. No mesh: the
sidecar address is closed, so a read that falls back fails with ``UNAVAILABLE``."""

from __future__ import annotations

import grpc
import pytest

from agent_reach import Call, ContextConflict
from agent_reach._proto.agentreach.v1 import agent_pb2, session_pb2
from agent_reach.errors import MeshError
from agent_reach.session import Session, _Delivered
from conftest import run


def _call(session_id: str = "s-1", version: int = 7) -> Call:
    fields = [
        session_pb2.SessionField(name="order_id", value=b"o-7", version=3, writer_agent="intake"),
        session_pb2.SessionField(name="draft", value=b"x", version=5),
    ]
    delivered = session_pb2.DeliveredSession(session_id="s-1", version=version, fields=fields)
    return Call(agent_pb2.HandleRequest(session_id=session_id, instance_id="refund-1", session=delivered), "refund")


def _went_to_sidecar(e: pytest.ExceptionInfo[MeshError]) -> None:
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value


def _session(call: Call, channel: grpc.aio.Channel) -> Session:
    # What call.session() builds (a call built by hand has no client to build it from).
    return Session(channel, call.session_id, call.instance_id, delivered=call._delivered)


def test_reads_come_from_the_delivered_session_and_fall_back_when_it_cannot_answer() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        s = _session(_call(), channel)
        order = await s.get("order_id")
        assert order is not None and (order.value, order.version, order.writer_agent) == (b"o-7", 3, "intake")
        assert await s.get("missing") is None  # the snapshot is whole: known absent
        whole = await s.read()
        assert (whole.found, whole.version, sorted(whole.fields), whole.delivered) == (True, 7, ["draft", "order_id"], True)
        assert sorted((await s.read(fields=["draft"])).fields) == ["draft"]
        assert (s.delivered_reads, s.delivered_version) == (4, 7)
        with pytest.raises(MeshError) as e:
            await s.read(min_version=8)  # newer than delivered: the sidecar
        _went_to_sidecar(e)
        assert s.delivered_reads == 4
        await channel.close()

    run(main())


def test_a_snapshot_of_another_session_is_ignored() -> None:
    assert _call(session_id="s-2")._delivered is None
    assert Call(agent_pb2.HandleRequest(session_id="s-1"), "c")._delivered is None


def test_own_writes_update_the_snapshot_and_a_conflict_drops_it() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        call = _call()
        s = _session(call, channel)
        d = call._delivered
        assert d is not None
        write = session_pb2.SessionFieldWrite(name="status", value=b"paid", policy=session_pb2.WRITE_POLICY_FIRST_WRITER)
        d.wrote([write], "refund-1", 12)
        status = await s.get("status")
        assert status is not None
        assert (status.value, status.version, status.writer_instance, status.locked) == (b"paid", 12, "refund-1", True)
        with pytest.raises(MeshError) as e:
            await s.read()  # others may have written since delivery: the whole session comes from the sidecar
        _went_to_sidecar(e)
        d.deleted(["draft"])
        assert await s.get("draft") is None
        # Another session of the same call shares it.
        assert _session(call, channel).delivered_reads == 2
        d.refused(ContextConflict("conflict", code=grpc.StatusCode.ABORTED))
        assert s.delivered_version is None
        with pytest.raises(MeshError) as e:
            await s.get("order_id")
        _went_to_sidecar(e)
        await channel.close()

    run(main())
