"""gRPC server reflection on control's port and on a sidecar's local port: any language's
tooling (grpcurl, Postman, code generators) lists and describes the API without our
protos."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from harness import Mesh


def list_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        replies = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        return sorted(s.name for s in replies[0].list_services_response.service)


def test_control_and_sidecar_list_and_describe_their_services(mesh: Mesh) -> None:
    assert list_services(mesh.control_addr) == [
        "agentreach.v1.Admin",
        "agentreach.v1.Control",
        "agentreach.v1.Idempotency",
        "agentreach.v1.Identity",
        "agentreach.v1.Sessions",
        "agentreach.v1.Tasks",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
    assert list_services(mesh.a.local) == [
        "agentreach.v1.Sidecar",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
    # Describe, as grpcurl does: the sidecar's methods and message fields, from the server.
    with grpc.insecure_channel(mesh.a.local) as channel:
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        sidecar = pool.FindServiceByName("agentreach.v1.Sidecar")
        assert [m.name for m in sidecar.methods] == [
            "Register", "Heartbeat", "Deregister", "Route", "Invoke", "InvokeStream",
            "GetSession", "PutSession", "DeleteSession", "WatchSession",
            "SubmitTask", "GetTask", "ListTasks", "CancelTask", "SubscribeTask", "ReportTask", "AnswerTask"]
        invoke = pool.FindMessageTypeByName("agentreach.v1.InvokeRequest")
        assert invoke.fields_by_name["target"].number == 1
        assert invoke.fields_by_name["payload"].number == 2
    with grpc.insecure_channel(mesh.control_addr) as channel:
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        assert "PutPolicy" in [m.name for m in pool.FindServiceByName("agentreach.v1.Admin").methods]
        assert [m.name for m in pool.FindServiceByName("agentreach.v1.Identity").methods] == ["IssueCertificate"]
