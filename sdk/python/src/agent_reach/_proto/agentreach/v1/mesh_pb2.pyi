from agent_reach._proto.agentreach.v1 import agent_pb2 as _agent_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
