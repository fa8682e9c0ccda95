//! Malformed protobuf sent to every RPC of every service answers INVALID_ARGUMENT with an
//! ErrorInfo, never INTERNAL (one decode-error mapping: `agent_reach::codec`; for the
//! health and reflection services, `agent_reach::strict`).

use std::time::Duration;

use agent_reach::reason::error_info;
use agent_reach_e2e::{Backend, TestStore, init_logging, sidecar_config, start_control, start_sidecar};
use bytes::{Buf, BufMut, Bytes};
use tonic::Code;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// Sends and receives raw bytes as gRPC messages.
#[derive(Default)]
struct RawCodec;

struct Raw;

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// Field 1, length-delimited, says 255 bytes follow and none do: no message decodes it.
const MALFORMED: &[u8] = &[0x0a, 0xff, 0x01];

/// Sends `MALFORMED` to `path`; the status of the answer.
async fn send(channel: &Channel, path: &'static str, streaming: bool) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let request = tonic::Request::new(Bytes::from_static(MALFORMED));
    let name = path;
    let path = PathAndQuery::from_static(path);
    if name.ends_with("/ServerReflectionInfo") {
        // Bidirectional: one malformed message, then the end of the request stream.
        let request = tonic::Request::new(futures_util::stream::once(async { Bytes::from_static(MALFORMED) }));
        return match grpc.streaming(request, path, RawCodec).await {
            Ok(reply) => match reply.into_inner().message().await {
                Err(status) => status,
                Ok(m) => panic!("{name}: a malformed request got {m:?} and no error"),
            },
            Err(status) => status,
        };
    }
    if streaming {
        match grpc.server_streaming(request, path, RawCodec).await {
            Ok(reply) => {
                let mut stream = reply.into_inner();
                match stream.message().await {
                    Err(status) => status,
                    Ok(m) => panic!("{name}: a malformed request got a message: {m:?}"),
                }
            }
            Err(status) => status,
        }
    } else {
        grpc.unary(request, path, RawCodec).await.expect_err("a malformed request must fail")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_answers_invalid_argument_on_every_rpc() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let local = Channel::from_shared(format!("http://{}", a.local_addr())).unwrap().connect().await.unwrap();
    // Over mutual TLS with a sidecar certificate: malformed bodies are refused after the
    // handshake, at decoding.
    let control_channel = agent_reach_e2e::secure::channel_as(&control.endpoint(), "default", "host-m");

    // (channel, method path, server-streaming, request message type or None when the
    // handler is the sidecar's own forwarding path with its own message).
    let table: Vec<(&Channel, &'static str, bool, Option<&str>)> = vec![
        (&local, "/agentreach.v1.Sidecar/Register", false, Some("RegisterRequest")),
        (&local, "/agentreach.v1.Sidecar/Heartbeat", false, Some("HeartbeatRequest")),
        (&local, "/agentreach.v1.Sidecar/Deregister", false, Some("DeregisterRequest")),
        (&local, "/agentreach.v1.Sidecar/Route", false, Some("RouteRequest")),
        (&local, "/agentreach.v1.Sidecar/Invoke", false, None),
        (&local, "/agentreach.v1.Sidecar/InvokeStream", true, None),
        (&local, "/agentreach.v1.Sidecar/GetSession", false, Some("GetSessionRequest")),
        (&local, "/agentreach.v1.Sidecar/PutSession", false, Some("PutSessionRequest")),
        (&local, "/agentreach.v1.Sidecar/DeleteSession", false, Some("DeleteSessionRequest")),
        (&local, "/agentreach.v1.Sidecar/WatchSession", true, Some("WatchSessionRequest")),
        (&local, "/grpc.health.v1.Health/Check", false, Some("HealthCheckRequest")),
        (&local, "/grpc.health.v1.Health/Watch", true, Some("HealthCheckRequest")),
        (&local, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true, Some("ServerReflectionRequest")),
        (
            &local,
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            true,
            Some("ServerReflectionRequest"),
        ),
        (&control_channel, "/grpc.health.v1.Health/Check", false, Some("HealthCheckRequest")),
        (&control_channel, "/grpc.health.v1.Health/Watch", true, Some("HealthCheckRequest")),
        (
            &control_channel,
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            true,
            Some("ServerReflectionRequest"),
        ),
        (
            &control_channel,
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            true,
            Some("ServerReflectionRequest"),
        ),
        (&control_channel, "/agentreach.v1.Control/Register", false, Some("ControlRegisterRequest")),
        (&control_channel, "/agentreach.v1.Control/Heartbeat", false, Some("ControlHeartbeatRequest")),
        (&control_channel, "/agentreach.v1.Control/Deregister", false, Some("ControlDeregisterRequest")),
        (&control_channel, "/agentreach.v1.Control/Watch", true, Some("WatchRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListAgents", false, Some("ListAgentsRequest")),
        (&control_channel, "/agentreach.v1.Admin/GetAgent", false, Some("GetAgentRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListInstances", false, Some("ListInstancesRequest")),
        (&control_channel, "/agentreach.v1.Admin/GetInstance", false, Some("GetInstanceRequest")),
        (&control_channel, "/agentreach.v1.Admin/SetInstanceState", false, Some("SetInstanceStateRequest")),
        (&control_channel, "/agentreach.v1.Admin/SetAgentState", false, Some("SetAgentStateRequest")),
        (&control_channel, "/agentreach.v1.Admin/PutPolicy", false, Some("PutPolicyRequest")),
        (&control_channel, "/agentreach.v1.Admin/GetPolicy", false, Some("GetPolicyRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListPolicies", false, Some("ListPoliciesRequest")),
        (&control_channel, "/agentreach.v1.Admin/DeletePolicy", false, Some("DeletePolicyRequest")),
        (&control_channel, "/agentreach.v1.Admin/PutTenant", false, Some("PutTenantRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListTenants", false, Some("ListTenantsRequest")),
        (&control_channel, "/agentreach.v1.Admin/ExplainRoute", false, Some("ExplainRouteRequest")),
        (&control_channel, "/agentreach.v1.Admin/CreateJoinToken", false, Some("CreateJoinTokenRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListJoinTokens", false, Some("ListJoinTokensRequest")),
        (&control_channel, "/agentreach.v1.Admin/RevokeJoinToken", false, Some("RevokeJoinTokenRequest")),
        (&control_channel, "/agentreach.v1.Admin/CreateOperatorToken", false, Some("CreateOperatorTokenRequest")),
        (&control_channel, "/agentreach.v1.Admin/ListOperatorTokens", false, Some("ListOperatorTokensRequest")),
        (&control_channel, "/agentreach.v1.Admin/RevokeOperatorToken", false, Some("RevokeOperatorTokenRequest")),
        (&control_channel, "/agentreach.v1.Identity/IssueCertificate", false, Some("IssueCertificateRequest")),
        (&control_channel, "/agentreach.v1.Sessions/GetSession", false, Some("GetSessionRequest")),
        (&control_channel, "/agentreach.v1.Sessions/PutSession", false, Some("PutSessionRequest")),
        (&control_channel, "/agentreach.v1.Sessions/DeleteSession", false, Some("DeleteSessionRequest")),
        (&control_channel, "/agentreach.v1.Sessions/WatchSession", true, Some("WatchSessionRequest")),
    ];
    for (channel, path, streaming, message) in table {
        let status = send(channel, path, streaming).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status:?}");
        let info = error_info(&status).unwrap_or_else(|| panic!("{path}: no ErrorInfo in {status:?}"));
        assert_eq!(info.reason, "INVALID_ARGUMENT", "{path}");
        assert!(status.message().len() <= 1024, "{path}: {} bytes", status.message().len());
        if let Some(message) = message {
            assert_eq!(info.metadata.get("field").map(String::as_str), Some("request"), "{path}");
            // e.g. "...(failed to decode Protobuf message: RegisterRequest.registration: buffer underflow)"
            let prefix =
                format!("invalid request: not a valid {message} protobuf message (failed to decode Protobuf message: ");
            assert!(status.message().starts_with(&prefix), "{path}: {}", status.message());
            // ... naming the field that failed ("RegisterRequest.registration: buffer underflow",
            // "CreateOperatorTokenRequest.role: invalid wire type"), or the buffer when the
            // message has no field 1.
            let field = format!("(failed to decode Protobuf message: {message}.");
            assert!(
                status.message().contains(&field) || status.message().ends_with(": buffer underflow)"),
                "{path}: {}",
                status.message()
            );
        }
    }

    a.shutdown().await;
    control.shutdown().await;
}
