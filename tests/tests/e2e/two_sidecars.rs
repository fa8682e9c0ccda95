//! A control service (on the embedded store, or on etcd) and two sidecars ("host-a", "host-b"), the
//! setting most policy tests need.

use std::time::Duration;

use agent_reach::Client;
use agent_reach::RunningAgent;
use agent_reach::convert::policy_to_proto;
use agent_reach::policy::Policy;
use agent_reach::proto;
use agent_reach_control::ControlHandle;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, init_logging, sidecar_config, start_control, start_sidecar, wait_for_policy,
};
use agent_reach_sidecar::Sidecar;

pub struct Mesh {
    /// The store behind control, alive as long as the mesh.
    _store: TestStore,
    pub control: ControlHandle,
    pub a: Sidecar,
    pub b: Sidecar,
}

impl Mesh {
    pub async fn start() -> Mesh {
        Mesh::start_on(Backend::Embedded).await
    }

    /// The same mesh with control on `backend` (a real etcd process for [`Backend::Etcd`]).
    pub async fn start_on(backend: Backend) -> Mesh {
        init_logging();
        let ts = TestStore::start(backend).await;
        let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
        let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
        let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
        Mesh { _store: ts, control, a, b }
    }

    /// A client of sidecar A.
    pub async fn client(&self) -> Client {
        Client::connect(&self.a.local_addr().to_string()).await.unwrap()
    }

    /// Puts `policy` through control's Admin API, as an operator would, and waits until
    /// both sidecars have it (no restarts).
    pub async fn policy(&self, policy: Policy) {
        let status = self.put_policy(policy_to_proto(&policy, 0)).await;
        assert!(status.is_none(), "Admin refused {}: {status:?}", policy.name);
        wait_for_policy(&[&self.a, &self.b], &policy).await;
    }

    /// Puts a policy through the Admin API; the refusal, if any.
    pub async fn put_policy(&self, policy: proto::Policy) -> Option<tonic::Status> {
        let mut admin = admin_client(&self.control.endpoint()).await;
        admin.put_policy(proto::PutPolicyRequest { policy: Some(policy) }).await.err()
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
