//! The one builder of instance records for tests (unit tests of every crate, the
//! end-to-end tests, benchmarks): `fixture::instance("a-1").agent("a").capability("c",
//! &["en"]).build()` instead of a struct literal per test file. Compiled for this crate's
//! tests and, for other crates, with the `test-util` feature.
//!
//! Defaults: tenant `default`, no version, no capabilities, endpoint
//! `http://127.0.0.1:1` (gRPC), sidecar `s` at `127.0.0.1:2`, state UP, no load,
//! registered at 0, revision 1. `build()` gives the [`Instance`] routing sees, `record()`
//! the [`InstanceRecord`], `status()` the [`InstanceStatus`] control reports.
//!
//! ```
//! use agent_reach::model::{HealthState, fixture};
//!
//! let inst = fixture::instance("summarizer-1")
//!     .agent("summarizer")
//!     .capability("text.summarize", &["en", "zh"])
//!     .state(HealthState::Degraded)
//!     .build();
//! assert_eq!((inst.id(), inst.agent(), inst.revision), ("summarizer-1", "summarizer", 1));
//! assert!(inst.record.registration.capabilities[0].has_tags(&["zh".to_string()]));
//! ```

use super::{Capability, HealthState, Instance, InstanceRecord, InstanceStatus, Load, Registration, Transport};

/// An instance record with id `instance_id` and the defaults of the module documentation.
pub fn instance(instance_id: &str) -> InstanceBuilder {
    InstanceBuilder {
        instance: Instance {
            record: InstanceRecord {
                instance_id: instance_id.to_string(),
                tenant: "default".into(),
                registration: Registration {
                    agent: String::new(),
                    version: String::new(),
                    capabilities: Vec::new(),
                    endpoint: "http://127.0.0.1:1".into(),
                    transport: Transport::Grpc,
                    max_concurrency: 0,
                    metadata: Default::default(),
                },
                sidecar_id: "s".into(),
                sidecar_address: "127.0.0.1:2".into(),
                state: HealthState::Up,
                load: Load::default(),
                registered_at_ms: 0,
            },
            revision: 1,
        },
    }
}

/// A registration of `agent` (the defaults of [`instance`]), for tests that register.
pub fn registration(agent: &str) -> InstanceBuilder {
    instance("").agent(agent)
}

/// Builds an [`Instance`], its [`InstanceRecord`] or its [`Registration`]; see [`instance`].
#[derive(Clone, Debug)]
#[must_use]
pub struct InstanceBuilder {
    instance: Instance,
}

impl InstanceBuilder {
    fn reg(&mut self) -> &mut Registration {
        &mut self.instance.record.registration
    }

    pub fn agent(mut self, agent: &str) -> Self {
        self.reg().agent = agent.to_string();
        self
    }
    pub fn version(mut self, version: &str) -> Self {
        self.reg().version = version.to_string();
        self
    }
    /// Adds a capability with its tags.
    pub fn capability(mut self, name: &str, tags: &[&str]) -> Self {
        let tags = tags.iter().map(|t| t.to_string()).collect();
        self.reg().capabilities.push(Capability { name: name.to_string(), tags });
        self
    }
    pub fn endpoint(mut self, endpoint: &str) -> Self {
        self.reg().endpoint = endpoint.to_string();
        self
    }
    pub fn transport(mut self, transport: Transport) -> Self {
        self.reg().transport = transport;
        self
    }
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.reg().max_concurrency = n;
        self
    }
    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.reg().metadata.insert(key.to_string(), value.to_string());
        self
    }
    pub fn tenant(mut self, tenant: &str) -> Self {
        self.instance.record.tenant = tenant.to_string();
        self
    }
    /// The instance's sidecar: its id and mesh address.
    pub fn sidecar(mut self, sidecar_id: &str, address: &str) -> Self {
        self.instance.record.sidecar_id = sidecar_id.to_string();
        self.instance.record.sidecar_address = address.to_string();
        self
    }
    pub fn state(mut self, state: HealthState) -> Self {
        self.instance.record.state = state;
        self
    }
    pub fn load(mut self, load: Load) -> Self {
        self.instance.record.load = load;
        self
    }
    pub fn registered_at_ms(mut self, ms: i64) -> Self {
        self.instance.record.registered_at_ms = ms;
        self
    }
    /// The store revision the record was written at.
    pub fn revision(mut self, revision: i64) -> Self {
        self.instance.revision = revision;
        self
    }

    pub fn build(self) -> Instance {
        self.instance
    }
    pub fn record(self) -> InstanceRecord {
        self.instance.record
    }
    /// The record as control reports it: reported state = its state, no holds, first
    /// registration of its id, at its revision.
    pub fn status(self) -> InstanceStatus {
        let Instance { record, revision } = self.instance;
        InstanceStatus { reported_state: record.state, record, revision, holds: Vec::new(), generation: 1 }
    }
    pub fn registration(self) -> Registration {
        self.instance.record.registration
    }
    /// The registration as the wire carries it (`Register`, `ControlRegisterRequest`).
    pub fn proto_registration(self) -> crate::proto::AgentRegistration {
        self.registration().into()
    }
}
