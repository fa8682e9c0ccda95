//! Alert thresholds set by policy and policies deleted from the dashboard, in a real
//! headless Chromium against a real mesh on a real etcd: an operator sees the thresholds in
//! force per agent, raises one agent's minimum from the page and the alert fires for that
//! agent only; then deletes the policy (after a confirmation), the sidecar drops it and the
//! alert resolves. A viewer cannot delete.

use std::time::Duration;

use agent_reach::policy::{Policy, PolicyKind, PolicySpec, Strategy};
use agent_reach::policy_alerts::AlertThresholds;
use agent_reach_control::config::BootstrapToken;
use agent_reach_control::identity::{OperatorAuth, Role};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::browser::Browser;
use agent_reach_e2e::{
    Backend, TestStore, capability_policy, echo_agent, init_logging, listener, put_policy, sidecar_config,
    start_sidecar, wait_for_instances, wait_for_policy,
};
use fantoccini::Locator;
use serde_json::{Value, json};

use crate::dashboard_auth::post_json;

const THRESHOLDS: &str = "return [...document.querySelectorAll('tr[data-thresholds]')].map(r => \
     [r.dataset.thresholds, r.querySelector('.min-healthy').textContent, r.querySelector('.lost').textContent]);";
const ALERTS: &str = "return [...document.querySelectorAll('tr[data-alert]')].map(r => \
     [r.dataset.alert, r.cells[0].textContent, r.querySelector('.message').textContent]);";
const POLICIES: &str = "return [...document.querySelectorAll('tr[data-policy]')].map(r => r.dataset.policy);";
const RESULT: &str = "const r = document.querySelector('#policy-result'); return [r.className, r.textContent];";
const SET: &str = "document.querySelector('#policy-json').value = arguments[0]; return 1;";

async fn log_in(b: &Browser, token: &str) {
    let input = b.client.wait().for_element(Locator::Css("#login-token")).await.unwrap();
    input.send_keys(token).await.unwrap();
    b.client.find(Locator::Css("#login button")).await.unwrap().click().await.unwrap();
}

/// Clicks the button matching `button` in the row whose `data-*` attribute is `row`. The
/// page redraws its tables on every state event, which can replace the button between
/// finding and clicking it (a stale element): it is then found again, a few times at most.
async fn click_in_row(b: &Browser, row: &str, button: &str) {
    let selector = format!("{row} {button}");
    let mut tries = 0;
    loop {
        let element = b.client.wait().for_element(Locator::Css(&selector)).await.unwrap();
        match element.click().await {
            Ok(()) => return,
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("click on {selector} failed ({e}); finding it again");
            }
            Err(e) => panic!("click on {selector}: {e}"),
        }
    }
}

/// The `name=value` of the `set-cookie` header in `head`.
fn cookie(head: &str) -> String {
    let line = head
        .lines()
        .find_map(|l| l.split_once(": ").filter(|(name, _)| name.eq_ignore_ascii_case("set-cookie")).map(|(_, v)| v))
        .expect("a session cookie");
    line.split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_set_alert_thresholds_per_agent_and_delete_policies_from_the_page() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let bootstrap = "a-bootstrap-admin-token-for-the-thresholds-test";
    let dashboard = listener().await;
    let addr = dashboard.local_addr().unwrap();
    let page = format!("http://{addr}");
    let config = ControlConfig {
        lease_ttl: Duration::from_secs(20),
        admin_token: Some(BootstrapToken(bootstrap.into())),
        ..ControlConfig::default()
    };
    let control = ControlHandle::spawn_with_dashboard(ts.store.clone(), config, listener().await, dashboard).unwrap();
    let tokens = OperatorAuth::new(ts.store.clone(), bootstrap);
    let (_, viewer) = tokens.create(Role::Viewer, vec![], Duration::from_secs(3600), "viewer").await.unwrap();
    let (_, operator) =
        tokens.create(Role::Operator, vec!["default".into()], Duration::from_secs(3600), "operator").await.unwrap();
    // Agents heartbeat every second (UNKNOWN after 2 s of silence), so a loaded machine
    // does not make an instance briefly unhealthy: the alerts below are the policy's alone.
    let mut sidecar_cfg = sidecar_config(&control.endpoint(), "host-a");
    sidecar_cfg.heartbeat_interval = Duration::from_secs(1);
    let sidecar = start_sidecar(sidecar_cfg).await;
    let t1 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &[])]).await;
    let t2 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &[])]).await;
    let s1 = echo_agent(sidecar.local_addr(), "summarizer", &[("text.summarize", &[])]).await;
    wait_for_instances(&sidecar, &[t1.instance_id(), t2.instance_id(), s1.instance_id()]).await;
    let round_robin = PolicySpec { strategy: Some(Strategy::RoundRobin), ..PolicySpec::default() };
    put_policy(&ts.store, &[&sidecar], capability_policy("text.translate", round_robin)).await;

    let browser = Browser::start().await;
    let b = &browser;
    let dir = crate::dashboard::screenshots();
    b.client.goto(&format!("{page}/#/alerts")).await.unwrap();
    log_in(b, &operator).await;
    // The thresholds in force: control's defaults for the tenant and both agents.
    let defaults = b
        .wait_until("the thresholds", Duration::from_secs(15), THRESHOLDS, |v| {
            v.as_array().is_some_and(|a| a.len() == 3)
        })
        .await;
    let lost_default = "2 (default) within 15000 ms (default)";
    assert_eq!(
        defaults,
        json!([
            ["tenant/default", "1 (default)", lost_default],
            ["agent/summarizer", "1 (default)", lost_default],
            ["agent/translator", "1 (default)", lost_default],
        ])
    );
    assert_eq!(b.client.execute(ALERTS, vec![]).await.unwrap(), json!([]));

    // The operator edits the translator's thresholds: the editor opens on a new agent
    // policy holding the thresholds in force.
    click_in_row(b, "tr[data-thresholds='agent/translator']", "button.edit-thresholds").await;
    let shown = b.client.execute("return document.querySelector('#policy-json').value;", vec![]).await.unwrap();
    let shown: Value = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    assert_eq!(
        shown,
        json!({ "kind": "agent", "name": "translator", "description": "", "spec": {
            "alerts": { "min_healthy": 1, "lost_count": 2, "lost_window_ms": 15000, "fallback_calls": 5,
                        "breakers_open_percent": 50 } } })
    );
    let too_short = json!({ "kind": "agent", "name": "translator", "spec": { "alerts": { "min_healthy": 3, "lost_window_ms": 5 } } });
    b.client.execute(SET, vec![json!(too_short.to_string())]).await.unwrap();
    b.client.find(Locator::Css("#policy-validate")).await.unwrap().click().await.unwrap();
    let refused = b.wait_until("the validation error", Duration::from_secs(10), RESULT, |v| v[0] == "bad").await;
    assert_eq!(refused[1], "spec.alerts.lost_window_ms: must be between 1000 and 3600000");
    let three = json!({ "kind": "agent", "name": "translator", "description": "two are not enough",
        "spec": { "alerts": { "min_healthy": 3 } } });
    b.client.execute(SET, vec![json!(three.to_string())]).await.unwrap();
    b.client.find(Locator::Css("#policy-save")).await.unwrap().click().await.unwrap();
    let saved = b.wait_until("saved", Duration::from_secs(10), RESULT, |v| v[0] == "good").await;
    assert!(saved[1].as_str().unwrap().starts_with("Saved at revision "), "{saved}");
    let agent_policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "translator".into(),
        spec: PolicySpec {
            alerts: AlertThresholds { min_healthy: Some(3), ..AlertThresholds::default() },
            ..PolicySpec::default()
        },
        description: "two are not enough".into(),
    };
    wait_for_policy(&[&sidecar], &agent_policy).await;
    b.client.find(Locator::Css("#policy-close")).await.unwrap().click().await.unwrap();
    // The translator's minimum is its policy's now; the summarizer keeps the default.
    b.wait_until("the translator's own minimum", Duration::from_secs(10), THRESHOLDS, |v| {
        *v == json!([
            ["tenant/default", "1 (default)", lost_default],
            ["agent/summarizer", "1 (default)", lost_default],
            ["agent/translator", "3 (policy)", lost_default],
        ])
    })
    .await;
    let fired = b
        .wait_until("the translator's alert", Duration::from_secs(15), ALERTS, |v| {
            v.as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    assert_eq!(
        fired,
        json!([["below_min_healthy", "firing", "translator has 2 healthy instance(s), fewer than the minimum 3"]])
    );
    b.screenshot(&dir.join("alert-thresholds.png")).await;

    // A viewer may not delete; a policy that does not exist is named in the refusal.
    let (status, head, body) = post_json(addr, "/api/login", None, &json!({ "token": viewer })).await;
    assert_eq!(status, 200, "{body}");
    let viewer_cookie = cookie(&head);
    let delete = json!({ "kind": "agent", "name": "translator" });
    let (status, _, body) = post_json(addr, "/api/policies/delete", Some(&viewer_cookie), &delete).await;
    assert_eq!(status, 403, "{body}");
    let (status, head, _) = post_json(addr, "/api/login", None, &json!({ "token": operator })).await;
    assert_eq!(status, 200);
    let operator_cookie = cookie(&head);
    let missing = json!({ "kind": "agent", "name": "nobody" });
    let (status, _, body) = post_json(addr, "/api/policies/delete", Some(&operator_cookie), &missing).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("nobody"), "{body}");
    let unknown = json!({ "kind": "agent", "name": "translator", "force": true });
    let (status, _, body) = post_json(addr, "/api/policies/delete", Some(&operator_cookie), &unknown).await;
    assert_eq!(status, 400, "{body}");
    sidecar
        .wait_for_table(Duration::from_secs(5), |t| t.policy(PolicyKind::Agent, "translator").is_some())
        .await
        .expect("the refused deletions left the policy");

    // The operator deletes the agent policy from the page: asked first, cancelled, asked
    // again, confirmed.
    b.client.goto(&format!("{page}/#/policies")).await.unwrap();
    let both = json!(["agent/translator", "capability/text.translate"]);
    b.wait_until("both policies", Duration::from_secs(10), POLICIES, |v| *v == both).await;
    let row = "tr[data-policy='agent/translator']";
    click_in_row(b, row, "button.delete-policy").await;
    let question = b
        .wait_until(
            "the confirmation",
            Duration::from_secs(5),
            &format!("const c = document.querySelector(\"{row} td.confirm\"); return c ? c.textContent : '';"),
            |v| v.as_str().is_some_and(|s| !s.is_empty()),
        )
        .await;
    assert_eq!(question, json!("Delete the agent policy translator? Yes, deleteCancel"));
    b.screenshot(&dir.join("policy-delete.png")).await;
    click_in_row(b, row, "button.cancel-delete").await;
    b.wait_until(
        "the row's buttons again",
        Duration::from_secs(5),
        &format!(
            "return [document.querySelectorAll(\"{row} button.delete-policy\").length, \
             document.querySelectorAll(\"{row} td.confirm\").length];"
        ),
        |v| *v == json!([1, 0]),
    )
    .await;
    assert_eq!(b.client.execute(POLICIES, vec![]).await.unwrap(), both);
    assert!(sidecar.table().policy(PolicyKind::Agent, "translator").is_some(), "cancelled: nothing deleted");
    click_in_row(b, row, "button.delete-policy").await;
    click_in_row(b, row, "button.confirm-delete").await;
    let outcome = b
        .wait_until(
            "the deletion",
            Duration::from_secs(10),
            "const d = document.querySelector('#policy-deleted'); return d ? [d.className, d.textContent] : null;",
            |v| !v.is_null(),
        )
        .await;
    assert_eq!(outcome[0], "good", "{outcome}");
    let text = outcome[1].as_str().unwrap();
    assert!(text.starts_with("Deleted agent policy translator at revision "), "{text}");
    b.wait_until("one policy left", Duration::from_secs(10), POLICIES, |v| *v == json!(["capability/text.translate"]))
        .await;
    sidecar
        .wait_for_table(Duration::from_secs(10), |t| t.policy(PolicyKind::Agent, "translator").is_none())
        .await
        .expect("the sidecar dropped the deleted policy");

    // The default minimum again: the alert resolves.
    b.client.goto(&format!("{page}/#/alerts")).await.unwrap();
    b.wait_until("the alert resolved", Duration::from_secs(15), ALERTS, |v| {
        *v == json!([[
            "below_min_healthy",
            "resolved",
            "translator has 2 healthy instance(s), fewer than the minimum 3"
        ]])
    })
    .await;
    b.wait_until("the default minimum again", Duration::from_secs(10), THRESHOLDS, |v| *v == defaults).await;

    // Nothing went wrong in the page.
    let errors: Vec<(String, String)> = b.console().await.into_iter().filter(|(level, _)| level != "INFO").collect();
    assert!(errors.is_empty(), "console: {errors:?}");
    let requests = b.requests().await;
    assert!(requests.len() >= 4, "{requests:?}");
    let failed: Vec<&(String, u64)> = requests.iter().filter(|(_, status)| *status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    browser.close().await;
}
