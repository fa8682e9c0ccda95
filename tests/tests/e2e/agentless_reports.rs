//! A sidecar without local agents (only clients that are not agents call through it) still
//! sends its traffic report: control keeps it on a lease of its own, and the dashboard's
//! topology shows the sidecar's edges and the sidecar among those reporting.

use std::time::Duration;

use agent_reach::Client;
use agent_reach_control::reports::REPORTS_ROOT;
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, listener, sidecar_config, start_sidecar, wait_for_instances,
};
use serde_json::Value;

use crate::topology::get_json;

/// (caller>agent, target, calls, reporting sidecars) per edge.
fn edges(state: &Value) -> Vec<(String, String, u64, String)> {
    state["topology"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            let sidecars: Vec<&str> = e["sidecars"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
            (format!("{}>{}", s("caller"), s("agent")), s("target"), e["calls"].as_u64().unwrap(), sidecars.join(","))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_without_agents_still_reports_its_traffic() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let page = listener().await;
    let addr = page.local_addr().unwrap();
    let config = ControlConfig { lease_ttl: Duration::from_secs(20), ..ControlConfig::default() };
    let control = ControlHandle::spawn_with_dashboard(ts.store.clone(), config, listener().await, page).unwrap();
    let mut with_agents = sidecar_config(&control.endpoint(), "host-a");
    with_agents.report_interval = Duration::from_millis(200);
    let a = start_sidecar(with_agents).await;
    let mut edge_only = sidecar_config(&control.endpoint(), "edge-b");
    edge_only.report_interval = Duration::from_millis(200);
    let b = start_sidecar(edge_only).await;
    let worker = echo_agent(a.local_addr(), "worker", &[("work", &[])]).await;
    wait_for_instances(&b, &[worker.instance_id()]).await;

    // A client that is no agent calls through the agentless sidecar.
    let client = Client::connect(&b.local_addr().to_string()).await.unwrap();
    for _ in 0..7 {
        client.invoke("work").text("x").send().await.unwrap();
    }
    let want = vec![("(anonymous)>worker".to_string(), "capability work".to_string(), 7, "edge-b".to_string())];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let state = loop {
        let state = get_json(addr, "/api/state?tenant=default").await;
        if edges(&state) == want {
            break state;
        }
        assert!(tokio::time::Instant::now() < deadline, "edges: {:?}", edges(&state));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut reporting: Vec<&str> =
        state["sidecars"].as_array().unwrap().iter().map(|s| s["sidecar_id"].as_str().unwrap()).collect();
    reporting.sort();
    assert_eq!(reporting, ["edge-b", "host-a"]);

    // The agentless sidecar's report lives on a lease control granted for it. host-a sent
    // its first reports alone too (before its agent registered); from its next lease
    // renewal on (every 5 s here), its report rides on its own lease.
    let report = ts.store.get(&format!("{REPORTS_ROOT}default/edge-b")).await.unwrap().expect("edge-b's report");
    assert_ne!(report.lease, 0);
    assert_eq!(b.registry().lease(), 0, "edge-b has no lease of its own");
    let own = a.registry().lease();
    assert_ne!(own, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let other = ts.store.get(&format!("{REPORTS_ROOT}default/host-a")).await.unwrap().expect("host-a's report");
        if other.lease == own {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "host-a's report is on lease {:x}, not {own:x}", other.lease);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(report.lease, own);
}
