//! The abuses of `abuse_rss` against the control service in a process of its own
//! (`control-proc`, built from the current source, on a real etcd), on its gRPC port with
//! mutual TLS required (`--mtls required`, the harness CA given as its CA files, so the
//! abusers present harness certificates of sidecar "abuser"): for each, control's resident
//! set stays within +20 MB of what it was just before the abuse started, and a legitimate
//! client (Control-port calls 10 ms apart: the gRPC health check with a sidecar
//! certificate, alternating with an Admin `ListAgents` with the bootstrap admin token)
//! sees no failed call and a p99 within 2x of its p99 without the abuse, measured as
//! `abuse_rss` measures them.
//!
//! Replies stalled at window 0 get their connection closed after `--send-stall-timeout`
//! (1.5 s here), which the stall abuser waits for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent_reach::proto;
use agent_reach_e2e::secure::{ADMIN_TOKEN, AdminToken, TRUST_DOMAIN, ca, sidecar_tls};
use agent_reach_e2e::{Backend, TestStore, init_logging};
use agent_reach_sidecar::identity::TlsConnector;
use bytes::Bytes;

use crate::abuse::{EMPTY_MESSAGE, HEALTH_CHECK};
use crate::abuse_rss::{
    ALL, BODY_TIMEOUT, Call, HEADER_READ_TIMEOUT, Target, assert_rows, measured, ready_addr, spawn_ready, warm_up,
};

/// Control in its own process; killed when dropped.
struct ControlProc {
    child: std::process::Child,
    addr: SocketAddr,
}

impl ControlProc {
    /// Control on `etcd` with the harness CA and bootstrap admin token (their files in
    /// `dir`), mutual TLS required.
    fn start(etcd: &str, dir: &std::path::Path) -> ControlProc {
        let file = |name: &str, contents: &str| {
            let path = dir.join(name);
            std::fs::write(&path, contents).unwrap();
            path.to_str().unwrap().to_string()
        };
        let ca = ca();
        let (cert, key, token) =
            (file("ca.pem", ca.cert_pem()), file("ca-key.pem", ca.key_pem()), file("admin-token", ADMIN_TOKEN));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_control-proc"));
        cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "off", "--dashboard-listen", "off"])
            .args(["--etcd-endpoints", etcd, "--lease-ttl", "15s"])
            .args(["--ca-cert-file", &cert, "--ca-key-file", &key, "--admin-token-file", &token, "--mtls", "required"])
            .args(["--header-read-timeout", HEADER_READ_TIMEOUT, "--request-timeout", BODY_TIMEOUT])
            .args(["--max-concurrent-streams", "32", "--send-stall-timeout", "1500ms"])
            .env("RUST_LOG", "warn");
        let (child, line) = spawn_ready(cmd);
        ControlProc { addr: ready_addr(&line, "grpc="), child }
    }
}

impl Drop for ControlProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_each_abuse_the_control_process_stays_within_20_mb_and_legitimate_p99_within_2x() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let proc = ControlProc::start(&ts.etcd.as_ref().expect("etcd").endpoint(), dir.path());
    let endpoint = format!("http://{}", proc.addr);

    // The legitimate client: a sidecar's health check over mutual TLS, and an operator's
    // Admin read over TLS with the bootstrap token (no client certificate), in turn.
    let sidecar = TlsConnector::fixed(sidecar_tls("default", "well-behaved").client()).channel(&endpoint).unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(sidecar);
    let operator = agent_reach_identity::tls::bootstrap_client(ca().bundle_pem(), TRUST_DOMAIN).unwrap();
    let operator = TlsConnector::fixed(Arc::new(operator)).channel(&endpoint).unwrap();
    let admin = proto::admin_client::AdminClient::with_interceptor(operator, AdminToken);
    let turn = Arc::new(AtomicU64::new(0));
    let call: Call = Arc::new(move || {
        let (mut health, mut admin) = (health.clone(), admin.clone());
        let admin_turn = turn.fetch_add(1, Ordering::Relaxed) % 2 == 1;
        Box::pin(async move {
            let call = async {
                if admin_turn {
                    let request = proto::ListAgentsRequest { tenant: "default".into(), filter: None };
                    admin.list_agents(request).await.map(|_| ())
                } else {
                    use tonic_health::pb::health_check_response::ServingStatus;
                    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
                    let status = health.check(request).await?.into_inner().status;
                    if status == ServingStatus::Serving as i32 {
                        Ok(())
                    } else {
                        Err(tonic::Status::unknown(format!("health status {status}")))
                    }
                }
            };
            match tokio::time::timeout(Duration::from_secs(5), call).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(status)) => Err(format!("{status:?}")),
                Err(_) => Err("no answer within 5 s".into()),
            }
        })
    });
    warm_up(&call, "control").await;

    let target = Target {
        addr: proc.addr,
        tls: true,
        path: "/agentreach.v1.Control/Register",
        headers: Vec::new(),
        // A reply with a body (a Register without a registration is refused trailers-only,
        // which needs no window).
        stall_path: HEALTH_CHECK,
        stall_body: Bytes::from_static(EMPTY_MESSAGE),
        stall_reset: false,
        slow_body_limit: "request-timeout",
        flood_p99_factor: 2,
        reset_p99_factor: 2,
    };
    let mut report = Vec::new();
    for abuse in ALL {
        report.push(measured(&call, proc.child.id(), abuse, &target, format!("{abuse:?} on control's port")).await);
    }
    assert_rows(report, "control");
}
