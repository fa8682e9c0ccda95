"""The package under test is the installed wheel, with its stubs and type marker."""

from __future__ import annotations

import os
from pathlib import Path

import agent_reach
from agent_reach import Call, Reply
from agent_reach._proto.agentreach.v1 import agent_pb2, sidecar_pb2


def test_the_tests_run_against_the_installed_package() -> None:
    location = Path(agent_reach.__file__).resolve()
    if os.environ.get("AGENT_REACH_EXPECT_INSTALLED"):
        assert "site-packages" in location.parts, location
    assert (location.parent / "py.typed").exists()
    assert (location.parent / "_proto" / "agentreach" / "v1" / "sidecar_pb2.pyi").exists()


def test_the_shipped_stubs_keep_the_wire_contract() -> None:
    # HandleRequest fields 1..15 are InvokeRequest's, so the mesh forwards callers' bytes.
    invoke = sidecar_pb2.InvokeRequest.DESCRIPTOR.fields_by_number
    handle = agent_pb2.HandleRequest.DESCRIPTOR.fields_by_number
    for number, field in invoke.items():
        assert handle[number].name == field.name


def test_a_handler_can_be_unit_tested_with_a_call_built_by_hand() -> None:
    call = Call.for_test("text.summarize", "hello world", session_id="s-1")
    assert (call.text(), call.capability, call.session_id) == ("hello world", "text.summarize", "s-1")
    assert call.time_remaining() is None and not call.cancelled()
    assert Reply.text("hi").payload == b"hi"
    assert Reply.json({"a": 1}).content_type == "application/json"
