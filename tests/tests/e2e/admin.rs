//! The Admin API end to end on etcd: listings with filters, policies (validated whole),
//! tenant records and route explanations.

use std::time::Duration;

use agent_reach::model::Target;
use agent_reach::proto;
use agent_reach::reason::error_info;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, echo_agent, init_logging, sidecar_config, start_control, start_sidecar,
    wait_for_instances, wait_for_state,
};

fn field(status: &tonic::Status) -> String {
    error_info(status).and_then(|i| i.metadata.get("field").cloned()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_policies_tenants_and_explanations() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(20)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let en = echo_agent(a.local_addr(), "translator", &[("text.translate", &["en"])]).await;
    let zh = echo_agent(a.local_addr(), "translator", &[("text.translate", &["en", "zh"]), ("text.detect", &[])]).await;
    let zh2 = echo_agent(a.local_addr(), "translator", &[("text.translate", &["zh"])]).await;
    let sum = echo_agent(a.local_addr(), "summarizer", &[("text.summarize", &[])]).await;
    let all = [en.instance_id(), zh.instance_id(), zh2.instance_id(), sum.instance_id()];
    wait_for_instances(&a, &all).await;
    let mut admin = admin_client(&control.endpoint()).await;
    let tenant = || "default".to_string();

    // Listings and filters.
    let list = |filter: proto::InstanceFilter| proto::ListInstancesRequest { tenant: tenant(), filter: Some(filter) };
    let ids = |reply: proto::ListInstancesReply| {
        let mut ids: Vec<String> = reply.instances.into_iter().map(|i| i.instance_id).collect();
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let zh_filter =
        proto::InstanceFilter { capability: "text.translate".into(), tags: vec!["zh".into()], ..Default::default() };
    assert_eq!(
        ids(admin.list_instances(list(zh_filter.clone())).await.unwrap().into_inner()),
        sorted(vec![zh.instance_id(), zh2.instance_id()])
    );
    let by_agent = proto::InstanceFilter { agent: "summarizer".into(), ..Default::default() };
    assert_eq!(ids(admin.list_instances(list(by_agent)).await.unwrap().into_inner()), [sum.instance_id()]);
    let agent = admin
        .get_agent(proto::GetAgentRequest { tenant: tenant(), agent: "translator".into() })
        .await
        .unwrap()
        .into_inner();
    let summary = agent.agent.unwrap();
    assert_eq!((summary.instances, summary.versions.clone()), (3, vec!["1.0.0".to_string()]));
    let caps: Vec<(String, Vec<String>)> = summary.capabilities.into_iter().map(|c| (c.name, c.tags)).collect();
    assert_eq!(
        caps,
        [("text.detect".to_string(), vec![]), ("text.translate".to_string(), vec!["en".to_string(), "zh".to_string()])]
    );
    assert_eq!(agent.instances.len(), 3);
    let err =
        admin.get_agent(proto::GetAgentRequest { tenant: tenant(), agent: "translater".into() }).await.unwrap_err();
    assert_eq!(error_info(&err).unwrap().metadata["suggestions"], "translator");

    // Explain: a held instance and one without the tag are skipped, with reasons.
    admin
        .set_instance_state(proto::SetInstanceStateRequest {
            tenant: tenant(),
            instance_id: zh2.instance_id(),
            state: proto::HealthState::Paused as i32,
            reason: "canary off".into(),
        })
        .await
        .unwrap();
    wait_for_state(&a, &zh2.instance_id(), agent_reach::model::HealthState::Paused).await;
    let paused = proto::InstanceFilter { states: vec![proto::HealthState::Paused as i32], ..Default::default() };
    assert_eq!(ids(admin.list_instances(list(paused)).await.unwrap().into_inner()), [zh2.instance_id()]);
    let target = Target { tags: vec!["zh".into()], ..Target::capability("text.translate") };
    let explained = admin
        .explain_route(proto::ExplainRouteRequest {
            tenant: tenant(),
            target: Some(target.into()),
            max_candidates: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let candidates: Vec<String> =
        explained.candidates.iter().map(|c| c.instance.as_ref().unwrap().instance_id.clone()).collect();
    assert_eq!(candidates, [zh.instance_id()]);
    let mut skipped: Vec<(String, String)> =
        explained.skipped.iter().map(|s| (s.instance_id.clone(), s.reason.clone())).collect();
    skipped.sort();
    let mut want =
        vec![(en.instance_id(), "MISSING_TAGS".to_string()), (zh2.instance_id(), "STATE_PAUSED".to_string())];
    want.sort();
    assert_eq!(skipped, want);
    assert!(explained.revision >= a.table().revision);

    // Policies: stored whole, or rejected whole with the field.
    let policy = |spec: proto::PolicySpec| proto::Policy {
        tenant: tenant(),
        kind: proto::PolicyKind::Capability as i32,
        name: "text.translate".into(),
        spec: Some(spec),
        description: "translation".into(),
        revision: 0,
    };
    let good = proto::PolicySpec {
        strategy: proto::Strategy::RoundRobin as i32,
        default_timeout_ms: 1500,
        rate_limit: Some(proto::RateLimit { per_second: 50.0, burst: 10 }),
        ..Default::default()
    };
    let stored =
        admin.put_policy(proto::PutPolicyRequest { policy: Some(policy(good.clone())) }).await.unwrap().into_inner();
    let stored = stored.policy.unwrap();
    assert!(stored.revision > 0);
    a.wait_for_table(Duration::from_secs(10), |t| !t.policies.is_empty()).await.unwrap();
    let revision = ts.store.current_revision().await.unwrap();
    let bad_cases = [
        (
            proto::PolicySpec {
                breaker: Some(proto::CircuitBreaker { failure_rate: 2.0, ..Default::default() }),
                ..good.clone()
            },
            "policy.spec.breaker.failure_rate",
        ),
        (proto::PolicySpec { hash_key: "user".into(), ..good.clone() }, "policy.spec.hash_key"),
        (proto::PolicySpec { cache_ttl_ms: 100, ..good.clone() }, "policy.spec.cache_ttl_ms"),
        (proto::PolicySpec { strategy: 99, ..good.clone() }, "policy.spec.strategy"),
        // Numeric ranges (agent_reach::policy::ranges).
        (
            proto::PolicySpec { rate_limit: Some(proto::RateLimit { per_second: 1e-30, burst: 1 }), ..good.clone() },
            "policy.spec.rate_limit.per_second",
        ),
        (
            proto::PolicySpec {
                rate_limit: Some(proto::RateLimit { per_second: 1.0, burst: u32::MAX }),
                ..good.clone()
            },
            "policy.spec.rate_limit.burst",
        ),
        (
            proto::PolicySpec {
                retry: Some(proto::RetryPolicy { max_payload_bytes: u32::MAX, ..Default::default() }),
                ..good.clone()
            },
            "policy.spec.retry.max_payload_bytes",
        ),
        (
            proto::PolicySpec {
                breaker: Some(proto::CircuitBreaker { window_ms: u32::MAX, ..Default::default() }),
                ..good.clone()
            },
            "policy.spec.breaker.window_ms",
        ),
    ];
    for (spec, expected) in bad_cases {
        let err = admin.put_policy(proto::PutPolicyRequest { policy: Some(policy(spec)) }).await.unwrap_err();
        assert_eq!((err.code(), field(&err)), (tonic::Code::InvalidArgument, expected.to_string()));
    }
    let tiny_rate =
        proto::PolicySpec { rate_limit: Some(proto::RateLimit { per_second: 1e-30, burst: 1 }), ..good.clone() };
    let err = admin.put_policy(proto::PutPolicyRequest { policy: Some(policy(tiny_rate)) }).await.unwrap_err();
    assert_eq!(err.message(), "invalid policy.spec.rate_limit.per_second: must be a number between 0.001 and 1000000");
    let err = admin
        .put_policy(proto::PutPolicyRequest { policy: Some(proto::Policy { kind: 0, ..policy(good.clone()) }) })
        .await
        .unwrap_err();
    assert_eq!(field(&err), "policy.kind");
    let err = admin.put_policy(proto::PutPolicyRequest { policy: None }).await.unwrap_err();
    assert_eq!(field(&err), "policy");
    // Nothing of the rejected policies was stored or reached the sidecar.
    assert_eq!(ts.writes_since(revision).await, Vec::<String>::new());
    let got = admin
        .get_policy(proto::GetPolicyRequest {
            tenant: tenant(),
            kind: proto::PolicyKind::Capability as i32,
            name: "text.translate".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .policy
        .unwrap();
    assert_eq!(got, stored);
    let in_table = a.table().policy(agent_reach::policy::PolicyKind::Capability, "text.translate").cloned().unwrap();
    assert_eq!(in_table.spec.default_timeout_ms, Some(1500));
    admin
        .put_policy(proto::PutPolicyRequest {
            policy: Some(proto::Policy {
                kind: proto::PolicyKind::Tenant as i32,
                name: "default".into(),
                spec: Some(proto::PolicySpec {
                    rate_limit: Some(proto::RateLimit { per_second: 1000.0, burst: 100 }),
                    ..Default::default()
                }),
                ..policy(good.clone())
            }),
        })
        .await
        .unwrap();
    let listed =
        admin.list_policies(proto::ListPoliciesRequest { tenant: tenant(), kind: 0 }).await.unwrap().into_inner();
    let names: Vec<(i32, String)> = listed.policies.iter().map(|p| (p.kind, p.name.clone())).collect();
    assert_eq!(
        names,
        [
            (proto::PolicyKind::Capability as i32, "text.translate".to_string()),
            (proto::PolicyKind::Tenant as i32, "default".to_string())
        ]
    );
    let only_tenant = admin
        .list_policies(proto::ListPoliciesRequest { tenant: tenant(), kind: proto::PolicyKind::Tenant as i32 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(only_tenant.policies.len(), 1);
    let delete = || proto::DeletePolicyRequest {
        tenant: tenant(),
        kind: proto::PolicyKind::Capability as i32,
        name: "text.translate".into(),
    };
    admin.delete_policy(delete()).await.unwrap();
    a.wait_for_table(Duration::from_secs(10), |t| t.policies.len() == 1).await.unwrap();
    let err = admin.delete_policy(delete()).await.unwrap_err();
    assert_eq!(error_info(&err).unwrap().reason, "POLICY_NOT_FOUND");

    // Tenant records: created once, described again, listed by name.
    let put = |name: &str, description: &str| proto::PutTenantRequest {
        tenant: Some(proto::Tenant { name: name.into(), description: description.into(), ..Default::default() }),
    };
    let first = admin.put_tenant(put("team-x", "first")).await.unwrap().into_inner().tenant.unwrap();
    assert!(first.created_at_ms > 0);
    admin.put_tenant(put("team-a", "")).await.unwrap();
    let again = admin.put_tenant(put("team-x", "second")).await.unwrap().into_inner().tenant.unwrap();
    assert_eq!((again.created_at_ms, again.description.as_str()), (first.created_at_ms, "second"));
    let tenants = admin.list_tenants(proto::ListTenantsRequest {}).await.unwrap().into_inner().tenants;
    let names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["team-a", "team-x"]);
    let err = admin.put_tenant(put("team-y", &"d".repeat(2000))).await.unwrap_err();
    assert_eq!(field(&err), "tenant.description");

    for agent in [en, zh, zh2, sum] {
        agent.shutdown().await;
    }
    a.shutdown().await;
    control.shutdown().await;
}
