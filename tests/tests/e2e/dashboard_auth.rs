//! The dashboard with operator tokens, in a real headless Chromium: a viewer logs in and
//! sees the mesh but cannot edit; an operator validates and saves a policy from the page
//! and the sidecars get it. The token travels only in a login body and an HttpOnly cookie,
//! never in a URL or where the page's script can read it.

use std::time::Duration;

use agent_reach::policy::{Policy, PolicyKind, PolicySpec, Strategy};
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

/// POSTs `body` as JSON to a dashboard (with a session cookie when given): status, head
/// and body.
pub(crate) async fn post_json(
    addr: std::net::SocketAddr,
    path: &str,
    cookie: Option<&str>,
    body: &Value,
) -> (u16, String, String) {
    let body = body.to_string();
    let cookie = cookie.map(|c| format!("cookie: {c}\r\n")).unwrap_or_default();
    request(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{cookie}\
             connection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

async fn get(addr: std::net::SocketAddr, path: &str, cookie: Option<&str>) -> (u16, String, String) {
    let cookie = cookie.map(|c| format!("cookie: {c}\r\n")).unwrap_or_default();
    request(addr, &format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n{cookie}connection: close\r\n\r\n")).await
}

async fn request(addr: std::net::SocketAddr, request: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head[9..12].parse().unwrap(), head.to_string(), body.to_string())
}

/// The `name=value` of the `set-cookie` header in `head`.
fn session_cookie(head: &str) -> String {
    let line = head
        .lines()
        .find_map(|l| l.split_once(": ").filter(|(name, _)| name.eq_ignore_ascii_case("set-cookie")).map(|(_, v)| v))
        .expect("a session cookie");
    line.split(';').next().unwrap().to_string()
}

async fn log_in(b: &Browser, token: &str) {
    let input = b.client.wait().for_element(Locator::Css("#login-token")).await.unwrap();
    input.send_keys(token).await.unwrap();
    b.client.find(Locator::Css("#login button")).await.unwrap().click().await.unwrap();
}

const WHO: &str =
    "const w = document.querySelector('#who'); return w ? w.firstChild && w.firstChild.textContent : null;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_see_operators_edit_policies_that_reach_the_sidecars() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let bootstrap = "a-bootstrap-admin-token-for-the-dashboard-test";
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
    let (viewer_record, viewer) =
        tokens.create(Role::Viewer, vec![], Duration::from_secs(3600), "dashboard viewer").await.unwrap();
    let (_, operator) = tokens
        .create(Role::Operator, vec!["default".into()], Duration::from_secs(3600), "dashboard operator")
        .await
        .unwrap();
    let sidecar = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let t1 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["en"])]).await;
    let t2 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["zh"])]).await;
    wait_for_instances(&sidecar, &[t1.instance_id(), t2.instance_id()]).await;
    let spec = PolicySpec { strategy: Some(Strategy::RoundRobin), ..PolicySpec::default() };
    put_policy(&ts.store, &[&sidecar], capability_policy("text.translate", spec)).await;

    // Without a session: the page, but no data; a wrong token gets no cookie.
    assert_eq!(get(addr, "/", None).await.0, 200);
    let (status, _, body) = get(addr, "/api/state", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, session) = get(addr, "/api/session", None).await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&session).unwrap()["authenticated"].clone()),
        (200, json!(false))
    );
    let (status, head, _) = post_json(addr, "/api/login", None, &json!({ "token": "arat.0123.wrong" })).await;
    assert_eq!(status, 401);
    assert!(!head.to_ascii_lowercase().contains("set-cookie"), "{head}");
    // A viewer's session: an HttpOnly, SameSite=Strict cookie; reads yes, changes no.
    let (status, head, body) = post_json(addr, "/api/login", None, &json!({ "token": viewer })).await;
    assert_eq!(status, 200, "{body}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("httponly") && lower.contains("samesite=strict"), "{head}");
    assert!(!body.contains(&viewer), "the answer does not repeat the token: {body}");
    let cookie = session_cookie(&head);
    assert_eq!(get(addr, "/api/state", Some(&cookie)).await.0, 200);
    let edit = json!({ "kind": "capability", "name": "text.translate", "spec": { "strategy": "random" } });
    let (status, _, body) = post_json(addr, "/api/policies", Some(&cookie), &edit).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("viewer"), "{body}");
    // A cross-site form post (no JSON content type) is refused before anything else.
    let (status, _, _) = request(
        addr,
        &format!(
            "POST /api/policies HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             content-length: 3\r\ncookie: {cookie}\r\nconnection: close\r\n\r\na=b"
        ),
    )
    .await;
    assert_eq!(status, 415);

    // The viewer in the browser: logs in, sees the instances and policies, no editing.
    let browser = Browser::start().await;
    let b = &browser;
    let dir = crate::dashboard::screenshots();
    b.client.goto(&format!("{page}/#/instances")).await.unwrap();
    b.client.wait().for_element(Locator::Css("#login-token")).await.unwrap();
    b.screenshot(&dir.join("login.png")).await;
    log_in(b, &viewer).await;
    b.wait_until(
        "two instances",
        Duration::from_secs(15),
        "return document.querySelectorAll('tr[data-instance]').length;",
        |v| *v == json!(2),
    )
    .await;
    let who = b.client.execute(WHO, vec![]).await.unwrap();
    assert_eq!(who, json!(format!("token:{} (viewer)", viewer_record.id)));
    // The token is nowhere the page's script or the address bar can see it.
    let exposed = b
        .client
        .execute("return [document.cookie, location.href, document.documentElement.outerHTML];", vec![])
        .await
        .unwrap();
    for (i, part) in exposed.as_array().unwrap().iter().enumerate() {
        assert!(!part.as_str().unwrap().contains(&viewer), "the token shows in part {i}");
    }
    b.client.goto(&format!("{page}/#/policies")).await.unwrap();
    b.wait_until(
        "the policy, view only",
        Duration::from_secs(10),
        "return [document.querySelectorAll('tr[data-policy]').length, document.querySelectorAll('button.edit-policy').length, \
         !!document.querySelector('#policy-new')];",
        |v| *v == json!([1, 0, false]),
    )
    .await;

    assert_all_requests_succeeded(b).await;

    // The operator: logs out the viewer (the page reloads), logs in, fixes a bad policy
    // after validating it, saves it, and the sidecar routes by it.
    b.client.find(Locator::Css("#logout")).await.unwrap().click().await.unwrap();
    log_in(b, &operator).await;
    b.client.wait().for_element(Locator::Css("button.edit-policy")).await.unwrap().click().await.unwrap();
    let shown = b.client.execute("return document.querySelector('#policy-json').value;", vec![]).await.unwrap();
    let shown: Value = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    assert_eq!(shown["spec"]["strategy"], "round_robin", "{shown}");
    let set = "document.querySelector('#policy-json').value = arguments[0]; return 1;";
    let own_fallback = json!({ "kind": "capability", "name": "text.translate",
        "spec": { "strategy": "random", "fallback": { "capability": "text.translate" } } });
    b.client.execute(set, vec![json!(own_fallback.to_string())]).await.unwrap();
    b.client.find(Locator::Css("#policy-validate")).await.unwrap().click().await.unwrap();
    let result = "const r = document.querySelector('#policy-result'); return [r.className, r.textContent];";
    let refused = b.wait_until("the validation error", Duration::from_secs(10), result, |v| v[0] == "bad").await;
    assert_eq!(refused[1], "spec.fallback.capability: a target cannot be its own fallback");
    let fixed = json!({ "kind": "capability", "name": "text.translate", "description": "edited in the dashboard",
        "spec": { "strategy": "random" } });
    b.client.execute(set, vec![json!(fixed.to_string())]).await.unwrap();
    b.client.find(Locator::Css("#policy-validate")).await.unwrap().click().await.unwrap();
    b.wait_until("valid", Duration::from_secs(10), result, |v| *v == json!(["good", "Valid."])).await;
    b.screenshot(&dir.join("policy-edit.png")).await;
    b.client.find(Locator::Css("#policy-save")).await.unwrap().click().await.unwrap();
    let saved = b.wait_until("saved", Duration::from_secs(10), result, |v| v[1] != "Valid.").await;
    assert!(saved[1].as_str().unwrap().starts_with("Saved at revision "), "{saved}");
    let want = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Capability,
        name: "text.translate".into(),
        spec: PolicySpec { strategy: Some(Strategy::Random), ..PolicySpec::default() },
        description: "edited in the dashboard".into(),
    };
    wait_for_policy(&[&sidecar], &want).await;
    b.client.find(Locator::Css("#policy-close")).await.unwrap().click().await.unwrap();
    b.wait_until(
        "the edited policy in the table",
        Duration::from_secs(10),
        "const r = document.querySelector('tr[data-policy]'); return r ? r.textContent : '';",
        |v| v.as_str().is_some_and(|t| t.contains("edited in the dashboard") && t.contains("random")),
    )
    .await;

    assert_all_requests_succeeded(b).await;
    browser.close().await;
}

/// Every request the page made succeeded; nothing in the console but information.
async fn assert_all_requests_succeeded(b: &Browser) {
    let errors: Vec<(String, String)> = b.console().await.into_iter().filter(|(level, _)| level != "INFO").collect();
    assert!(errors.is_empty(), "console: {errors:?}");
    let requests = b.requests().await;
    assert!(requests.len() >= 4, "{requests:?}");
    let failed: Vec<&(String, u64)> = requests.iter().filter(|(_, status)| *status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
}
