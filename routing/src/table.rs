//! The routing table: every instance and policy of the sidecar's tenant at one store
//! revision, instances indexed by capability and by agent name.
//!
//! A table is immutable once built. The watch loop builds a new one from each snapshot or
//! batch of deltas and swaps it in whole ([`TableHandle`], an `ArcSwap`), so routing reads
//! never take a lock shared with the updater. This module does not pick instances; see
//! [`crate::route`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use agent_reach::model::Instance;
use agent_reach::policy::{Policy, PolicyKind};
use arc_swap::ArcSwap;

/// The instances that can serve one capability or one agent name.
#[derive(Debug, Default)]
pub struct Group {
    /// Sorted by instance id, so every sidecar sees the same order.
    pub instances: Vec<Arc<Instance>>,
    /// Round-robin cursor.
    pub cursor: AtomicUsize,
}

/// All instances of the tenant at one revision.
#[derive(Debug, Default)]
pub struct RoutingTable {
    /// Store revision the table reflects; 0 before the first snapshot.
    pub revision: i64,
    pub instances: HashMap<String, Arc<Instance>>,
    pub by_capability: HashMap<String, Group>,
    pub by_agent: HashMap<String, Group>,
    /// Policies by kind and name.
    pub policies: HashMap<(PolicyKind, String), Arc<Policy>>,
}

/// Changes at one revision, as a watch delta carries them.
#[derive(Debug, Default)]
pub struct Change {
    pub revision: i64,
    pub upserted: Vec<Instance>,
    pub removed: Vec<String>,
    pub upserted_policies: Vec<Policy>,
    pub removed_policies: Vec<(PolicyKind, String)>,
}

impl RoutingTable {
    /// Builds a table from all instances and policies at `revision`.
    pub fn build(
        revision: i64,
        instances: HashMap<String, Arc<Instance>>,
        policies: HashMap<(PolicyKind, String), Arc<Policy>>,
    ) -> RoutingTable {
        let mut by_capability: HashMap<String, Group> = HashMap::new();
        let mut by_agent: HashMap<String, Group> = HashMap::new();
        for inst in instances.values() {
            let reg = &inst.record.registration;
            by_agent.entry(reg.agent.clone()).or_default().instances.push(inst.clone());
            for cap in &reg.capabilities {
                by_capability.entry(cap.name.clone()).or_default().instances.push(inst.clone());
            }
        }
        for g in by_capability.values_mut().chain(by_agent.values_mut()) {
            g.instances.sort_by(|a, b| a.id().cmp(b.id()));
        }
        RoutingTable { revision, instances, by_capability, by_agent, policies }
    }

    /// A new table with `change` applied.
    pub fn apply(&self, change: Change) -> RoutingTable {
        let mut instances = self.instances.clone();
        for id in &change.removed {
            instances.remove(id);
        }
        for inst in change.upserted {
            instances.insert(inst.record.instance_id.clone(), Arc::new(inst));
        }
        let mut policies = self.policies.clone();
        for key in change.removed_policies {
            policies.remove(&key);
        }
        for p in change.upserted_policies {
            policies.insert((p.kind, p.name.clone()), Arc::new(p));
        }
        RoutingTable::build(change.revision, instances, policies)
    }

    /// The policy of `kind` named `name`, if any.
    pub fn policy(&self, kind: PolicyKind, name: &str) -> Option<&Arc<Policy>> {
        self.policies.get(&(kind, name.to_string()))
    }

    pub fn len(&self) -> usize {
        self.instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

/// The current table, swapped atomically.
#[derive(Clone, Debug, Default)]
pub struct TableHandle(Arc<ArcSwap<RoutingTable>>);

impl TableHandle {
    pub fn load(&self) -> arc_swap::Guard<Arc<RoutingTable>> {
        self.0.load()
    }
    pub fn load_full(&self) -> Arc<RoutingTable> {
        self.0.load_full()
    }
    pub fn store(&self, table: RoutingTable) {
        self.0.store(Arc::new(table));
    }
}
