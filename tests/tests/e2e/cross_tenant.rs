//! Calls between tenants, end to end: only by explicit grant on both sides. The caller
//! tenant's tenant policy names the target in `egress`, the target capability's policy
//! names the caller tenant (or tenant/agent) in `authorization.allowed_tenants`; control
//! gives the caller's sidecar the target's instances only then, and the target's sidecar
//! checks its own policy on every call, with the caller's tenant from its sidecar's
//! certificate. Real etcd, control with mutual TLS, one sidecar per tenant.

use std::time::{Duration, SystemTime};

use agent_reach::policy::{Authorization, Policy, PolicyKind, PolicySpec};
use agent_reach::proto;
use agent_reach::proto::admin_client::AdminClient;
use agent_reach::{Agent, Client, InvokeError, Reply};
use agent_reach_e2e::*;
use agent_reach_identity::{TlsConfigs, WorkloadId};
use agent_reach_sidecar::Sidecar;
use agent_reach_sidecar::identity::TlsConnector;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

use crate::identity::{anonymous_channel, create_token, identity_settings, made_configs, mtls_control, reason};

const TD: &str = agent_reach_identity::DEFAULT_TRUST_DOMAIN;

fn refused(result: Result<agent_reach::InvokeReply, InvokeError>, policy: &str, what: &str) {
    match result {
        Ok(r) => panic!("{what}: expected a refusal, got {:?}", r.text()),
        Err(e) => {
            assert_eq!((e.code(), e.reason()), (Code::PermissionDenied, Some("NOT_AUTHORIZED")), "{what}: {e}");
            assert_eq!(e.detail("policy"), Some(policy), "{what}: {e}");
        }
    }
}

async fn put(admin: &mut AdminClient<Channel>, policy: &Policy) {
    admin
        .put_policy(proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(policy, 0)) })
        .await
        .expect("put policy");
}

async fn delete(admin: &mut AdminClient<Channel>, tenant: &str, kind: PolicyKind, name: &str) {
    admin
        .delete_policy(proto::DeletePolicyRequest {
            tenant: tenant.into(),
            kind: proto::PolicyKind::from(kind) as i32,
            name: name.into(),
        })
        .await
        .expect("delete policy");
}

async fn wait_for_no_policy(sidecar: &Sidecar, kind: PolicyKind, name: &str) {
    sidecar
        .wait_for_table(Duration::from_secs(10), |t| t.policy(kind, name).is_none())
        .await
        .expect("the policy's removal reached the sidecar");
}

/// `GET path` on an admin port: the body.
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
async fn samples(sidecar: &Sidecar, name: &str, labels: &[&str]) -> f64 {
    let text = http_get(sidecar.admin_addr().expect("admin port"), "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn authorization_rejections(sidecar: &Sidecar) -> f64 {
    let text = http_get(sidecar.admin_addr().expect("admin port"), "/metrics").await;
    let series = "agent_reach_rejections_total{mechanism=\"authorization\"}";
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).expect("the authorization counter")
}

/// Calls until the call is refused; how long that took.
async fn until_refused(client: &Client, target: &str) -> (Duration, InvokeError) {
    let started = Instant::now();
    loop {
        match client.invoke(target).text("x").send().await {
            Ok(_) => assert!(started.elapsed() < Duration::from_secs(10), "still served 10 s after the revocation"),
            Err(e) => return (started.elapsed(), e),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_is_called_only_with_both_grants() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let (_, token_a) = create_token(&mut admin, "team-a", 0, false).await;
    let (_, token_b) = create_token(&mut admin, "team-b", 0, false).await;
    let mut config = sidecar_config(&control.endpoint(), "xt-a");
    config.tenant = "team-a".into();
    config.identity = Some(identity_settings(&control, &token_a));
    let a = start_sidecar_with_admin(config).await;
    let mut config = sidecar_config(&control.endpoint(), "xt-b");
    config.tenant = "team-b".into();
    config.identity = Some(identity_settings(&control, &token_b));
    let b = start_sidecar_with_admin(config).await;

    // team-b's worker answers who the mesh says called it.
    let worker = Agent::builder("worker")
        .sidecar(b.local_addr().to_string())
        .handle("work", |call| async move {
            let agent = call.verified_caller().map_or("-".to_string(), |c| c.agent.clone());
            let tenant = call.verified_caller_tenant().unwrap_or("-").to_string();
            Ok(Reply::text(format!("tenant={tenant};agent={agent};capability={}", call.capability())))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("worker");
    let planner = echo_agent(a.local_addr(), "planner", &[("plan", &[])]).await;
    let intruder = echo_agent(a.local_addr(), "intruder", &[("intrude", &[])]).await;
    // Each sidecar's table holds its own tenant's instances only.
    wait_for_instances(&a, &[planner.instance_id(), intruder.instance_id()]).await;
    wait_for_instances(&b, &[worker.instance_id()]).await;
    let anonymous = Client::lazy(&a.local_addr().to_string()).unwrap();
    let egress = Policy {
        tenant: "team-a".into(),
        kind: PolicyKind::Tenant,
        name: "default".into(),
        spec: PolicySpec { egress: vec!["team-b/work".into()], ..Default::default() },
        description: "team-a may call team-b's work".into(),
    };
    let grant = Policy {
        tenant: "team-b".into(),
        kind: PolicyKind::Capability,
        name: "work".into(),
        spec: PolicySpec {
            authorization: Some(Authorization { allowed_tenants: vec!["team-a/planner".into()], ..Default::default() }),
            ..Default::default()
        },
        description: "team-a's planner may call work".into(),
    };

    // No grant: refused by team-a's own sidecar; team-a has no capability named work.
    refused(planner.client().invoke("team-b/work").text("x").send().await, "tenant/default", "no grant");
    // Route explains a call to another tenant as the call is routed: refused the same way.
    let e = planner.client().route(agent_reach::model::Target::capability("team-b/work"), 5).await.expect_err("route");
    assert_eq!(
        (e.code(), e.reason(), e.detail("policy")),
        (Code::PermissionDenied, Some("NOT_AUTHORIZED"), Some("tenant/default")),
        "{e}"
    );
    let e = planner.client().invoke("work").text("x").send().await.expect_err("team-a has no work");
    assert_eq!(e.reason(), Some("AGENT_NOT_FOUND"), "{e}");
    let e = planner.client().invoke("Team_B/work").text("x").send().await.expect_err("not a tenant name");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");

    // Only the target granted: still refused by the caller's side.
    put(&mut admin, &grant).await;
    wait_for_policy(&[&b], &grant).await;
    refused(planner.client().invoke("team-b/work").text("x").send().await, "tenant/default", "only team-b granted");

    // Only the caller granted: control gives no instances, naming team-b's missing grant.
    delete(&mut admin, "team-b", PolicyKind::Capability, "work").await;
    wait_for_no_policy(&b, PolicyKind::Capability, "work").await;
    put(&mut admin, &egress).await;
    wait_for_policy(&[&a], &egress).await;
    let policy = "team-b/capability/work";
    refused(planner.client().invoke("team-b/work").text("x").send().await, policy, "only team-a granted");
    assert!(a.table().instances.keys().all(|id| *id != worker.instance_id()), "team-b's worker is not in A's table");
    // team-b's sidecar decides by its own policy too: a Deliver straight to its mesh port
    // with a team-a certificate (as a sidecar skipping control would send it) is refused
    // before the instance is looked up, whether it exists or not.
    let now = SystemTime::now();
    let uri = WorkloadId::new(TD, "team-a", "xt-rogue").uri();
    let team_a = made_configs(control.ca(), &uri, now, now + Duration::from_secs(3600), control.ca().bundle_pem());
    let rejected_before = authorization_rejections(&b).await;
    let before = store.store.current_revision().await.unwrap();
    for instance in [worker.instance_id(), "no-such-instance".to_string()] {
        let status = deliver(&b, &team_a, &instance, "planner").await.expect_err("no grant at team-b");
        assert_eq!((status.code(), reason(&status).as_str()), (Code::PermissionDenied, "NOT_AUTHORIZED"), "{status:?}");
        let info = agent_reach::reason::error_info(&status).unwrap();
        assert_eq!(info.metadata["policy"], "capability/work");
        assert_eq!(info.metadata["caller"], "agent team-a/planner");
    }
    assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "refused Delivers wrote nothing");
    assert_eq!(authorization_rejections(&b).await, rejected_before + 2.0, "counted as authorization refusals");
    assert_eq!(worker.handled(), 0, "no refused call reached the worker");

    // Both granted: the planner's call goes through, and the worker learns its tenant.
    put(&mut admin, &grant).await;
    wait_for_policy(&[&b], &grant).await;
    for _ in 0..20 {
        let reply = planner.client().invoke("team-b/work").text("x").send().await.expect("both granted");
        assert_eq!(reply.text(), "tenant=team-a;agent=planner;capability=work");
        assert_eq!(reply.instance(), worker.instance_id());
    }
    assert_eq!(worker.handled(), 20);
    // Route explains the call over the table it is routed with: team-b's granted instances.
    let route = planner.client().route(agent_reach::model::Target::capability("team-b/work"), 5).await.expect("route");
    let ids: Vec<String> = route
        .candidates
        .iter()
        .map(|c| c.instance.as_ref().map(|i| i.instance_id.clone()).unwrap_or_default())
        .collect();
    assert_eq!(ids, vec![worker.instance_id().to_string()], "{route:?}");
    assert!(a.table().instances.keys().all(|id| *id != worker.instance_id()), "still not in A's own table");
    // The caller's sidecar labels the target with its tenant.
    let ok = ["caller=\"planner\"", "target=\"capability team-b/work\"", "outcome=\"OK\""];
    assert_eq!(samples(&a, "agent_reach_calls_total", &ok).await, 20.0);
    let own = ["target=\"capability work\""];
    assert_eq!(samples(&a, "agent_reach_calls_total", &own).await, 0.0, "never under its name in the tenant");
    // The grant names the planner: team-a's other agent, and anonymous callers, are refused
    // by team-b's sidecar.
    let rejected_before = authorization_rejections(&b).await;
    refused(intruder.client().invoke("team-b/work").text("x").send().await, "capability/work", "intruder");
    refused(anonymous.invoke("team-b/work").text("x").send().await, "capability/work", "anonymous");
    refused(
        intruder.client().with_caller("planner", &planner.instance_id()).invoke("team-b/work").text("x").send().await,
        "capability/work",
        "intruder naming itself planner",
    );
    assert_eq!(authorization_rejections(&b).await, rejected_before + 3.0);
    assert_eq!(worker.handled(), 20);

    // Revoking team-b's grant: refused again once team-b's sidecar has the change.
    let revoked = Instant::now();
    delete(&mut admin, "team-b", PolicyKind::Capability, "work").await;
    let (took, e) = until_refused(&planner.client(), "team-b/work").await;
    assert_eq!(e.reason(), Some("NOT_AUTHORIZED"), "{e}");
    let by = e.detail("policy").unwrap_or_default().to_string();
    assert!(by == "capability/work" || by == "team-b/capability/work", "refused by {by}");
    println!("team-b's revocation: refused after {took:?} ({:?} after the delete), by {by}", revoked.elapsed());
    assert!(took < Duration::from_secs(2), "{took:?}");
    let served = worker.handled();

    // Granted again, then team-a's egress revoked: refused by team-a's own sidecar.
    put(&mut admin, &grant).await;
    wait_for_policy(&[&b], &grant).await;
    // (A refusal is never kept: the next call looks the instances up again.)
    let reply = planner.client().invoke("team-b/work").text("x").send().await.expect("granted again");
    assert_eq!(reply.text(), "tenant=team-a;agent=planner;capability=work");
    delete(&mut admin, "team-a", PolicyKind::Tenant, "default").await;
    let (took, e) = until_refused(&planner.client(), "team-b/work").await;
    assert_eq!((e.reason(), e.detail("policy")), (Some("NOT_AUTHORIZED"), Some("tenant/default")), "{e}");
    println!("team-a's revocation: refused after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(worker.handled() > served, "served again once granted again");

    for agent in [planner, intruder] {
        agent.abort();
    }
    worker.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// A `Mesh/Deliver` to `sidecar` presenting `configs`' certificate, as a sidecar of team-a
/// vouching for `caller`, for `instance` and capability `work`.
async fn deliver(
    sidecar: &Sidecar,
    configs: &TlsConfigs,
    instance: &str,
    caller: &str,
) -> Result<tonic::Response<proto::HandleReply>, tonic::Status> {
    let channel = TlsConnector::fixed(configs.client()).channel(&format!("http://{}", sidecar.mesh_addr())).unwrap();
    let mut request = tonic::Request::new(proto::HandleRequest {
        capability: "work".into(),
        instance_id: instance.into(),
        ..Default::default()
    });
    for (key, value) in [
        ("ar-tenant", "team-a"),
        ("ar-instance", instance),
        ("ar-capability", "work"),
        ("ar-caller-agent", caller),
        ("ar-caller-instance", "rogue-1"),
    ] {
        request.metadata_mut().insert(key, value.parse().unwrap());
    }
    proto::mesh_client::MeshClient::new(channel).deliver(request).await
}
