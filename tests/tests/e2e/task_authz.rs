//! Durable tasks run as the agent that submitted them: `SubmitTask` records the caller its
//! agent credential proves, and every dispatch is made as that caller over mutual TLS, so
//! the target's authorization policy decides about a task exactly as about a call. A sidecar
//! with a local API token dispatches its tasks too (dispatch does not go through the port).
//! Real etcd, certificates made in the test.

use std::time::{Duration, Instant};

use agent_reach::policy::{Authorization, Policy, PolicyKind, PolicySpec};
use agent_reach::proto::{self, TaskState};
use agent_reach::{Agent, Client, Reply, RunningAgent};
use agent_reach_e2e::*;
use agent_reach_sidecar::Sidecar;
use tonic::Code;

use crate::identity::{anonymous_channel, create_token, identity_settings, mtls_control};

fn state(t: &proto::Task) -> TaskState {
    t.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default()
}

/// An agent answering, for `work` and `open`, its verified caller and the caller it was
/// told, as "verified=<agent or ->;said=<agent or ->".
async fn whoami(sidecar: &Sidecar) -> RunningAgent {
    let answer = |call: agent_reach::Call| async move {
        if call.task().is_none() {
            return Err(agent_reach::HandlerError::new(Code::InvalidArgument, "not a task"));
        }
        let verified = call.verified_caller().map_or("-".to_string(), |c| c.agent.clone());
        let said = call.caller().map_or("-".to_string(), |c| c.agent.clone());
        Ok(Reply::text(format!("verified={verified};said={said}")))
    };
    Agent::builder("worker")
        .sidecar(sidecar.local_addr().to_string())
        .handle("work", answer)
        .handle("open", answer)
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("worker start")
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("ar-api-token", token.parse().unwrap());
    request
}

fn result_text(t: &proto::Task) -> String {
    let part = t.artifacts.iter().find(|a| a.name == "result").and_then(|a| a.parts.first());
    part.map(|p| String::from_utf8_lossy(&p.data).into_owned()).unwrap_or_default()
}

async fn run(client: &Client, what: &str) -> proto::Task {
    let submitted = client.submit("work").text("x").send().await.unwrap_or_else(|e| panic!("{what}: submit: {e}"));
    tokio::time::timeout(Duration::from_secs(30), submitted.wait())
        .await
        .unwrap_or_else(|_| panic!("{what}: no final state in 30s"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_as_its_verified_submitter_and_the_targets_policy_decides() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = proto::admin_client::AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "team-t", 0, false).await;
    let api_token = "the-local-api-token-of-sidecar-c";
    let start = |id: &'static str, local_token: Option<&str>| {
        let mut config = sidecar_config(&control.endpoint(), id);
        config.tenant = "team-t".into();
        config.identity = Some(identity_settings(&control, &token));
        config.local_token = local_token.map(|t| agent_reach_sidecar::local_access::ApiToken::new(t).unwrap());
        start_sidecar(config)
    };
    let (a, b) = (start("task-a", None).await, start("task-b", None).await);
    let c = start("task-c", Some(api_token)).await;
    // The worker is on B: every dispatch from A (or C) crosses the mesh over mutual TLS.
    let worker = whoami(&b).await;
    let planner = echo_agent(a.local_addr(), "planner", &[("plan", &[])]).await;
    let intruder = echo_agent(a.local_addr(), "intruder", &[("intrude", &[])]).await;
    let ids = [worker.instance_id(), planner.instance_id(), intruder.instance_id()];
    for s in [&a, &b, &c] {
        wait_for_instances(s, &ids).await;
    }

    let policy = Policy {
        tenant: "team-t".into(),
        kind: PolicyKind::Capability,
        name: "work".into(),
        spec: PolicySpec {
            authorization: Some(Authorization {
                allowed_agents: vec!["planner".into()],
                allow_anonymous: false,
                ..Default::default()
            }),
            ..Default::default()
        },
        description: "only the planner".into(),
    };
    admin
        .put_policy(proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(&policy, 0)) })
        .await
        .expect("put policy");
    wait_for_policy(&[&a, &b, &c], &policy).await;

    // The planner's task completes; the worker sees the planner as the verified caller.
    let task = run(&planner.client(), "planner").await;
    assert_eq!(state(&task), TaskState::Completed, "{task:?}");
    assert_eq!(result_text(&task), "verified=planner;said=planner");
    let verified = task.verified_submitter.clone().expect("the verified submitter is recorded");
    assert_eq!((verified.agent, verified.instance_id), ("planner".to_string(), planner.instance_id()));
    assert_eq!(worker.handled(), 1);

    // Refused by the policy: the task is rejected with NOT_AUTHORIZED and never reaches
    // the worker, whatever the submitter names itself.
    let anonymous = Client::lazy(&a.local_addr().to_string()).unwrap();
    let cases = [
        ("intruder", intruder.client(), Some("intruder")),
        ("intruder naming itself planner", intruder.client().with_caller("planner", "p-1"), Some("intruder")),
        ("anonymous naming itself planner", anonymous.with_caller("planner", "p-1"), None),
    ];
    for (what, client, recorded) in cases {
        let task = run(&client, what).await;
        assert_eq!(state(&task), TaskState::Rejected, "{what}: {task:?}");
        let status = task.status.clone().unwrap_or_default();
        assert_eq!(status.reason, "NOT_AUTHORIZED", "{what}: {status:?}");
        assert!(status.detail.contains("capability/work"), "{what}: the policy is named: {status:?}");
        assert_eq!(task.verified_submitter.as_ref().map(|c| c.agent.as_str()), recorded, "{what}");
        assert_eq!(task.attempts.len(), 1, "{what}: a refusal is not retried: {:?}", task.attempts);
        assert_eq!(task.attempts[0].outcome, "NOT_AUTHORIZED", "{what}");
    }
    assert_eq!(worker.handled(), 1, "no refused task reached the worker");

    // A credential the sidecar did not issue is refused at submit, not made anonymous.
    let bogus = anonymous.with_credential(format!("arac.{}.not-the-secret", planner.instance_id()));
    let e = bogus.submit("work").text("x").send().await.expect_err("bogus credential");
    assert_eq!((e.code(), e.reason()), (Code::Unauthenticated, Some("AGENT_CREDENTIAL_INVALID")), "{e}");

    // Sidecar C requires its local API token: a task submitted with it is dispatched (in
    // process, so without presenting the token again) and completes, anonymously, on a
    // capability without an authorization.
    let mut raw = proto::sidecar_client::SidecarClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", c.local_addr())).unwrap().connect_lazy(),
    );
    let submit = proto::SubmitTaskRequest {
        target: Some(agent_reach::model::Target::capability("open").into()),
        message: Some(proto::TaskMessage {
            parts: vec![proto::TaskPart { data: "x".into(), content_type: "text/plain".into(), ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = raw.submit_task(submit.clone()).await.expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    let id = raw
        .submit_task(with_token(submit, api_token))
        .await
        .expect("submit with the token")
        .into_inner()
        .task
        .unwrap()
        .id;
    let deadline = Instant::now() + Duration::from_secs(30);
    let task = loop {
        let get = proto::GetTaskRequest { task_id: id.clone(), ..Default::default() };
        let task = raw.get_task(with_token(get, api_token)).await.expect("get").into_inner();
        if state(&task) == TaskState::Completed || state(&task) == TaskState::Rejected {
            break task;
        }
        assert!(Instant::now() < deadline, "task on C still open: {task:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(state(&task), TaskState::Completed, "{task:?}");
    assert_eq!(result_text(&task), "verified=-;said=-");
    assert_eq!(worker.handled(), 2);
}
