//! Session write policies declared by agent and capability policies (set through the Admin
//! API), enforced by control on every write, end to end on a real etcd: a field an agent
//! policy declares `first_writer` is locked by its first write, a field a capability policy
//! declares `compare_and_set` takes version-checked writes only, and a write asking for
//! another policy is refused with `CONTEXT_POLICY_OVERRIDE` (and stores nothing) unless the
//! rule allows overrides. The session metrics of control and of the sidecars count the same
//! writes and refusals exactly.

use std::time::Duration;

use agent_reach::convert::policy_to_proto;
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, SessionFieldRule, SessionWritePolicy};
use agent_reach::reason::Reason;
use agent_reach::{Policy as Write, SessionError};
use agent_reach_e2e::{
    Backend, TestStore, admin_client, echo_agent, eventually, init_logging, listener, sidecar_config,
    start_sidecar_with_admin, wait_for_instances, wait_for_policy,
};

fn rule(policy: SessionWritePolicy, allow_override: bool) -> SessionFieldRule {
    SessionFieldRule { policy, allow_override }
}

fn policy(kind: PolicyKind, name: &str, rules: &[(&str, SessionFieldRule)]) -> Policy {
    Policy {
        tenant: "default".into(),
        kind,
        name: name.into(),
        spec: PolicySpec { session: rules.iter().map(|(f, r)| (f.to_string(), *r)).collect(), ..Default::default() },
        description: String::new(),
    }
}

/// `GET path` on an admin port: the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The value of the sample `name{labels}` (exactly as exposed) in a Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn number(field: &agent_reach::proto::SessionField) -> u64 {
    String::from_utf8_lossy(&field.value).parse().expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declared_first_writer_and_compare_and_set_hold_and_overrides_are_refused() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control_admin = listener().await;
    let control_admin_addr = control_admin.local_addr().unwrap();
    let control = agent_reach_control::ControlHandle::spawn_with_admin(
        ts.store.clone(),
        agent_reach_control::ControlConfig { lease_ttl: Duration::from_secs(20), ..Default::default() },
        listener().await,
        control_admin,
    )
    .unwrap();
    let a = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-b")).await;
    let intake = echo_agent(a.local_addr(), "intake", &[("intake.start", &[])]).await;
    let audit = echo_agent(b.local_addr(), "audit", &[("audit.check", &[])]).await;
    let tally_a = echo_agent(a.local_addr(), "tally", &[("tally.count", &[])]).await;
    let tally_b = echo_agent(b.local_addr(), "tally", &[("tally.count", &[])]).await;
    let ids = [intake.instance_id(), audit.instance_id(), tally_a.instance_id(), tally_b.instance_id()];
    wait_for_instances(&a, &ids).await;
    wait_for_instances(&b, &ids).await;

    let agent_policy = policy(
        PolicyKind::Agent,
        "intake",
        &[
            ("user_id", rule(SessionWritePolicy::FirstWriter, false)),
            ("note", rule(SessionWritePolicy::FirstWriter, true)),
        ],
    );
    let capability_policy =
        policy(PolicyKind::Capability, "tally.count", &[("n", rule(SessionWritePolicy::CompareAndSet, false))]);
    let mut admin = admin_client(&control.endpoint()).await;
    for p in [&agent_policy, &capability_policy] {
        admin
            .put_policy(agent_reach::proto::PutPolicyRequest { policy: Some(policy_to_proto(p, 0)) })
            .await
            .expect("put policy through Admin");
        wait_for_policy(&[&a, &b], p).await;
    }
    // What was stored reads back through Admin with its rules.
    let stored = admin
        .get_policy(agent_reach::proto::GetPolicyRequest {
            tenant: "default".into(),
            kind: agent_reach::proto::PolicyKind::Agent as i32,
            name: "intake".into(),
        })
        .await
        .expect("get policy")
        .into_inner();
    let spec = stored.policy.and_then(|p| p.spec).expect("spec");
    assert_eq!(spec.session["user_id"].policy, agent_reach::proto::WritePolicy::FirstWriter as i32);

    // first_writer by the agent policy: a plain `set` is a first write, then the field is locked.
    let by_intake = intake.client().session("case-1");
    let first = by_intake.set("user_id", "u-1").await.expect("first write");
    let read = by_intake.read_at_least(first).await.expect("read");
    assert!(read.fields["user_id"].locked, "the declared first_writer locked the field");
    match by_intake.set("user_id", "u-2").await {
        Err(SessionError::FieldLocked { field, writer_agent, writer_instance, version }) => {
            assert_eq!((field.as_str(), writer_agent.as_str(), version), ("user_id", "intake", first));
            assert_eq!(writer_instance, intake.instance_id());
        }
        other => panic!("expected FieldLocked, got {other:?}"),
    }
    // The lock stands for every writer, with or without rules of its own.
    let by_audit = audit.client().session("case-1");
    assert!(matches!(by_audit.set("user_id", "u-9").await, Err(SessionError::FieldLocked { .. })));

    // An override the rule does not allow is refused whole: nothing of the write is stored.
    let refused = by_intake.put([("status", "open", Write::Declared), ("user_id", "u-3", Write::LastWriter)]).await;
    match refused {
        Err(SessionError::PolicyOverride { field, declared_policy, requested_policy, policy_kind, policy_name }) => {
            assert_eq!(
                (field.as_str(), declared_policy.as_str(), requested_policy.as_str()),
                ("user_id", "first_writer", "last_writer")
            );
            assert_eq!((policy_kind.as_str(), policy_name.as_str()), ("agent", "intake"));
        }
        other => panic!("expected PolicyOverride, got {other:?}"),
    }
    let read = by_intake.read_at_least(first).await.expect("read");
    assert_eq!(read.version, first, "the refused write stored nothing");
    assert!(!read.fields.contains_key("status"));
    // Where the rule allows it, a write may name its own policy.
    by_intake.put([("note", "n-1", Write::LastWriter)]).await.expect("allowed override");
    let v = by_intake.put([("note", "n-2", Write::LastWriter)]).await.expect("last writer again");
    assert!(!by_intake.read_at_least(v).await.unwrap().fields["note"].locked);

    // compare_and_set by the capability policy, for every instance offering it.
    let tallies = [tally_a.client().session("case-1"), tally_b.client().session("case-1")];
    let created = tallies[0].set("n", "0").await.expect("create the counter (expects no field)");
    match tallies[1].set("n", "1").await {
        Err(SessionError::Conflict { field, current_version }) => {
            assert_eq!((field.as_str(), current_version), ("n", created))
        }
        other => panic!("expected Conflict (declared compare_and_set), got {other:?}"),
    }
    match tallies[1].put([("n", "1", Write::LastWriter)]).await {
        Err(SessionError::PolicyOverride { policy_kind, policy_name, .. }) => {
            assert_eq!((policy_kind.as_str(), policy_name.as_str()), ("capability", "tally.count"));
        }
        other => panic!("expected PolicyOverride, got {other:?}"),
    }
    // 4 writers × 25 increments with retries on conflict: exactly 100.
    let mut writers = Vec::new();
    for w in 0..4 {
        let session = tallies[w % 2].clone();
        writers.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..25 {
                loop {
                    let current = session.get("n").await.expect("read n").expect("n exists");
                    let next = (number(&current) + 1).to_string();
                    match session.put([("n", next, Write::CompareAndSet(current.version))]).await {
                        Ok(_) => break,
                        Err(SessionError::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("increment failed: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for w in writers {
        conflicts += w.await.expect("writer");
    }
    let n = by_audit.get("n").await.unwrap().expect("n");
    assert_eq!(number(&n), 100);

    // Control counted every refusal by reason, and counts the tenant's live sessions.
    let counters = &control.stats().sessions;
    assert_eq!(counters.refusals(Reason::ContextPolicyOverride), 2);
    assert_eq!(counters.refusals(Reason::ContextFieldLocked), 2);
    assert_eq!(counters.refusals(Reason::ContextConflict), 1 + u64::from(conflicts));
    // Writes applied: intake 3 (user_id, note twice), the counter's creation and 100 increments.
    assert_eq!(counters.writes.load(std::sync::atomic::Ordering::Relaxed), 104);
    let text = http_get(control_admin_addr, "/metrics").await;
    let refused = r#"agent_reach_control_session_refusals_total{reason="CONTEXT_POLICY_OVERRIDE"}"#;
    assert_eq!(sample(&text, refused), Some(2.0), "{text}");
    assert_eq!(sample(&text, "agent_reach_control_session_writes_total"), Some(104.0));
    eventually(Duration::from_secs(15), "control counts the live session", || counters.live("default") == Some(1))
        .await;
    let text = http_get(control_admin_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"agent_reach_control_sessions_live{tenant="default"}"#), Some(1.0), "{text}");

    // Each sidecar counted its own agents' writes by outcome: on A, intake's 3 and
    // tally-a's creation and 50 increments; on B, tally-b's 50 increments.
    let ok = r#"agent_reach_session_writes_total{outcome="ok"}"#;
    let override_refused = r#"agent_reach_session_writes_total{outcome="CONTEXT_POLICY_OVERRIDE"}"#;
    let locked = r#"agent_reach_session_writes_total{outcome="CONTEXT_FIELD_LOCKED"}"#;
    let text_a = http_get(a.admin_addr().unwrap(), "/metrics").await;
    let text_b = http_get(b.admin_addr().unwrap(), "/metrics").await;
    assert_eq!(sample(&text_a, ok), Some(54.0), "{text_a}");
    assert_eq!(sample(&text_b, ok), Some(50.0), "{text_b}");
    assert_eq!((sample(&text_a, override_refused), sample(&text_b, override_refused)), (Some(1.0), Some(1.0)));
    assert_eq!((sample(&text_a, locked), sample(&text_b, locked)), (Some(1.0), Some(1.0)));
    let reads = |text: &str, result: &str| {
        sample(text, &format!(r#"agent_reach_session_cache_reads_total{{result="{result}"}}"#)).unwrap_or(0.0)
    };
    let stats = a.session_stats();
    assert_eq!(reads(&text_a, "hit"), stats.hits.load(std::sync::atomic::Ordering::Relaxed) as f64);
    assert!(reads(&text_a, "hit") + reads(&text_a, "miss") >= 50.0, "{text_a}");
    assert!(sample(&text_a, r#"agent_reach_session_watches_total{event="started"}"#).unwrap_or(0.0) >= 1.0);
    assert_eq!(sample(&text_a, "agent_reach_session_cache_sessions"), Some(1.0), "{text_a}");

    for agent in [intake, audit, tally_a, tally_b] {
        agent.abort();
    }
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
