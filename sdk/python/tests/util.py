"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from agent_reach import Client
from agent_reach._proto.agentreach.v1 import admin_pb2, common_pb2, policy_pb2


async def wait_routable(client: Client, capability: str, count: int = 1, timeout: float = 15) -> None:
    """Waits until ``capability`` has at least ``count`` candidates at the client's sidecar."""
    await wait_route(client, capability, lambda r: len(r.candidates) >= count, timeout,
                     f"{count} candidate(s)")


async def wait_route(client: Client, capability: str, pred: Callable[..., bool], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while True:
        try:
            last = await client.route(capability)
            if pred(last):
                return
        except Exception as e:  # noqa: BLE001
            last = e
        if loop.time() > deadline:
            raise AssertionError(f"{capability}: not {what} within {timeout}s (last: {last!r})")
        await asyncio.sleep(0.05)



async def put_capability_policy(control: str, capability: str, spec: policy_pb2.PolicySpec,
                                kind: int = policy_pb2.POLICY_KIND_CAPABILITY) -> None:
    """Stores a capability (or agent) policy through the Admin API."""
    async with grpc.aio.insecure_channel(control) as channel:
        put = channel.unary_unary(
            "/agentreach.v1.Admin/PutPolicy",
            request_serializer=admin_pb2.PutPolicyRequest.SerializeToString,
            response_deserializer=admin_pb2.PutPolicyReply.FromString,
        )
        policy = policy_pb2.Policy(tenant="default", kind=kind, name=capability, spec=spec)
        await put(admin_pb2.PutPolicyRequest(policy=policy), timeout=5)


async def list_instances(control: str, agent: str) -> list[common_pb2.Instance]:
    """The instances of ``agent`` as control's Admin API lists them."""
    async with grpc.aio.insecure_channel(control) as channel:
        call = channel.unary_unary(
            "/agentreach.v1.Admin/ListInstances",
            request_serializer=admin_pb2.ListInstancesRequest.SerializeToString,
            response_deserializer=admin_pb2.ListInstancesReply.FromString,
        )
        reply = await call(admin_pb2.ListInstancesRequest(tenant="default"), timeout=5)
        return [i for i in reply.instances if i.registration.agent == agent]
