from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class IssueCertificateRequest(_message.Message):
    __slots__ = ("tenant", "sidecar_id", "csr_pem", "join_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    sidecar_id: str
    csr_pem: str
    join_token: str
    def __init__(self, tenant: _Optional[str] = ..., sidecar_id: _Optional[str] = ..., csr_pem: _Optional[str] = ..., join_token: _Optional[str] = ...) -> None: ...

class IssueCertificateReply(_message.Message):
    __slots__ = ("certificate_pem", "trust_bundle_pem", "not_after_unix_ms", "spiffe_id")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    TRUST_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: str
    trust_bundle_pem: str
    not_after_unix_ms: int
    spiffe_id: str
    def __init__(self, certificate_pem: _Optional[str] = ..., trust_bundle_pem: _Optional[str] = ..., not_after_unix_ms: _Optional[int] = ..., spiffe_id: _Optional[str] = ...) -> None: ...
