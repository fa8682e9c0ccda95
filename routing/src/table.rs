//! The routing table: every instance and policy of the sidecar's tenant at one store
//! revision, instances indexed by capability and by agent name.
//!
//! A table is immutable once built. The watch loop builds a new one from each snapshot or
//! batch of deltas and swaps it in whole ([`TableHandle`], an `ArcSwap`), so routing reads
//! never take a lock shared with the updater. What the sidecar learns at run time (latency,
//! in-flight calls, round-robin cursors, retry budgets) lives in `Arc`ed atomics that each
//! new table inherits from the previous one. This module does not pick instances; see
//! [`crate::route`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::{Arc, OnceLock};

use agent_reach::model::{HealthState, Instance};
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, Strategy};
use arc_swap::ArcSwap;

use crate::budget::RetryBudget;
use crate::ring::Ring;
use crate::stats::InstanceStats;

/// One instance as routing sees it: its record and what this sidecar observed of it.
#[derive(Clone, Debug)]
pub struct Member {
    pub instance: Arc<Instance>,
    pub stats: Arc<InstanceStats>,
}

impl Member {
    pub fn id(&self) -> &str {
        self.instance.id()
    }
}

/// A call in flight to a member, counted on the member and on its group until dropped.
#[derive(Debug)]
pub struct CallGuard {
    _instance: crate::stats::InFlight,
    group: Arc<GroupState>,
}

impl CallGuard {
    pub fn begin(member: &Member, group: &Arc<GroupState>) -> CallGuard {
        group.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CallGuard { _instance: member.stats.begin(), group: group.clone() }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.group.in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Run-time state of a group that survives table swaps.
#[derive(Debug, Default)]
pub struct GroupState {
    /// Round-robin cursor.
    pub cursor: AtomicUsize,
    /// Calls in flight from this sidecar to the group (bounded-load hashing).
    pub in_flight: AtomicU32,
    pub retry_budget: RetryBudget,
}

/// The instances that can serve one capability or one agent name.
#[derive(Debug, Default)]
pub struct Group {
    /// Sorted by instance id, so every sidecar sees the same order.
    pub members: Vec<Member>,
    pub state: Arc<GroupState>,
    /// The group's policy (capability policy for capability groups, agent policy for agent
    /// groups), if any.
    pub policy: Option<Arc<Policy>>,
    /// Members UP (indices), the first choice for HIGH priority calls.
    pub up: Vec<u32>,
    /// Members UP or DEGRADED, the first choice for NORMAL and LOW calls.
    pub up_or_degraded: Vec<u32>,
    /// `weighted`: cumulative weights over `up_or_degraded` (empty when unused).
    pub cumulative_weights: Vec<u64>,
    /// `weighted`: the largest member weight (for rejection sampling of tagged calls).
    pub max_weight: u32,
    /// Members carrying each tag (for capability groups, the tags of that capability), so
    /// a call with required tags samples among members that can match; sorted by tag (see
    /// [`Group::tagged`]). A group has a few tags: a sorted list costs one allocation where
    /// a map cost a table of buckets per group.
    pub by_tag: Vec<(String, Vec<u32>)>,
    ring: OnceLock<Ring>,
}

impl Group {
    fn new(
        members: Vec<Member>,
        state: Arc<GroupState>,
        policy: Option<Arc<Policy>>,
        capability: Option<&str>,
    ) -> Group {
        let mut up = Vec::with_capacity(members.len());
        let mut up_or_degraded = Vec::with_capacity(members.len());
        let mut tagged: HashMap<&str, Vec<u32>> = HashMap::new();
        for (i, m) in members.iter().enumerate() {
            for cap in &m.instance.record.registration.capabilities {
                if capability.is_none_or(|c| c == cap.name) {
                    for tag in &cap.tags {
                        let list = tagged.entry(tag.as_str()).or_default();
                        if list.last() != Some(&(i as u32)) {
                            list.push(i as u32);
                        }
                    }
                }
            }
            match m.instance.record.state {
                HealthState::Up => {
                    up.push(i as u32);
                    up_or_degraded.push(i as u32);
                }
                HealthState::Degraded => up_or_degraded.push(i as u32),
                _ => {}
            }
        }
        let mut by_tag: Vec<(String, Vec<u32>)> =
            tagged.into_iter().map(|(tag, list)| (tag.to_string(), exact(list))).collect();
        by_tag.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let spec = policy.as_ref().map(|p| &p.spec);
        let cumulative_weights = if spec.and_then(|s| s.strategy) == Some(Strategy::Weighted) {
            let mut total = 0u64;
            up_or_degraded
                .iter()
                .map(|i| {
                    total += u64::from(weight(&members[*i as usize], spec));
                    total
                })
                .collect()
        } else {
            Vec::new()
        };
        let max_weight =
            if cumulative_weights.is_empty() { 0 } else { members.iter().map(|m| weight(m, spec)).max().unwrap_or(0) };
        Group {
            members,
            state,
            policy,
            up: exact(up),
            up_or_degraded: exact(up_or_degraded),
            cumulative_weights,
            max_weight,
            by_tag,
            ring: OnceLock::new(),
        }
    }

    /// The member with instance id `id`, found by halving (members are sorted by id), not
    /// by a walk over a group that may hold thousands.
    pub fn member(&self, id: &str) -> Option<&Member> {
        self.members.binary_search_by(|m| m.id().cmp(id)).ok().map(|at| &self.members[at])
    }

    /// The members carrying `tag` (indices ascending), or None when no member does.
    pub fn tagged(&self, tag: &str) -> Option<&Vec<u32>> {
        let at = self.by_tag.binary_search_by(|(t, _)| t.as_str().cmp(tag)).ok()?;
        Some(&self.by_tag[at].1)
    }

    /// The routing strategy (policy's, else least_loaded).
    pub fn strategy(&self) -> Strategy {
        self.policy.as_ref().and_then(|p| p.spec.strategy).unwrap_or_default()
    }

    /// The group's policy rules, if any.
    pub fn spec(&self) -> Option<&PolicySpec> {
        self.policy.as_ref().map(|p| &p.spec)
    }

    /// The consistent-hash ring, built on first use.
    pub fn ring(&self) -> &Ring {
        self.ring.get_or_init(|| Ring::build(self.members.iter().map(Member::id)))
    }
}

/// A member's weight for the `weighted` strategy: the policy's weight for its version when
/// the policy lists weights (unlisted versions weigh 0), else its registration metadata
/// `weight` (default 1).
pub fn weight(m: &Member, spec: Option<&PolicySpec>) -> u32 {
    let reg = &m.instance.record.registration;
    match spec {
        Some(s) if !s.weights.is_empty() => s.weights.get(&reg.version).copied().unwrap_or(0),
        _ => reg.metadata.get("weight").and_then(|w| w.parse().ok()).unwrap_or(1),
    }
}

/// A map looked up on every call, keyed by names the mesh controls: hashed with a
/// per-process seeded foldhash, which costs a fraction of SipHash's instructions.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The policies of a table by kind and name. Several are looked up per call: by a
/// [`PolicyRef`], so no key is built for a lookup.
pub type Policies = hashbrown::HashMap<(PolicyKind, String), Arc<Policy>, foldhash::fast::RandomState>;

/// A policy key by reference: hashes and compares as the `(kind, name)` it stands for.
#[derive(Hash)]
struct PolicyRef<'a>(PolicyKind, &'a str);

impl hashbrown::Equivalent<(PolicyKind, String)> for PolicyRef<'_> {
    fn equivalent(&self, key: &(PolicyKind, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// All instances and policies of the tenant at one revision.
#[derive(Debug, Default)]
pub struct RoutingTable {
    /// Store revision the table reflects; 0 before the first snapshot.
    pub revision: i64,
    pub instances: FastMap<String, Member>,
    pub by_capability: FastMap<String, Group>,
    pub by_agent: FastMap<String, Group>,
    /// Policies by kind and name.
    pub policies: Policies,
    /// How many sidecars the instances are on, counted the first time it is asked.
    sidecars: OnceLock<usize>,
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
    /// Builds a table from all instances and policies at `revision`, keeping the run-time
    /// state of `previous` for instances and groups that are still there.
    pub fn build(
        revision: i64,
        instances: HashMap<String, Arc<Instance>>,
        policies: Policies,
        previous: Option<&RoutingTable>,
    ) -> RoutingTable {
        let members: FastMap<String, Member> = instances
            .into_iter()
            .map(|(id, instance)| {
                let stats = previous.and_then(|p| p.instances.get(&id)).map(|m| m.stats.clone()).unwrap_or_default();
                (id, Member { instance, stats })
            })
            .collect();
        // Group sizes first, so every member list is allocated once at its exact size (each
        // instance is in about three lists: its agent's and one per capability).
        let mut cap_sizes: HashMap<&str, usize> = HashMap::new();
        let mut agent_sizes: HashMap<&str, usize> = HashMap::new();
        for m in members.values() {
            let reg = &m.instance.record.registration;
            *agent_sizes.entry(reg.agent.as_str()).or_default() += 1;
            for cap in &reg.capabilities {
                *cap_sizes.entry(cap.name.as_str()).or_default() += 1;
            }
        }
        fn lists(sizes: HashMap<&str, usize>) -> HashMap<&str, Vec<Member>> {
            sizes.into_iter().map(|(name, n)| (name, Vec::with_capacity(n))).collect()
        }
        let (mut caps, mut agents) = (lists(cap_sizes), lists(agent_sizes));
        for m in members.values() {
            let reg = &m.instance.record.registration;
            if let Some(list) = agents.get_mut(reg.agent.as_str()) {
                list.push(m.clone());
            }
            for cap in &reg.capabilities {
                if let Some(list) = caps.get_mut(cap.name.as_str()) {
                    list.push(m.clone());
                }
            }
        }
        let finish = |groups: HashMap<&str, Vec<Member>>, kind: PolicyKind| -> FastMap<String, Group> {
            groups
                .into_iter()
                .map(|(name, mut list)| {
                    list.sort_by(|a, b| a.id().cmp(b.id()));
                    let prior = previous.and_then(|p| match kind {
                        PolicyKind::Agent => p.by_agent.get(name),
                        _ => p.by_capability.get(name),
                    });
                    let state = prior.map(|g| g.state.clone()).unwrap_or_default();
                    let policy = policies.get(&PolicyRef(kind, name)).cloned();
                    let capability = (kind == PolicyKind::Capability).then_some(name);
                    let group = Group::new(list, state, policy, capability);
                    (name.to_string(), group)
                })
                .collect()
        };
        let by_capability = finish(caps, PolicyKind::Capability);
        let by_agent = finish(agents, PolicyKind::Agent);
        RoutingTable { revision, instances: members, by_capability, by_agent, policies, sidecars: OnceLock::new() }
    }

    /// A new table with `change` applied.
    pub fn apply(&self, change: Change) -> RoutingTable {
        let mut instances: HashMap<String, Arc<Instance>> =
            self.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect();
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
        RoutingTable::build(change.revision, instances, policies, Some(self))
    }

    /// The policy of `kind` named `name`, if any.
    pub fn policy(&self, kind: PolicyKind, name: &str) -> Option<&Arc<Policy>> {
        self.policies.get(&PolicyRef(kind, name))
    }

    /// The tenant-wide policy, if any.
    pub fn tenant_policy(&self) -> Option<&Arc<Policy>> {
        self.policy(PolicyKind::Tenant, "default")
    }

    /// How many distinct sidecars the table's instances are on (a tenant-wide rate limit is
    /// shared among them). Counted once per table, not on every call that asks.
    pub fn sidecar_count(&self) -> usize {
        *self.sidecars.get_or_init(|| {
            self.instances.values().map(|m| m.instance.record.sidecar_id.as_str()).collect::<HashSet<_>>().len()
        })
    }

    pub fn len(&self) -> usize {
        self.instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

/// `v` in an allocation of exactly its length. (`shrink_to_fit` may keep the block:
/// allocators such as mimalloc shrink in place while the new size is at least half.)
fn exact<T>(v: Vec<T>) -> Vec<T> {
    if v.capacity() == v.len() {
        return v;
    }
    let mut out = Vec::with_capacity(v.len());
    out.extend(v);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(kind: PolicyKind, name: &str) -> Arc<Policy> {
        Arc::new(Policy {
            tenant: "default".into(),
            kind,
            name: name.into(),
            spec: PolicySpec::default(),
            description: format!("{kind:?} {name}"),
        })
    }

    #[test]
    fn a_member_is_found_by_its_id_in_its_groups() {
        let of = |id: &str, agent: &str| {
            let i = agent_reach::model::fixture::instance(id).agent(agent).capability("c", &[]).build();
            (id.to_string(), Arc::new(i))
        };
        let ids = ["m-07", "m-01", "m-10", "m-03", "n-02"];
        let instances = HashMap::from(ids.map(|id| of(id, if id.starts_with('m') { "m" } else { "n" })));
        let table = RoutingTable::build(1, instances, Policies::default(), None);
        let (caps, agent_m) = (&table.by_capability["c"], &table.by_agent["m"]);
        for id in ids {
            assert_eq!(caps.member(id).map(Member::id), Some(id));
            assert_eq!(agent_m.member(id).map(Member::id), id.starts_with('m').then_some(id));
        }
        for absent in ["", "m-00", "m-05", "m-99", "z"] {
            assert!(caps.member(absent).is_none(), "{absent}");
        }
    }

    #[test]
    fn the_sidecars_of_a_table_are_counted_once_per_table() {
        let on = |id: &str, sidecar: &str| {
            let i = agent_reach::model::fixture::instance(id).sidecar(sidecar, "127.0.0.1:1").build();
            (id.to_string(), Arc::new(i))
        };
        let instances = HashMap::from([on("a", "s1"), on("b", "s1"), on("c", "s2")]);
        let table = RoutingTable::build(1, instances, Policies::default(), None);
        assert_eq!((table.sidecar_count(), table.sidecar_count()), (2, 2));
        let change = Change { revision: 2, removed: vec!["c".into()], ..Default::default() };
        assert_eq!(table.apply(change).sidecar_count(), 1, "a new table counts again");
        assert_eq!(RoutingTable::default().sidecar_count(), 0);
    }

    #[test]
    fn a_policy_is_found_by_its_kind_and_name_only() {
        let policies = Policies::from_iter(
            [(PolicyKind::Capability, "x"), (PolicyKind::Agent, "x"), (PolicyKind::Tenant, "default")]
                .map(|(kind, name)| ((kind, name.to_string()), policy(kind, name))),
        );
        let table = RoutingTable::build(1, HashMap::new(), policies, None);
        let found = |kind, name| table.policy(kind, name).map(|p| p.description.clone());
        assert_eq!(found(PolicyKind::Capability, "x").as_deref(), Some("Capability x"));
        assert_eq!(found(PolicyKind::Agent, "x").as_deref(), Some("Agent x"));
        assert_eq!(table.tenant_policy().map(|p| p.description.as_str()), Some("Tenant default"));
        assert_eq!(found(PolicyKind::Capability, "y"), None);
        assert_eq!(found(PolicyKind::Capability, "default"), None, "a name under another kind is not found");
        assert_eq!(found(PolicyKind::Capability, "x\u{ff}"), None);
    }
}
