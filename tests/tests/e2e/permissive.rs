//! Permissive mutual TLS (migration only), end to end on a real etcd with certificates
//! made in the test: control's port (`--mtls permissive`) and a sidecar's mesh port
//! (`--mesh-mtls permissive`) serve plaintext connections as well as TLS ones, count each
//! plaintext connection, and still check every certificate that is presented.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach_control::identity::{IdentityConfig, Mtls};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::*;
use agent_reach_identity::{Ca, TlsConfigs, WorkloadId};
use agent_reach_sidecar::identity::TlsConnector;
use tonic::Code;

use crate::cross_tenant::http_get;
use crate::identity::{anonymous_channel, create_token, identity_settings, made_configs, mtls_control, reason};

const TD: &str = agent_reach_identity::DEFAULT_TRUST_DOMAIN;

fn watch(tenant: &str) -> proto::WatchRequest {
    proto::WatchRequest {
        tenant: tenant.into(),
        sidecar: Some(proto::SidecarIdentity { sidecar_id: "x".into(), mesh_address: "127.0.0.1:1".into() }),
        from_revision: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permissive_control_port_serves_plaintext_as_anonymous_and_counts_it() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let config = ControlConfig {
        mtls: Mtls::Permissive,
        identity: Some(IdentityConfig {
            ca: Arc::new(Ca::generate(TD).unwrap()),
            cert_ttl: agent_reach_identity::DEFAULT_CERT_TTL,
        }),
        ..ControlConfig::default()
    };
    let control = ControlHandle::spawn(store.store.clone(), config, listener().await).expect("control");
    let plaintext = tonic::transport::Endpoint::from_shared(control.endpoint()).unwrap().connect_lazy();
    let mut stream = ControlClient::new(plaintext.clone())
        .watch(watch("team-b"))
        .await
        .expect("a plaintext watch passes in permissive mode")
        .into_inner();
    assert!(stream.message().await.expect("snapshot").is_some());
    let stats = control.stats();
    assert_eq!(stats.anonymous_calls.load(Ordering::Relaxed), 1, "the plaintext call is anonymous");
    assert_eq!(stats.tls.plaintext.load(Ordering::Relaxed), 1, "one plaintext connection");
    assert_eq!(stats.tls.accepted.load(Ordering::Relaxed), 0);

    // TLS on the same port: without a certificate anonymous, with one checked as ever.
    let mut anonymous =
        ControlClient::new(anonymous_channel(&control)).watch(watch("team-b")).await.unwrap().into_inner();
    assert!(anonymous.message().await.expect("snapshot").is_some());
    assert_eq!(stats.anonymous_calls.load(Ordering::Relaxed), 2);
    let now = SystemTime::now();
    let uri = WorkloadId::new(TD, "team-a", "x").uri();
    let team_a = made_configs(control.ca(), &uri, now, now + Duration::from_secs(3600), control.ca().bundle_pem());
    let channel = TlsConnector::fixed(team_a.client()).channel(&control.endpoint()).unwrap();
    let status = ControlClient::new(channel).watch(watch("team-b")).await.expect_err("team-a's certificate");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    assert_eq!(stats.tls.accepted.load(Ordering::Relaxed), 2, "two TLS handshakes");
    assert_eq!(stats.tls.plaintext.load(Ordering::Relaxed), 1, "the plaintext connection was reused");
    assert_eq!(stats.anonymous_calls.load(Ordering::Relaxed), 2, "a certificate is not anonymous");
}

async fn metric(sidecar: &agent_reach_sidecar::Sidecar, series: &str) -> u64 {
    let text = http_get(sidecar.admin_addr().expect("admin port"), "/metrics").await;
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or_else(|| panic!("{series}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permissive_mesh_port_serves_plaintext_and_still_checks_certificates() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = proto::admin_client::AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "team-a", 0, false).await;
    let config = |id: &'static str, permissive: bool| {
        let mut config = sidecar_config(&control.endpoint(), id);
        config.tenant = "team-a".into();
        config.identity = Some(identity_settings(&control, &token));
        config.mesh_permissive = permissive;
        config
    };
    let a = start_sidecar(config("perm-a", false)).await;
    let b = start_sidecar_with_admin(config("perm-b", true)).await;
    let target = echo_agent(b.local_addr(), "echo", &[("text.echo", &[])]).await;
    wait_for_instances(&a, &[target.instance_id()]).await;
    let series = "agent_reach_mesh_plaintext_connections_total";
    assert_eq!(metric(&b, series).await, 0);

    // Sidecar to sidecar: mutual TLS as in the required mode.
    let caller = echo_agent(a.local_addr(), "caller", &[("noop", &[])]).await;
    let reply = caller.client().invoke("text.echo").text("hi").send().await.expect("call over mTLS");
    assert!(reply.text().ends_with(":hi"), "{}", reply.text());
    assert_eq!(metric(&b, series).await, 0, "the sidecars spoke TLS");

    let deliver = |configs: Option<&TlsConfigs>, text: &str| {
        let mesh = format!("http://{}", b.mesh_addr());
        let channel = match configs {
            Some(c) => TlsConnector::fixed(c.client()).channel(&mesh).unwrap(),
            None => tonic::transport::Endpoint::from_shared(mesh).unwrap().connect_lazy(),
        };
        let mut request = tonic::Request::new(proto::HandleRequest {
            capability: "text.echo".into(),
            instance_id: target.instance_id(),
            payload: text.as_bytes().to_vec().into(),
            content_type: "text/plain".into(),
            ..Default::default()
        });
        request.metadata_mut().insert("ar-tenant", "team-a".parse().unwrap());
        request.metadata_mut().insert("ar-instance", target.instance_id().parse().unwrap());
        async move { proto::mesh_client::MeshClient::new(channel).deliver(request).await }
    };
    // A plaintext Deliver (a sidecar not migrated yet) is served, and counted.
    let reply = deliver(None, "plain").await.expect("plaintext Deliver on a permissive port").into_inner();
    assert!(String::from_utf8_lossy(&reply.payload).ends_with(":plain"), "{reply:?}");
    assert_eq!(target.handled(), 2);
    assert_eq!(metric(&b, series).await, 1);

    // A certificate is still checked: another tenant's is refused with its reason.
    let now = SystemTime::now();
    let uri = WorkloadId::new(TD, "team-b", "evil").uri();
    let team_b = made_configs(control.ca(), &uri, now, now + Duration::from_secs(3600), control.ca().bundle_pem());
    let status = deliver(Some(&team_b), "evil").await.expect_err("another tenant's certificate");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    assert_eq!(target.handled(), 2, "the refused call did not reach the agent");
    assert_eq!(metric(&b, series).await, 1, "a TLS connection is not counted as plaintext");
}
