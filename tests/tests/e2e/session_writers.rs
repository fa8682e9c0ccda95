//! Which agents may write which session context fields, end to end on a real etcd: the
//! tenant policy's `session_writers` rules (put through the Admin API) are enforced by
//! control on the writer its sidecar verified by the agent credential. Two agents with
//! different credentials on two sidecars: each writes only the fields a rule gives it; a
//! denied write or delete is PERMISSION_DENIED / `CONTEXT_WRITER_NOT_ALLOWED` and leaves the
//! session unchanged; a write without a credential is not verified and is refused on covered
//! fields; naming another instance than the credential's is `CONTEXT_WRITER_MISMATCH`.

use std::time::Duration;

use agent_reach::convert::policy_to_proto;
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, SessionWriters};
use agent_reach::reason::{self, Reason};
use agent_reach::{Policy as Write, SessionError};
use agent_reach_e2e::{
    Backend, TestStore, admin_client, echo_agent, init_logging, listener, sidecar_config, start_sidecar_with_admin,
    wait_for_instances, wait_for_policy,
};

fn writers(fields: &str, agents: &[&str], capabilities: &[&str]) -> SessionWriters {
    SessionWriters {
        fields: fields.into(),
        agents: agents.iter().map(|a| a.to_string()).collect(),
        capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
    }
}

/// The refusal's (field, rule, writer agent, writer instance, verified).
fn denied(result: Result<impl std::fmt::Debug, SessionError>) -> (String, String, String, String, bool) {
    match result {
        Err(SessionError::WriterNotAllowed { field, rule, writer_agent, writer_instance, verified }) => {
            (field, rule, writer_agent, writer_instance, verified)
        }
        other => panic!("expected WriterNotAllowed, got {other:?}"),
    }
}

fn text(field: &agent_reach::proto::SessionField) -> String {
    String::from_utf8_lossy(&field.value).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_agents_a_rule_names_write_its_fields_as_their_verified_selves() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = agent_reach_control::ControlHandle::spawn_with_admin(
        ts.store.clone(),
        agent_reach_control::ControlConfig { lease_ttl: Duration::from_secs(20), ..Default::default() },
        listener().await,
        listener().await,
    )
    .unwrap();
    let a = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-b")).await;
    let refund = echo_agent(a.local_addr(), "refund", &[("refund.decide", &[])]).await;
    let support = echo_agent(b.local_addr(), "support", &[("support.answer", &[])]).await;
    let (refund_id, support_id) = (refund.instance_id(), support.instance_id());
    wait_for_instances(&a, &[refund_id.clone(), support_id.clone()]).await;
    wait_for_instances(&b, &[refund_id.clone(), support_id.clone()]).await;

    let tenant_policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Tenant,
        name: "default".into(),
        spec: PolicySpec {
            session_writers: vec![writers("refund.*", &["refund"], &[]), writers("user_id", &[], &["support.answer"])],
            ..Default::default()
        },
        description: String::new(),
    };
    let mut admin = admin_client(&control.endpoint()).await;
    admin
        .put_policy(agent_reach::proto::PutPolicyRequest { policy: Some(policy_to_proto(&tenant_policy, 0)) })
        .await
        .expect("put the tenant policy through Admin");
    wait_for_policy(&[&a, &b], &tenant_policy).await;
    // A rule belongs to the tenant policy: an agent policy with one is refused.
    let misplaced = Policy { kind: PolicyKind::Agent, name: "refund".into(), ..tenant_policy.clone() };
    let refused = admin
        .put_policy(agent_reach::proto::PutPolicyRequest { policy: Some(policy_to_proto(&misplaced, 0)) })
        .await
        .expect_err("session_writers on an agent policy");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // Each agent writes the fields its rule gives it (by agent name, by capability).
    let by_refund = refund.client().session("case-1");
    let by_support = support.client().session("case-1");
    by_refund.put([("refund.amount", "120", Write::LastWriter)]).await.expect("refund writes refund.*");
    let v = by_support.set("user_id", "u-7").await.expect("support.answer instances write user_id");
    let before = by_refund.read_at_least(v).await.expect("read");
    assert_eq!(before.fields["refund.amount"].writer_agent, "refund");
    assert_eq!(before.fields["refund.amount"].writer_instance, refund_id);
    assert_eq!(before.fields["user_id"].writer_instance, support_id);

    // Denied: the other agent's fields, even inside a multi-field write (which stores nothing).
    assert_eq!(
        denied(by_support.put([("note", "n", Write::LastWriter), ("refund.amount", "0", Write::LastWriter)]).await),
        ("refund.amount".into(), "refund.*".into(), "support".into(), support_id.clone(), true)
    );
    assert_eq!(
        denied(by_refund.set("user_id", "u-0").await),
        ("user_id".into(), "user_id".into(), "refund".into(), refund_id.clone(), true)
    );
    // A field no rule covers is open to both.
    let note = by_support.set("note", "from support").await.expect("uncovered field");
    assert!(note > v);

    // Without a credential the writer is only named, not verified: refused on covered fields
    // even when it names the very instance the rule allows; open fields still take it.
    let named_only = agent_reach::Client::lazy(&a.local_addr().to_string()).unwrap().with_caller("refund", &refund_id);
    let anonymous = named_only.session("case-1");
    assert_eq!(
        denied(anonymous.set("refund.amount", "999").await),
        ("refund.amount".into(), "refund.*".into(), "refund".into(), refund_id.clone(), false)
    );
    anonymous.set("note", "unverified").await.expect("an uncovered field takes an unverified writer");

    // A credential names its own instance: claiming another is refused at the sidecar.
    let claiming = support.client().with_caller("refund", &refund_id).session("case-1");
    match claiming.set("refund.amount", "1").await {
        Err(SessionError::WriterMismatch { writer_instance, credential_instance }) => {
            assert_eq!((writer_instance, credential_instance), (refund_id.clone(), support_id.clone()));
        }
        other => panic!("expected WriterMismatch, got {other:?}"),
    }
    // A credential that does not verify is refused, never downgraded to an unverified writer.
    let forged = named_only.with_credential(format!("arac.{refund_id}.not-the-secret")).session("case-1");
    match forged.set("note", "x").await {
        Err(SessionError::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
            assert_eq!(reason::error_info(&status).unwrap().reason, "AGENT_CREDENTIAL_INVALID");
        }
        other => panic!("expected AGENT_CREDENTIAL_INVALID, got {other:?}"),
    }

    // Deletes are writes: a covered field only by its writers; the whole session only by a
    // writer every rule allows (neither agent is).
    assert_eq!(denied(by_support.delete(&["refund.amount"]).await).0, "refund.amount");
    assert_eq!(denied(by_support.delete(&[]).await).1, "refund.*");
    assert_eq!(denied(by_refund.delete(&[]).await).1, "user_id");
    assert!(!denied(anonymous.delete(&["user_id"]).await).4, "an unverified delete");

    // Every refusal left the session as it was: same fields, values and writers.
    let after = by_refund.read().await.expect("read");
    let last = by_support.read().await.expect("read").version;
    assert_eq!(after.version, last);
    assert_eq!(text(&after.fields["refund.amount"]), "120");
    assert_eq!(after.fields["refund.amount"].version, before.fields["refund.amount"].version);
    assert_eq!(text(&after.fields["user_id"]), "u-7");
    assert_eq!(text(&after.fields["note"]), "unverified");
    assert_eq!(after.fields.len(), 3);
    // The allowed writer deletes its own field.
    assert!(by_refund.delete(&["refund.amount"]).await.expect("refund deletes refund.amount"));

    // Control counted each refusal: 2 + 1 (anonymous) + 4 deletes = 7; the mismatch and the
    // forged credential never reached it.
    let counters = &control.stats().sessions;
    assert_eq!(counters.refusals(Reason::ContextWriterNotAllowed), 7);
    // Each sidecar counted its own agents' refusals: on A refund's two and the unverified
    // write and delete; on B support's write and two deletes.
    let refusals = "CONTEXT_WRITER_NOT_ALLOWED";
    assert_eq!((a.session_stats().writes(refusals), b.session_stats().writes(refusals)), (4, 3));

    for agent in [refund, support] {
        agent.abort();
    }
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
