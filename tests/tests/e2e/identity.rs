//! Identity end to end, on a real etcd with certificates made in the test: join tokens
//! buying workload certificates (and every way they are refused), sidecars speaking mutual
//! TLS to control, and Control calls refused when their tenant, sidecar or instance is not
//! the caller's certificate's. Each refusal is checked with its reason and with the
//! store's revision unchanged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agent_reach::proto;
use agent_reach::proto::admin_client::AdminClient;
use agent_reach::proto::control_client::ControlClient;
use agent_reach::proto::identity_client::IdentityClient;
use agent_reach_control::identity::{IdentityConfig, Mtls};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::*;
use agent_reach_identity::{Ca, ClientAuth, Credentials, ExpectedPeer, PeerId, TlsConfigs, WorkloadId, WorkloadKey};
use agent_reach_sidecar::identity::{IdentitySettings, TlsConnector};
use tonic::Code;
use tonic::transport::Channel;

const TD: &str = agent_reach_identity::DEFAULT_TRUST_DOMAIN;

pub(crate) fn reason(status: &tonic::Status) -> String {
    agent_reach::reason::error_info(status).map(|i| i.reason).unwrap_or_default()
}

/// Control with mutual TLS required, on `store`, with certificates of `cert_ttl`.
pub(crate) async fn mtls_control(store: &TestStore, cert_ttl: Duration) -> ControlHandle {
    let ca = Arc::new(Ca::generate(TD).expect("CA"));
    let config = ControlConfig {
        mtls: Mtls::Required,
        identity: Some(IdentityConfig { ca, cert_ttl }),
        lease_ttl: Duration::from_secs(5),
        ..ControlConfig::default()
    };
    ControlHandle::spawn(store.store.clone(), config, listener().await).expect("control")
}

/// A channel to control that checks control's certificate but presents none.
pub(crate) fn anonymous_channel(control: &ControlHandle) -> Channel {
    let config = agent_reach_identity::tls::bootstrap_client(control.ca().bundle_pem(), TD).expect("client config");
    TlsConnector::fixed(Arc::new(config)).channel(&control.endpoint()).expect("channel")
}

/// A channel presenting `configs`' certificate.
fn channel_as(control: &ControlHandle, configs: &TlsConfigs) -> Channel {
    TlsConnector::fixed(configs.client()).channel(&control.endpoint()).expect("channel")
}

/// TLS configurations of a certificate `ca` made for `uri`, valid from `from` to `to`;
/// control is checked against `bundle`.
pub(crate) fn made_configs(ca: &Ca, uri: &str, from: SystemTime, to: SystemTime, bundle: &str) -> TlsConfigs {
    let (issued, key) = ca.issue_with_key(uri, from, to).expect("issue");
    let creds = Credentials::from_pem(&issued.cert_pem, &key, bundle).expect("credentials");
    TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain).expect("configs")
}

pub(crate) async fn create_token(
    admin: &mut AdminClient<Channel>,
    tenant: &str,
    ttl_ms: u64,
    single_use: bool,
) -> (String, String) {
    let reply = admin
        .create_join_token(proto::CreateJoinTokenRequest {
            tenant: tenant.into(),
            ttl_ms,
            single_use,
            description: "e2e".into(),
        })
        .await
        .expect("create join token")
        .into_inner();
    (reply.token.expect("token").id, reply.secret)
}

fn csr_request(tenant: &str, sidecar: &str, token: &str) -> proto::IssueCertificateRequest {
    let key = WorkloadKey::generate().unwrap();
    proto::IssueCertificateRequest {
        tenant: tenant.into(),
        sidecar_id: sidecar.into(),
        csr_pem: key.csr_pem(&WorkloadId::new(TD, tenant, sidecar)).unwrap(),
        join_token: token.into(),
    }
}

/// Settings for a sidecar of `tenant` holding `token`.
pub(crate) fn identity_settings(control: &ControlHandle, token: &str) -> IdentitySettings {
    IdentitySettings {
        trust_domain: TD.into(),
        trust_bundle_pem: control.ca().bundle_pem().to_string(),
        join_token: token.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_tokens_buy_certificates_and_every_refusal_writes_nothing() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let channel = anonymous_channel(&control);
    let mut admin = AdminClient::new(channel.clone());
    let mut identity = IdentityClient::new(channel);

    let (_, reusable) = create_token(&mut admin, "team-a", 0, false).await;
    let (_, once) = create_token(&mut admin, "team-a", 0, true).await;
    let (revoked_id, revoked) = create_token(&mut admin, "team-a", 0, false).await;
    let (_, expired) = create_token(&mut admin, "team-a", 1, false).await;
    admin
        .revoke_join_token(proto::RevokeJoinTokenRequest { tenant: "team-a".into(), id: revoked_id.clone() })
        .await
        .expect("revoke");
    // Another tenant's operator view does not show team-a's tokens; team-a's shows four.
    let listed = admin.list_join_tokens(proto::ListJoinTokensRequest { tenant: "team-a".into() }).await.unwrap();
    assert_eq!(listed.into_inner().tokens.len(), 4);
    let listed = admin.list_join_tokens(proto::ListJoinTokensRequest { tenant: "team-b".into() }).await.unwrap();
    assert!(listed.into_inner().tokens.is_empty());
    tokio::time::sleep(Duration::from_millis(5)).await;

    // A good token buys a 24 h certificate for exactly the requested identity.
    let reply = identity.issue_certificate(csr_request("team-a", "s1", &reusable)).await.expect("issue").into_inner();
    let cert = agent_reach_identity::tls::parse_certs(&reply.certificate_pem).unwrap();
    let info = agent_reach_identity::cert_info(&cert[0]).unwrap();
    assert_eq!(info.peer, PeerId::Sidecar(WorkloadId::new(TD, "team-a", "s1")));
    assert_eq!(reply.spiffe_id, format!("spiffe://{TD}/tenant/team-a/sidecar/s1"));
    let life = info.not_after.duration_since(SystemTime::now()).unwrap();
    assert!(life > Duration::from_secs(24 * 3600 - 60) && life <= Duration::from_secs(24 * 3600), "{life:?}");
    assert_eq!(reply.trust_bundle_pem, control.ca().bundle_pem());
    identity.issue_certificate(csr_request("team-a", "s2", &once)).await.expect("single-use, first use");

    let cases: Vec<(&str, proto::IssueCertificateRequest, Code, &str)> = vec![
        ("revoked", csr_request("team-a", "s3", &revoked), Code::Unauthenticated, "JOIN_TOKEN_REVOKED"),
        ("expired", csr_request("team-a", "s3", &expired), Code::Unauthenticated, "JOIN_TOKEN_EXPIRED"),
        ("used", csr_request("team-a", "s3", &once), Code::Unauthenticated, "JOIN_TOKEN_USED"),
        ("another tenant", csr_request("team-b", "s3", &reusable), Code::PermissionDenied, "TENANT_MISMATCH"),
        ("made up", csr_request("team-a", "s3", "arjt.00ff.nope"), Code::Unauthenticated, "JOIN_TOKEN_INVALID"),
        ("no token, no certificate", csr_request("team-a", "s3", ""), Code::Unauthenticated, "UNAUTHENTICATED"),
    ];
    for (what, request, code, want) in cases {
        let before = store.store.current_revision().await.unwrap();
        let status = identity.issue_certificate(request).await.expect_err(what);
        assert_eq!((status.code(), reason(&status).as_str()), (code, want), "{what}: {status:?}");
        assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "{what} wrote to the store");
    }
    let mut bad_csr = csr_request("team-a", "s4", &reusable);
    bad_csr.csr_pem = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into();
    let status = identity.issue_certificate(bad_csr).await.expect_err("bad CSR");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(agent_reach::reason::error_info(&status).unwrap().metadata["field"], "csr_pem");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_calls_come_from_the_callers_certificate() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "team-a", 0, false).await;

    // Two sidecars of team-a buy certificates and work over mutual TLS.
    let mut config = sidecar_config(&control.endpoint(), "sc-a");
    config.tenant = "team-a".into();
    config.identity = Some(identity_settings(&control, &token));
    let a = start_sidecar(config).await;
    let mut config = sidecar_config(&control.endpoint(), "sc-b");
    config.tenant = "team-a".into();
    config.identity = Some(identity_settings(&control, &token));
    let b = start_sidecar(config).await;
    let agent_b = echo_agent(b.local_addr(), "echo", &[("text.echo", &[])]).await;
    wait_for_instances(&a, &[agent_b.instance_id().to_string()]).await;
    let b_lease = b.registry().lease();
    assert_eq!(a.identity_stats().unwrap().issued.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Sidecar A's certificate, used for calls A must not make.
    let a_tls = a.tls().expect("sidecar a has a certificate");
    let mut as_a = ControlClient::new(channel_as(&control, &a_tls));
    let ident = |id: &str| Some(proto::SidecarIdentity { sidecar_id: id.into(), mesh_address: "127.0.0.1:1".into() });
    let register = |tenant: &str, sidecar: &str| proto::ControlRegisterRequest {
        tenant: tenant.into(),
        sidecar: ident(sidecar),
        instance_id: "intruder-1".into(),
        registration: Some(proto::AgentRegistration {
            agent: "intruder".into(),
            version: "1".into(),
            endpoint: "http://127.0.0.1:1".into(),
            capabilities: vec![proto::Capability { name: "text.echo".into(), ..Default::default() }],
            ..Default::default()
        }),
        state: proto::HealthState::Up as i32,
        lease_id: 0,
    };
    let before = store.store.current_revision().await.unwrap();
    let mut refusals: Vec<(&str, tonic::Status, &str)> = Vec::new();
    let status = as_a.register(register("team-b", "sc-a")).await.expect_err("register for team-b");
    refusals.push(("register for another tenant", status, "TENANT_MISMATCH"));
    let status = as_a.register(register("team-a", "sc-b")).await.expect_err("register as sc-b");
    refusals.push(("register as another sidecar", status, "SIDECAR_MISMATCH"));
    let status = as_a
        .watch(proto::WatchRequest { tenant: "team-b".into(), sidecar: ident("sc-a"), from_revision: 0 })
        .await
        .expect_err("watch team-b");
    refusals.push(("watch another tenant", status, "TENANT_MISMATCH"));
    let deregister = |tenant: &str, lease_id: i64| proto::ControlDeregisterRequest {
        tenant: tenant.into(),
        instance_id: agent_b.instance_id().to_string(),
        agent: "echo".into(),
        lease_id,
        expected_lease_id: 0,
    };
    let status = as_a.deregister(deregister("team-b", 0)).await.expect_err("deregister in team-b");
    refusals.push(("deregister in another tenant", status, "TENANT_MISMATCH"));
    let status = as_a.deregister(deregister("team-a", 0)).await.expect_err("deregister b's instance");
    refusals.push(("deregister another sidecar's instance", status, "INSTANCE_NOT_OWNED"));
    let status = as_a.deregister(deregister("team-a", b_lease)).await.expect_err("revoke b's lease");
    refusals.push(("revoke another sidecar's lease", status, "INSTANCE_NOT_OWNED"));
    let status = as_a
        .heartbeat(proto::ControlHeartbeatRequest {
            report: None,
            tenant: "team-b".into(),
            sidecar: ident("sc-a"),
            instances: vec![],
            lease_id: 0,
        })
        .await
        .expect_err("heartbeat for team-b");
    refusals.push(("heartbeat for another tenant", status, "TENANT_MISMATCH"));
    let status = as_a
        .heartbeat(proto::ControlHeartbeatRequest {
            report: None,
            tenant: "team-a".into(),
            sidecar: ident("sc-a"),
            instances: vec![proto::InstanceHeartbeat {
                instance_id: agent_b.instance_id(),
                agent: "echo".into(),
                lease_id: b_lease,
                state: proto::HealthState::Down as i32,
                load: None,
            }],
            lease_id: 0,
        })
        .await
        .expect_err("heartbeat on b's lease");
    refusals.push(("heartbeat on another sidecar's lease", status, "INSTANCE_NOT_OWNED"));
    let mut on_b_lease = register("team-a", "sc-a");
    on_b_lease.lease_id = b_lease;
    let status = as_a.register(on_b_lease).await.expect_err("register on b's lease");
    refusals.push(("register on another sidecar's lease", status, "INSTANCE_NOT_OWNED"));
    for (what, status, want) in &refusals {
        assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
        assert_eq!(reason(status), *want, "{what}: {status:?}");
    }

    // No certificate, a certificate of another CA, an expired one, plaintext: refused.
    let watch_a = proto::WatchRequest { tenant: "team-a".into(), sidecar: ident("sc-x"), from_revision: 0 };
    let status = ControlClient::new(anonymous_channel(&control)).watch(watch_a.clone()).await.expect_err("no cert");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unauthenticated, "UNAUTHENTICATED"));
    let now = SystemTime::now();
    let uri = WorkloadId::new(TD, "team-a", "sc-x").uri();
    let other_ca = Ca::generate_named(TD, "someone else's CA").unwrap();
    let foreign = made_configs(&other_ca, &uri, now, now + Duration::from_secs(3600), control.ca().bundle_pem());
    let expired = made_configs(
        control.ca(),
        &uri,
        now - Duration::from_secs(7200),
        now - Duration::from_secs(3600),
        control.ca().bundle_pem(),
    );
    for (what, configs) in [("another CA", &foreign), ("expired", &expired)] {
        let status = ControlClient::new(channel_as(&control, configs)).watch(watch_a.clone()).await.expect_err(what);
        assert!(
            matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
            "{what}: the handshake must fail: {status:?}"
        );
    }
    let plaintext = tonic::transport::Endpoint::from_shared(control.endpoint()).unwrap().connect_lazy();
    let status = ControlClient::new(plaintext).watch(watch_a).await.expect_err("plaintext");
    // Another CA, expired, plaintext: three refused handshakes (control counts a refusal
    // after the client has seen it fail, so wait for the count).
    let failed = || control.stats().tls.failed.load(std::sync::atomic::Ordering::Relaxed);
    eventually(Duration::from_secs(5), "three refused handshakes counted", || failed() >= 3).await;
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
        "plaintext: {status:?}"
    );
    assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "a refused call wrote to the store");
    assert_eq!(agent_b.handled(), 0, "no refused Control call reached an agent");
    // B's instance is still routed to.
    assert!(a.table().instances.contains_key(&agent_b.instance_id()));
}

/// Calls `text.echo` from `caller` one after another until `stop`, counting (calls, failures).
/// Calls per second the rotation tests offer while certificates and CAs change.
const LOAD_PER_SECOND: u64 = 1000;
/// Concurrent callers sharing [`LOAD_PER_SECOND`].
const LOAD_WORKERS: u64 = 10;

/// What a [`call_loop`] did: calls made, the failures' messages, and for how long.
struct Load {
    calls: u64,
    failures: Vec<String>,
    elapsed: Duration,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    /// Zero failures, and more than 100 calls while the certificates changed. The rate
    /// reached is printed, not asserted: it is the machine's (36-40/s in debug builds on the
    /// shared 2-core machine at load 16 where this was written, where plaintext calls of
    /// other tests reached about 30/s too; see the i13d note).
    fn assert_clean(&self) {
        assert!(
            self.failures.is_empty(),
            "{} of {} calls failed: {:?}",
            self.failures.len(),
            self.calls,
            &self.failures[..self.failures.len().min(3)]
        );
        assert!(self.calls > 100, "only {} calls in {:?}", self.calls, self.elapsed);
    }
}

/// Calls `text.echo` through `caller`'s sidecar at up to [`LOAD_PER_SECOND`] (paced, from
/// [`LOAD_WORKERS`] concurrent callers) until `stop`.
fn call_loop(
    caller: &agent_reach::RunningAgent,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Load> {
    let client = caller.client();
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..LOAD_WORKERS {
            let (client, stop) = (client.clone(), stop.clone());
            workers.spawn(async move {
                let period = Duration::from_micros(1_000_000 * LOAD_WORKERS / LOAD_PER_SECOND);
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let (mut calls, mut failures) = (0u64, Vec::new());
                while !*stop.borrow() {
                    ticker.tick().await;
                    calls += 1;
                    if let Err(e) = client.invoke("text.echo").text("x").send().await {
                        failures.push(e.to_string());
                    }
                }
                (calls, failures)
            });
        }
        let mut load = Load { calls: 0, failures: Vec::new(), elapsed: Duration::ZERO };
        while let Some(done) = workers.join_next().await {
            let (calls, failures) = done.expect("a caller");
            load.calls += calls;
            load.failures.extend(failures);
        }
        load.elapsed = started.elapsed();
        load
    })
}

/// Waits until `sidecar` has received more than `n` certificates.
async fn wait_for_certificates(sidecar: &agent_reach_sidecar::Sidecar, n: u64) {
    let stats = sidecar.identity_stats().expect("identity");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while stats.issued.load(std::sync::atomic::Ordering::Relaxed) <= n {
        assert!(tokio::time::Instant::now() < deadline, "sidecar {} did not renew: {stats:?}", sidecar.id());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn issued(sidecar: &agent_reach_sidecar::Sidecar) -> u64 {
    sidecar.identity_stats().unwrap().issued.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_renew_their_certificates_under_load_without_a_failed_call() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    // Three-second certificates: renewed every two seconds.
    let control = mtls_control(&store, Duration::from_secs(3)).await;
    let mut admin = AdminClient::new(anonymous_channel(&control));
    // Single-use tokens: renewals are paid for with the certificate, not the token.
    let mut sidecars = Vec::new();
    for id in ["renew-a", "renew-b"] {
        let (_, token) = create_token(&mut admin, "default", 0, true).await;
        let mut config = sidecar_config(&control.endpoint(), id);
        config.identity = Some(identity_settings(&control, &token));
        sidecars.push(start_sidecar(config).await);
    }
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let target = echo_agent(b.local_addr(), "echo", &[("text.echo", &[])]).await;
    let caller = echo_agent(a.local_addr(), "caller", &[("noop", &[])]).await;
    wait_for_instances(a, &[caller.instance_id(), target.instance_id()]).await;
    let first = a.tls().unwrap().info();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let calls = call_loop(&caller, stopped);
    // Two renewals of every sidecar while calls run.
    for sidecar in [a, b] {
        wait_for_certificates(sidecar, 2).await;
    }
    stop.send(true).unwrap();
    let load = calls.await.unwrap();
    load.assert_clean();
    println!("{} calls in {:?} ({:.0}/s), none failed", load.calls, load.elapsed, load.per_second());
    for sidecar in [a, b] {
        let stats = sidecar.identity_stats().unwrap();
        assert!(issued(sidecar) >= 3, "{}: {stats:?}", sidecar.id());
        assert_eq!(stats.renewal_failures.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
    let now = a.tls().unwrap().info();
    assert_eq!(now.peer, first.peer);
    assert!(now.not_after > first.not_after);
    // The instances kept their registrations (heartbeats reached control throughout).
    assert!(a.table().instances.contains_key(&target.instance_id()));
}

/// Control on `addr` again, signing with `ca` and handing out its bundle.
async fn restart_control(control: ControlHandle, store: &TestStore, ca: Ca, cert_ttl: Duration) -> ControlHandle {
    let addr = control.addr();
    control.shutdown().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    };
    let config = ControlConfig {
        mtls: Mtls::Required,
        identity: Some(IdentityConfig { ca: Arc::new(ca), cert_ttl }),
        lease_ttl: Duration::from_secs(5),
        ..ControlConfig::default()
    };
    ControlHandle::spawn(store.store.clone(), config, listener).expect("control")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_is_replaced_through_a_two_ca_bundle_without_a_failed_call() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let ttl = Duration::from_secs(6);
    let old = Ca::generate_named(TD, "old CA").unwrap();
    let new = Ca::generate_named(TD, "new CA").unwrap();
    let both = format!("{}{}", old.cert_pem(), new.cert_pem());
    let config = ControlConfig {
        mtls: Mtls::Required,
        identity: Some(IdentityConfig { ca: Arc::new(old.with_bundle(old.cert_pem()).unwrap()), cert_ttl: ttl }),
        lease_ttl: Duration::from_secs(5),
        ..ControlConfig::default()
    };
    let mut control = ControlHandle::spawn(store.store.clone(), config, listener().await).expect("control");
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "default", 0, false).await;
    let mut sidecars = Vec::new();
    for id in ["rot-a", "rot-b"] {
        let mut config = sidecar_config(&control.endpoint(), id);
        config.identity = Some(identity_settings(&control, &token));
        sidecars.push(start_sidecar(config).await);
    }
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let target = echo_agent(b.local_addr(), "echo", &[("text.echo", &[])]).await;
    let caller = echo_agent(a.local_addr(), "caller", &[("noop", &[])]).await;
    wait_for_instances(a, &[caller.instance_id(), target.instance_id()]).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let calls = call_loop(&caller, stopped);

    // 1. The old CA signs; everyone learns to trust both. 2. The new CA signs. 3. The old
    // CA leaves the bundle. Each step waits for every sidecar to renew once.
    for (ca, bundle) in [(&old, both.as_str()), (&new, both.as_str()), (&new, new.cert_pem())] {
        let counts: Vec<u64> = sidecars.iter().map(issued).collect();
        control = restart_control(control, &store, ca.with_bundle(bundle).unwrap(), ttl).await;
        for (sidecar, n) in sidecars.iter().zip(counts) {
            wait_for_certificates(sidecar, n).await;
        }
    }
    stop.send(true).unwrap();
    let load = calls.await.unwrap();
    load.assert_clean();
    println!("{} calls in {:?} ({:.0}/s), none failed", load.calls, load.elapsed, load.per_second());
    // The last renewals were made over mutual TLS with a control that trusts only the new
    // CA: every sidecar holds a certificate of the new CA.
    // A certificate of the old CA is refused now.
    let now = SystemTime::now();
    let stale = made_configs(&old, &WorkloadId::new(TD, "default", "x").uri(), now, now + ttl, new.cert_pem());
    let watch = proto::WatchRequest {
        tenant: "default".into(),
        sidecar: Some(proto::SidecarIdentity { sidecar_id: "x".into(), mesh_address: "127.0.0.1:1".into() }),
        from_revision: 0,
    };
    let status = ControlClient::new(channel_as(&control, &stale)).watch(watch).await.expect_err("old CA");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
        "{status:?}"
    );
    assert!(a.table().instances.contains_key(&target.instance_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mesh_port_takes_the_tenant_from_the_certificate() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "team-a", 0, false).await;
    let start = |id: &'static str| {
        let mut config = sidecar_config(&control.endpoint(), id);
        config.tenant = "team-a".into();
        config.identity = Some(identity_settings(&control, &token));
        start_sidecar(config)
    };
    let (a, b) = (start("mesh-a").await, start("mesh-b").await);
    let target = echo_agent(b.local_addr(), "echo", &[("text.echo", &[])]).await;
    wait_for_instances(&a, &[target.instance_id()]).await;

    // A call between two sidecars of the tenant goes over mutual TLS.
    let caller = echo_agent(a.local_addr(), "caller", &[("noop", &[])]).await;
    let reply = caller.client().invoke("text.echo").text("hi").send().await.expect("call over mTLS");
    assert!(reply.text().ends_with(":hi"), "{}", reply.text());
    assert_eq!(target.handled(), 1);

    let before = store.store.current_revision().await.unwrap();
    let now = SystemTime::now();
    let bundle = control.ca().bundle_pem();
    let in_a_year = now + Duration::from_secs(3600);
    let deliver = |configs: Option<&TlsConfigs>, tenant_header: &str, tenant_field: &str| {
        let channel = match configs {
            Some(c) => TlsConnector::fixed(c.client()).channel(&format!("http://{}", b.mesh_addr())).unwrap(),
            None => {
                tonic::transport::Endpoint::from_shared(format!("http://{}", b.mesh_addr())).unwrap().connect_lazy()
            }
        };
        let mut request = tonic::Request::new(proto::HandleRequest {
            capability: "text.echo".into(),
            instance_id: target.instance_id(),
            tenant: tenant_field.into(),
            ..Default::default()
        });
        request.metadata_mut().insert("ar-tenant", tenant_header.parse().unwrap());
        request.metadata_mut().insert("ar-instance", target.instance_id().parse().unwrap());
        request.metadata_mut().insert("ar-hop-ask", "t0k3n".parse().unwrap());
        async move { proto::mesh_client::MeshClient::new(channel).deliver(request).await }
    };
    let team_b = made_configs(control.ca(), &WorkloadId::new(TD, "team-b", "evil").uri(), now, in_a_year, bundle);
    let status = deliver(Some(&team_b), "team-a", "").await.expect_err("another tenant's certificate");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    assert_eq!(agent_reach::reason::error_info(&status).unwrap().metadata["field"], "certificate");
    let team_a = made_configs(control.ca(), &WorkloadId::new(TD, "team-a", "x").uri(), now, in_a_year, bundle);
    let status = deliver(Some(&team_a), "team-b", "").await.expect_err("header claiming another tenant");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    assert_eq!(agent_reach::reason::error_info(&status).unwrap().metadata["field"], "ar-tenant");
    // The message's own tenant field (the one the agent decodes) must be the certificate's too.
    let status = deliver(Some(&team_a), "team-a", "team-b").await.expect_err("field claiming another tenant");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    let info = agent_reach::reason::error_info(&status).unwrap();
    assert_eq!((info.metadata["field"].as_str(), info.metadata["claimed"].as_str()), ("tenant", "team-b"));
    // The same certificate with a true (or no) tenant field is delivered: the refusals above
    // are of the claims, not of the certificate.
    let reply = deliver(Some(&team_a), "team-a", "team-a").await.expect("a true tenant field");
    assert_eq!(String::from_utf8_lossy(&reply.get_ref().payload), format!("echo@{}:", target.instance_id()));
    assert_eq!(target.handled(), 2);
    // Asked with the separate headers, the sidecar says it reads `ar-hop` (echoing the
    // token), which carries the same claims in one header; they are checked against the
    // certificate the same way.
    assert_eq!(reply.metadata().get("ar-hop-ok").map(|v| v.to_str().unwrap()), Some("t0k3n"));
    let deliver_hop = |hop_tenant: &str, also_tenant: Option<&str>| {
        let channel = TlsConnector::fixed(team_a.client()).channel(&format!("http://{}", b.mesh_addr())).unwrap();
        let mut request = tonic::Request::new(proto::HandleRequest {
            capability: "text.echo".into(),
            instance_id: target.instance_id(),
            ..Default::default()
        });
        let hop = format!("{}|{hop_tenant}|text.echo||", target.instance_id());
        request.metadata_mut().insert("ar-hop", hop.parse().unwrap());
        if let Some(t) = also_tenant {
            request.metadata_mut().insert("ar-tenant", t.parse().unwrap());
        }
        async move { proto::mesh_client::MeshClient::new(channel).deliver(request).await }
    };
    let status = deliver_hop("team-b", None).await.expect_err("ar-hop claiming another tenant");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
    let info = agent_reach::reason::error_info(&status).unwrap();
    assert_eq!((info.metadata["field"].as_str(), info.metadata["claimed"].as_str()), ("ar-hop", "team-b"));
    let status = deliver_hop("team-a", Some("team-a")).await.expect_err("ar-hop and ar-tenant both");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::InvalidArgument, "INVALID_ARGUMENT"));
    assert!(status.message().contains("ar-hop and ar-tenant both"), "{}", status.message());
    let reply = deliver_hop("team-a", None).await.expect("a true ar-hop");
    assert_eq!(String::from_utf8_lossy(&reply.get_ref().payload), format!("echo@{}:", target.instance_id()));
    assert!(reply.metadata().get("ar-hop-ok").is_none(), "said only to a call that asked");
    assert_eq!(target.handled(), 3);
    let other_ca = Ca::generate_named(TD, "someone else's CA").unwrap();
    let foreign = made_configs(&other_ca, &WorkloadId::new(TD, "team-a", "x").uri(), now, in_a_year, bundle);
    let expired = made_configs(
        control.ca(),
        &WorkloadId::new(TD, "team-a", "x").uri(),
        now - Duration::from_secs(7200),
        now - Duration::from_secs(3600),
        bundle,
    );
    for (what, configs) in [("another CA", Some(&foreign)), ("expired", Some(&expired)), ("plaintext", None)] {
        let status = deliver(configs, "team-a", "").await.expect_err(what);
        assert!(
            matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
            "{what}: the connection must fail: {status:?}"
        );
    }
    // TLS that trusts the sidecar's certificate but presents none: the mesh port requires one.
    let no_certificate =
        agent_reach_identity::tls::client_without_certificate(bundle, TD, ExpectedPeer::AnyInTrustDomain).unwrap();
    let channel = TlsConnector::fixed(Arc::new(no_certificate)).channel(&format!("http://{}", b.mesh_addr())).unwrap();
    let mut request = tonic::Request::new(proto::HandleRequest {
        capability: "text.echo".into(),
        instance_id: target.instance_id(),
        ..Default::default()
    });
    request.metadata_mut().insert("ar-tenant", "team-a".parse().unwrap());
    let status = proto::mesh_client::MeshClient::new(channel).deliver(request).await.expect_err("no certificate");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
        "no client certificate: the connection must fail: {status:?}"
    );
    assert_eq!(target.handled(), 3, "no refused call reached the agent");
    assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "a refused Deliver wrote to the store");
}

fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_need_an_operator_token_with_the_right_role_and_tenant() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let boot = "bootstrap-admin-token-for-the-test";
    let config = ControlConfig {
        mtls: Mtls::Required,
        admin_token: Some(agent_reach_control::config::BootstrapToken(boot.into())),
        ..ControlConfig::default()
    };
    let control = ControlHandle::spawn(store.store.clone(), config, listener().await).expect("control");
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let create = |role: proto::OperatorRole, tenants: &[&str]| proto::CreateOperatorTokenRequest {
        role: role as i32,
        tenants: tenants.iter().map(|t| t.to_string()).collect(),
        ttl_ms: 0,
        description: "e2e".into(),
    };
    let viewer = admin
        .create_operator_token(bearer(create(proto::OperatorRole::Viewer, &[]), boot))
        .await
        .expect("bootstrap admin creates a viewer")
        .into_inner();
    let operator_a = admin
        .create_operator_token(bearer(create(proto::OperatorRole::Operator, &["team-a"]), boot))
        .await
        .expect("bootstrap admin creates an operator of team-a")
        .into_inner();
    let revoked = admin
        .create_operator_token(bearer(create(proto::OperatorRole::Operator, &[]), boot))
        .await
        .unwrap()
        .into_inner();
    admin
        .revoke_operator_token(bearer(proto::RevokeOperatorTokenRequest { id: revoked.token.unwrap().id }, boot))
        .await
        .expect("revoke");
    let hold = |tenant: &str| proto::SetAgentStateRequest {
        tenant: tenant.into(),
        agent: "echo".into(),
        state: proto::HealthState::Paused as i32,
        reason: "e2e".into(),
    };

    // Allowed: a viewer reads any tenant; an operator of team-a changes team-a.
    admin
        .list_agents(bearer(proto::ListAgentsRequest { tenant: "team-b".into(), filter: None }, &viewer.secret))
        .await
        .expect("viewer reads");
    admin.set_agent_state(bearer(hold("team-a"), &operator_a.secret)).await.expect("operator of team-a changes team-a");

    let before = store.store.current_revision().await.unwrap();
    let list = proto::ListAgentsRequest { tenant: "team-a".into(), filter: None };
    let status = admin.list_agents(list).await.expect_err("no token");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unauthenticated, "UNAUTHENTICATED"));
    let join = proto::CreateJoinTokenRequest { tenant: "team-a".into(), ..Default::default() };
    let status = admin.create_join_token(join.clone()).await.expect_err("no token");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unauthenticated, "UNAUTHENTICATED"));
    let status = admin.set_agent_state(bearer(hold("team-a"), &viewer.secret)).await.expect_err("viewer mutating");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "ROLE_NOT_ALLOWED"));
    let status = admin.create_join_token(bearer(join, &viewer.secret)).await.expect_err("viewer minting a join token");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "ROLE_NOT_ALLOWED"));
    let status =
        admin.set_agent_state(bearer(hold("team-b"), &operator_a.secret)).await.expect_err("operator of A touching B");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_NOT_ALLOWED"));
    let status = admin
        .create_operator_token(bearer(create(proto::OperatorRole::Admin, &[]), &operator_a.secret))
        .await
        .expect_err("operator minting an admin");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "ROLE_NOT_ALLOWED"));
    let status = admin.set_agent_state(bearer(hold("team-a"), &revoked.secret)).await.expect_err("revoked token");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unauthenticated, "UNAUTHENTICATED"));
    assert!(status.message().contains("revoked"), "{status:?}");
    assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "a refused Admin call wrote to the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissive_mode_lets_anonymous_calls_through_and_still_checks_certificates() {
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
    let watch = |tenant: &str| proto::WatchRequest {
        tenant: tenant.into(),
        sidecar: Some(proto::SidecarIdentity { sidecar_id: "x".into(), mesh_address: "127.0.0.1:1".into() }),
        from_revision: 0,
    };
    let mut stream = ControlClient::new(anonymous_channel(&control))
        .watch(watch("team-b"))
        .await
        .expect("an anonymous watch passes in permissive mode")
        .into_inner();
    assert!(stream.message().await.expect("snapshot").is_some());
    assert_eq!(control.stats().anonymous_calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    let now = SystemTime::now();
    let team_a = made_configs(
        control.ca(),
        &WorkloadId::new(TD, "team-a", "x").uri(),
        now,
        now + Duration::from_secs(3600),
        control.ca().bundle_pem(),
    );
    let status = ControlClient::new(channel_as(&control, &team_a)).watch(watch("team-b")).await.expect_err("team-b");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "TENANT_MISMATCH"));
}
