//! Tenant isolation on etcd: no RPC lets one tenant route to, list, change or learn the
//! existence of another tenant's agents, whatever names it tries.

use std::time::Duration;

use agent_reach::Client;
use agent_reach::proto;
use agent_reach::reason::error_info;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, control_client, echo_agent, init_logging, registration, sidecar_config,
    start_control_plaintext, start_sidecar, wait_for_instances,
};
use tonic::{Code, Status};

fn sidecar(tenant: &str, id: &str, control: &str) -> agent_reach_sidecar::SidecarConfig {
    let mut c = sidecar_config(control, id);
    c.tenant = tenant.into();
    c
}

/// The reason and the `field` an error names.
fn reason(status: &Status) -> (String, String) {
    let info = error_info(status).unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    (info.reason, info.metadata.get("field").cloned().unwrap_or_default())
}

/// Tenant names that are not the tenant they look like, or not tenant names at all.
fn adversarial_tenants() -> Vec<String> {
    let mut names: Vec<String> = [
        "",
        "Team-A",
        "TEAM-B",
        "team-a/",
        "/team-b",
        "team-a/../team-b",
        "../team-b",
        "..",
        ".",
        "team-a%2Fteam-b",
        "%2F",
        "%2e%2e",
        "team-b%00",
        "team-a\0",
        "team\u{2010}b",
        "t\u{0435}am-b",
        "\u{ff54}\u{ff45}\u{ff41}\u{ff4d}-b",
        "team-b ",
        " team-b",
        "team_b",
        "*",
        "team-b\n",
        "-team-b",
        "team-b-",
        "team-a/agents/only-b",
        "team-b/policies",
        "default\u{200b}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("a".repeat(64));
    names
}

/// Every name-taking RPC of both APIs refuses every adversarial tenant name as an invalid
/// argument naming the field, and writes nothing; with valid names, nothing of another
/// tenant is ever listed, found, changed, suggested or routed to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_nothing_of_each_other() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    // Explicit plaintext: this test sends raw Control calls for any tenant, as anyone, to
    // check the data layer's own tenant checks (identity's checks are in identity.rs).
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(20)).await;
    let endpoint = control.endpoint();
    let sa = start_sidecar(sidecar("team-a", "host-a", &endpoint)).await;
    let sb = start_sidecar(sidecar("team-b", "host-b", &endpoint)).await;
    // "team" is a string prefix of both other tenants' names.
    let st = start_sidecar(sidecar("team", "host-t", &endpoint)).await;
    let shared_a = echo_agent(sa.local_addr(), "shared", &[("shared.cap", &["x"])]).await;
    let only_a = echo_agent(sa.local_addr(), "only-a", &[("secret.a", &[])]).await;
    let shared_b = echo_agent(sb.local_addr(), "shared", &[("shared.cap", &["x"])]).await;
    let only_b = echo_agent(sb.local_addr(), "only-b", &[("secret.b", &[])]).await;
    wait_for_instances(&sa, &[shared_a.instance_id(), only_a.instance_id()]).await;
    wait_for_instances(&sb, &[shared_b.instance_id(), only_b.instance_id()]).await;
    let mut admin = admin_client(&endpoint).await;
    let mut ctl = control_client(&endpoint).await;
    let policy = |tenant: &str, name: &str| proto::Policy {
        tenant: tenant.into(),
        kind: proto::PolicyKind::Capability as i32,
        name: name.into(),
        spec: Some(proto::PolicySpec { default_timeout_ms: 500, ..Default::default() }),
        ..Default::default()
    };
    admin.put_policy(proto::PutPolicyRequest { policy: Some(policy("team-b", "secret.b")) }).await.unwrap();
    sb.wait_for_table(Duration::from_secs(10), |t| !t.policies.is_empty()).await.unwrap();

    // Each sidecar's table holds its own tenant only; "team" holds nothing.
    for (sc, tenant, n) in [(&sa, "team-a", 2), (&sb, "team-b", 2)] {
        let table = sc.table();
        assert_eq!(table.len(), n);
        assert!(
            table.instances.values().all(|m| m.instance.record.tenant == tenant),
            "{tenant}: {:?}",
            table.instances.keys()
        );
    }
    assert!(sa.table().policies.is_empty());
    assert!(st.table().is_empty() && st.table().policies.is_empty());
    assert!(st.table().revision > 0, "the empty tenant got its snapshot");

    // Adversarial tenant names: refused, naming the field, nothing written.
    let before = ts.store.current_revision().await.unwrap();
    let lease = sa.registry().lease();
    for tenant in adversarial_tenants() {
        let t = tenant.clone();
        let mut checks: Vec<(&str, Result<(), Status>)> = vec![
            (
                "ListInstances",
                admin.list_instances(proto::ListInstancesRequest { tenant: t.clone(), filter: None }).await.map(drop),
            ),
            (
                "ListAgents",
                admin.list_agents(proto::ListAgentsRequest { tenant: t.clone(), filter: None }).await.map(drop),
            ),
            (
                "GetAgent",
                admin.get_agent(proto::GetAgentRequest { tenant: t.clone(), agent: "only-b".into() }).await.map(drop),
            ),
            (
                "GetInstance",
                admin
                    .get_instance(proto::GetInstanceRequest { tenant: t.clone(), instance_id: only_b.instance_id() })
                    .await
                    .map(drop),
            ),
            (
                "SetAgentState",
                admin
                    .set_agent_state(proto::SetAgentStateRequest {
                        tenant: t.clone(),
                        agent: "only-b".into(),
                        state: proto::HealthState::Paused as i32,
                        reason: "x".into(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "SetInstanceState",
                admin
                    .set_instance_state(proto::SetInstanceStateRequest {
                        tenant: t.clone(),
                        instance_id: only_b.instance_id(),
                        state: proto::HealthState::Paused as i32,
                        reason: "x".into(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "PutPolicy",
                admin.put_policy(proto::PutPolicyRequest { policy: Some(policy(&t, "secret.b")) }).await.map(drop),
            ),
            (
                "GetPolicy",
                admin
                    .get_policy(proto::GetPolicyRequest {
                        tenant: t.clone(),
                        kind: proto::PolicyKind::Capability as i32,
                        name: "secret.b".into(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "ListPolicies",
                admin.list_policies(proto::ListPoliciesRequest { tenant: t.clone(), kind: 0 }).await.map(drop),
            ),
            (
                "DeletePolicy",
                admin
                    .delete_policy(proto::DeletePolicyRequest {
                        tenant: t.clone(),
                        kind: proto::PolicyKind::Capability as i32,
                        name: "secret.b".into(),
                    })
                    .await
                    .map(drop),
            ),
            (
                "ExplainRoute",
                admin
                    .explain_route(proto::ExplainRouteRequest {
                        tenant: t.clone(),
                        target: Some(agent_reach::model::Target::capability("secret.b").into()),
                        max_candidates: 0,
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "PutTenant",
                admin
                    .put_tenant(proto::PutTenantRequest {
                        tenant: Some(proto::Tenant { name: t.clone(), ..Default::default() }),
                    })
                    .await
                    .map(drop),
            ),
            (
                "Register",
                ctl.register(proto::ControlRegisterRequest {
                    tenant: t.clone(),
                    sidecar: Some(proto::SidecarIdentity { sidecar_id: "evil".into(), mesh_address: "evil:1".into() }),
                    instance_id: "evil-1".into(),
                    registration: Some(registration("only-b", "1", "secret.b", &[])),
                    state: 0,
                    lease_id: lease,
                })
                .await
                .map(drop),
            ),
            (
                "Heartbeat",
                ctl.heartbeat(proto::ControlHeartbeatRequest {
                    report: None,
                    tenant: t.clone(),
                    sidecar: None,
                    instances: vec![proto::InstanceHeartbeat {
                        instance_id: only_b.instance_id(),
                        agent: "only-b".into(),
                        lease_id: lease,
                        state: proto::HealthState::Down as i32,
                        load: None,
                    }],
                    lease_id: lease,
                })
                .await
                .map(drop),
            ),
            (
                "Deregister",
                ctl.deregister(proto::ControlDeregisterRequest {
                    tenant: t.clone(),
                    instance_id: only_b.instance_id(),
                    agent: "only-b".into(),
                    lease_id: 0,
                    expected_lease_id: 0,
                })
                .await
                .map(drop),
            ),
        ];
        // Watch fails at the call (the stream never starts).
        let watch =
            ctl.watch(proto::WatchRequest { tenant: t.clone(), sidecar: None, from_revision: 0 }).await.map(drop);
        checks.push(("Watch", watch));
        for (rpc, result) in checks {
            let status = result.expect_err(&format!("{rpc} accepted tenant {tenant:?}"));
            assert_eq!(status.code(), Code::InvalidArgument, "{rpc} {tenant:?}: {status:?}");
            let (why, field) = reason(&status);
            assert_eq!(why, "INVALID_ARGUMENT");
            assert!(field.ends_with("tenant") || field == "tenant.name", "{rpc} {tenant:?} named field {field:?}");
        }
    }
    // Names that would step out of a tenant's keys are refused too.
    for name in ["../../team-b/agents/only-b", "only-b/x", "a%2F..", "team-b/"] {
        let status =
            admin.get_agent(proto::GetAgentRequest { tenant: "team-a".into(), agent: name.into() }).await.unwrap_err();
        assert_eq!(reason(&status), ("INVALID_ARGUMENT".into(), "agent".into()), "{name:?}");
        let status = admin
            .get_instance(proto::GetInstanceRequest { tenant: "team-a".into(), instance_id: name.into() })
            .await
            .unwrap_err();
        assert_eq!(reason(&status), ("INVALID_ARGUMENT".into(), "instance_id".into()), "{name:?}");
    }
    assert_eq!(ts.writes_since(before).await, Vec::<String>::new(), "an adversarial request wrote something");

    // Valid names of another tenant's things: not found, exactly as names that exist nowhere.
    let status = admin
        .get_instance(proto::GetInstanceRequest { tenant: "team-a".into(), instance_id: only_b.instance_id() })
        .await
        .unwrap_err();
    let nowhere = admin
        .get_instance(proto::GetInstanceRequest { tenant: "team-a".into(), instance_id: "only-b-000000000000".into() })
        .await
        .unwrap_err();
    assert_eq!(reason(&status).0, "INSTANCE_NOT_FOUND");
    assert_eq!(
        status.message().replace(&only_b.instance_id(), "ID"),
        nowhere.message().replace("only-b-000000000000", "ID")
    );
    let status =
        admin.get_agent(proto::GetAgentRequest { tenant: "team-a".into(), agent: "only-b".into() }).await.unwrap_err();
    assert_eq!(reason(&status).0, "AGENT_NOT_FOUND");
    let suggestions = error_info(&status).unwrap().metadata.get("suggestions").cloned().unwrap_or_default();
    assert!(!suggestions.contains("only-b"), "suggested {suggestions:?}");
    let status = admin
        .explain_route(proto::ExplainRouteRequest {
            tenant: "team-a".into(),
            target: Some(agent_reach::model::Target::capability("secret.b").into()),
            max_candidates: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&status).0, "AGENT_NOT_FOUND");
    assert!(
        !error_info(&status).unwrap().metadata.get("suggestions").cloned().unwrap_or_default().contains("secret.b")
    );
    let status = admin
        .set_instance_state(proto::SetInstanceStateRequest {
            tenant: "team-a".into(),
            instance_id: only_b.instance_id(),
            state: proto::HealthState::Paused as i32,
            reason: "not mine".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&status).0, "INSTANCE_NOT_FOUND");
    for rpc in ["GetPolicy", "DeletePolicy"] {
        let result = if rpc == "GetPolicy" {
            admin
                .get_policy(proto::GetPolicyRequest {
                    tenant: "team-a".into(),
                    kind: proto::PolicyKind::Capability as i32,
                    name: "secret.b".into(),
                })
                .await
                .map(drop)
        } else {
            admin
                .delete_policy(proto::DeletePolicyRequest {
                    tenant: "team-a".into(),
                    kind: proto::PolicyKind::Capability as i32,
                    name: "secret.b".into(),
                })
                .await
                .map(drop)
        };
        assert_eq!(reason(&result.unwrap_err()).0, "POLICY_NOT_FOUND", "{rpc}");
    }
    // Heartbeats and deregistrations that name another tenant's instance change nothing.
    let reply = ctl
        .heartbeat(proto::ControlHeartbeatRequest {
            report: None,
            tenant: "team-a".into(),
            sidecar: None,
            instances: vec![proto::InstanceHeartbeat {
                instance_id: only_b.instance_id(),
                agent: "only-b".into(),
                lease_id: lease,
                state: proto::HealthState::Down as i32,
                load: None,
            }],
            lease_id: lease,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.expired_instance_ids, [only_b.instance_id()]);
    ctl.deregister(proto::ControlDeregisterRequest {
        tenant: "team-a".into(),
        instance_id: shared_b.instance_id(),
        agent: "shared".into(),
        lease_id: 0,
        expected_lease_id: 0,
    })
    .await
    .unwrap();
    assert_eq!(ts.writes_since(before).await, Vec::<String>::new(), "a cross-tenant request wrote something");

    // Listings hold the tenant's own things only.
    let agents: Vec<String> = admin
        .list_agents(proto::ListAgentsRequest { tenant: "team-a".into(), filter: None })
        .await
        .unwrap()
        .into_inner()
        .agents
        .into_iter()
        .map(|a| a.agent)
        .collect();
    assert_eq!(agents, ["only-a", "shared"]);
    let instances = admin
        .list_instances(proto::ListInstancesRequest { tenant: "team-a".into(), filter: None })
        .await
        .unwrap()
        .into_inner()
        .instances;
    let mut ids: Vec<String> = instances.iter().map(|i| i.instance_id.clone()).collect();
    ids.sort();
    let mut want = vec![shared_a.instance_id(), only_a.instance_id()];
    want.sort();
    assert_eq!(ids, want);
    assert!(instances.iter().all(|i| i.tenant == "team-a"));
    let policies = admin
        .list_policies(proto::ListPoliciesRequest { tenant: "team-a".into(), kind: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(policies.policies.is_empty());

    // Routing: a capability both tenants offer stays in the caller's tenant; one only the
    // other tenant offers does not exist, and is not suggested.
    let client = Client::connect(&sa.local_addr().to_string()).await.unwrap();
    for _ in 0..10 {
        let reply = client.invoke("shared.cap").text("x").send().await.unwrap();
        assert_eq!(reply.instance(), shared_a.instance_id());
    }
    let err = client.invoke("secret.b").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"));
    assert!(!err.message().contains("secret.b?"), "{}", err.message());
    assert!(!err.message().contains("only-b"), "{}", err.message());
    let err = client.invoke_agent("only-b").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"));
    // Team-b's state is as it was, and team-b's sidecar still routes to its own.
    assert_eq!(sb.table().len(), 2);
    let client_b = Client::connect(&sb.local_addr().to_string()).await.unwrap();
    let reply = client_b.invoke("secret.b").text("x").send().await.unwrap();
    assert_eq!(reply.instance(), only_b.instance_id());
    assert!(st.table().is_empty());

    for agent in [shared_a, only_a, shared_b, only_b] {
        agent.shutdown().await;
    }
    for sc in [sa, sb, st] {
        sc.shutdown().await;
    }
    control.shutdown().await;
}
