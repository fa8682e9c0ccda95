"""A stand-in sidecar (Register, Heartbeat, Deregister) that records what an agent sends,
for tests of the SDK's own behaviour apart from the mesh."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent_reach._proto.agentreach.v1 import sidecar_pb2


@dataclass
class FakeSidecar:
    heartbeat_interval_ms: int = 100
    registrations: list[sidecar_pb2.RegisterRequest] = field(default_factory=list)
    heartbeats: list[tuple[float, sidecar_pb2.HeartbeatRequest]] = field(default_factory=list)
    deregistered: list[str] = field(default_factory=list)
    forget: bool = False
    """When set, the next heartbeat gets NOT_FOUND (the sidecar lost the instance)."""
    server: Any = None

    async def start(self) -> str:
        def register(request: sidecar_pb2.RegisterRequest, context: Any) -> sidecar_pb2.RegisterReply:
            self.registrations.append(request)
            return sidecar_pb2.RegisterReply(
                instance_id=request.instance_id or f"fake-{len(self.registrations)}",
                heartbeat_interval_ms=self.heartbeat_interval_ms, lease_ttl_ms=20000, tenant="default")

        def heartbeat(request: sidecar_pb2.HeartbeatRequest, context: Any) -> sidecar_pb2.HeartbeatReply:
            if self.forget:
                self.forget = False
                context.abort(grpc.StatusCode.NOT_FOUND, f"instance {request.instance_id} is not registered")
            self.heartbeats.append((time.monotonic(), request))
            return sidecar_pb2.HeartbeatReply()

        def deregister(request: sidecar_pb2.DeregisterRequest, context: Any) -> sidecar_pb2.DeregisterReply:
            self.deregistered.append(request.instance_id)
            return sidecar_pb2.DeregisterReply()

        def method(fn: Any, req: Any, rep: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                       response_serializer=rep.SerializeToString)

        # A thread-pool server: it answers while the test's event loop is blocked.
        from concurrent.futures import ThreadPoolExecutor

        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("agentreach.v1.Sidecar", {
            "Register": method(register, sidecar_pb2.RegisterRequest, sidecar_pb2.RegisterReply),
            "Heartbeat": method(heartbeat, sidecar_pb2.HeartbeatRequest, sidecar_pb2.HeartbeatReply),
            "Deregister": method(deregister, sidecar_pb2.DeregisterRequest, sidecar_pb2.DeregisterReply),
        }),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        self.server.stop(None)
