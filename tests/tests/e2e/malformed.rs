//! Malformed protobuf sent to every RPC of every service answers INVALID_ARGUMENT with an
//! ErrorInfo, never INTERNAL (one decode-error mapping: `agent_reach::codec`; for the
//! health and reflection services, `agent_reach::strict`; for `lf.a2a.v1.A2AService`, the
//! sidecar's A2A codec built on it). The ports: the sidecar's local API, its mesh port
//! (mutual TLS) and control (mutual TLS).

use std::time::Duration;

use agent_reach::reason::error_info;
use agent_reach_e2e::secure::sidecar_tls;
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, sidecar_config, start_control, start_sidecar, wait_for_instances,
};
use agent_reach_sidecar::identity::TlsConnector;
use bytes::{Buf, BufMut, Bytes};
use tonic::Code;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataMap;
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
async fn send(channel: &Channel, path: &str, streaming: bool, metadata: &MetadataMap) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let mut request = tonic::Request::new(Bytes::from_static(MALFORMED));
    *request.metadata_mut() = metadata.clone();
    let name = path;
    let path = PathAndQuery::try_from(path.to_string()).expect("a method path");
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
    // The mesh port takes a peer sidecar's certificate of the same tenant.
    let mesh = TlsConnector::fixed(sidecar_tls("default", "host-p").client())
        .channel(&format!("http://{}", a.mesh_addr()))
        .expect("mesh channel");
    // A delivery names a live instance of this sidecar (the header is checked before the
    // body is read).
    let target = echo_agent(a.local_addr(), "echo", &[("text.echo", &[])]).await;
    wait_for_instances(&a, &[target.instance_id()]).await;
    let mut mesh_metadata = MetadataMap::new();
    mesh_metadata.insert("ar-tenant", "default".parse().unwrap());
    mesh_metadata.insert("ar-instance", target.instance_id().parse().unwrap());
    let a2a = |method: &str| format!("/lf.a2a.v1.A2AService/{method}");
    let a2a_rows: Vec<(String, bool, &str)> = vec![
        (a2a("SendMessage"), false, "SendMessageRequest"),
        (a2a("SendStreamingMessage"), true, "SendMessageRequest"),
        (a2a("GetTask"), false, "GetTaskRequest"),
        (a2a("ListTasks"), false, "ListTasksRequest"),
        (a2a("CancelTask"), false, "CancelTaskRequest"),
        (a2a("SubscribeToTask"), true, "SubscribeToTaskRequest"),
        (a2a("CreateTaskPushNotificationConfig"), false, "TaskPushNotificationConfig"),
        (a2a("GetTaskPushNotificationConfig"), false, "GetTaskPushNotificationConfigRequest"),
        (a2a("ListTaskPushNotificationConfigs"), false, "ListTaskPushNotificationConfigsRequest"),
        (a2a("GetExtendedAgentCard"), false, "GetExtendedAgentCardRequest"),
        (a2a("DeleteTaskPushNotificationConfig"), false, "DeleteTaskPushNotificationConfigRequest"),
    ];

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
        (&local, "/agentreach.v1.Sidecar/SubmitTask", false, Some("SubmitTaskRequest")),
        (&local, "/agentreach.v1.Sidecar/GetTask", false, Some("GetTaskRequest")),
        (&local, "/agentreach.v1.Sidecar/ListTasks", false, Some("ListTasksRequest")),
        (&local, "/agentreach.v1.Sidecar/CancelTask", false, Some("CancelTaskRequest")),
        (&local, "/agentreach.v1.Sidecar/SubscribeTask", true, Some("SubscribeTaskRequest")),
        (&local, "/agentreach.v1.Sidecar/ReportTask", false, Some("ReportTaskRequest")),
        (&local, "/agentreach.v1.Sidecar/AnswerTask", false, Some("AnswerTaskRequest")),
        (&mesh, "/agentreach.v1.Mesh/Deliver", false, Some("HandleRequest")),
        (&mesh, "/agentreach.v1.Mesh/DeliverStream", true, Some("HandleRequest")),
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
        (&control_channel, "/agentreach.v1.Admin/GetSession", false, Some("GetSessionRequest")),
        (&control_channel, "/agentreach.v1.Tasks/CreateTask", false, Some("CreateTaskRequest")),
        (&control_channel, "/agentreach.v1.Tasks/GetTask", false, Some("GetTaskRequest")),
        (&control_channel, "/agentreach.v1.Tasks/ListTasks", false, Some("ListTasksRequest")),
        (&control_channel, "/agentreach.v1.Tasks/UpdateTask", false, Some("UpdateTaskRequest")),
        (&control_channel, "/agentreach.v1.Tasks/WatchTask", true, Some("WatchTaskRequest")),
        (&control_channel, "/agentreach.v1.Idempotency/ClaimKey", false, Some("ClaimKeyRequest")),
        (&control_channel, "/agentreach.v1.Idempotency/SettleKey", false, Some("SettleKeyRequest")),
    ];
    let table = table
        .into_iter()
        .map(|(channel, path, streaming, message)| (channel, path.to_string(), streaming, message))
        .chain(a2a_rows.into_iter().map(|(path, streaming, message)| (&local, path, streaming, Some(message))));
    let mut checked = 0;
    for (channel, path, streaming, message) in table {
        checked += 1;
        let path = path.as_str();
        let metadata = if path.starts_with("/agentreach.v1.Mesh/") { &mesh_metadata } else { &MetadataMap::new() };
        let status = send(channel, path, streaming, metadata).await;
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

    // Every RPC of the local API (Sidecar 17, A2A 11, health 2, reflection 2), the mesh port
    // (2) and control (Control 4, Admin 20, Identity 1, Sessions 4, Tasks 5, Idempotency 2,
    // health 2, reflection 2).
    assert_eq!(checked, 32 + 2 + 40);

    assert_eq!(target.handled(), 0, "no malformed delivery reached the agent");
    a.shutdown().await;
    control.shutdown().await;
}
