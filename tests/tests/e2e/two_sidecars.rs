//! A control service on the embedded store and two sidecars ("host-a", "host-b"), the
//! setting most policy tests need.

use std::time::Duration;

use agent_reach::Client;
use agent_reach::RunningAgent;
use agent_reach::policy::Policy;
use agent_reach_control::ControlHandle;
use agent_reach_e2e::{Backend, TestStore, init_logging, put_policy, sidecar_config, start_control, start_sidecar};
use agent_reach_sidecar::Sidecar;

pub struct Mesh {
    pub ts: TestStore,
    pub control: ControlHandle,
    pub a: Sidecar,
    pub b: Sidecar,
}

impl Mesh {
    pub async fn start() -> Mesh {
        init_logging();
        let ts = TestStore::start(Backend::Embedded).await;
        let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
        let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
        let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
        Mesh { ts, control, a, b }
    }

    /// A client of sidecar A.
    pub async fn client(&self) -> Client {
        Client::connect(&self.a.local_addr().to_string()).await.unwrap()
    }

    /// Stores `policy` and waits until both sidecars have it.
    pub async fn policy(&self, policy: Policy) {
        put_policy(&self.ts.store, &[&self.a, &self.b], policy).await;
    }

    pub async fn stop(self, agents: Vec<RunningAgent>) {
        for agent in agents {
            agent.abort();
        }
        self.a.stop().await;
        self.b.stop().await;
        self.control.shutdown().await;
    }
}
