//! The last routing table on disk, so a sidecar restarted while control (or etcd) is down
//! still routes: saved (atomically: temporary file, then rename) at most once a second
//! after changes, loaded at start and marked stale with its age until the watch confirms or
//! replaces it.
//!
//! The file is JSON: `{ "format": 1, "tenant", "revision", "saved_at_ms", "instances": […],
//! "policies": […] }` with the same instance and policy records control stores.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_reach::model::{Instance, InstanceRecord};
use agent_reach::policy::Policy;
use agent_reach_routing::{RoutingTable, TableHandle};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SavedInstance {
    record: InstanceRecord,
    revision: i64,
}

#[derive(Serialize, Deserialize)]
struct SavedTable {
    format: u32,
    tenant: String,
    revision: i64,
    saved_at_ms: u64,
    instances: Vec<SavedInstance>,
    policies: Vec<Policy>,
}

/// Writes `table` to `path` atomically.
pub(crate) fn save(path: &Path, tenant: &str, table: &RoutingTable) -> std::io::Result<()> {
    let saved = SavedTable {
        format: FORMAT,
        tenant: tenant.to_string(),
        revision: table.revision,
        saved_at_ms: crate::control::unix_ms(),
        instances: table
            .instances
            .values()
            .map(|m| SavedInstance { record: m.instance.record.clone(), revision: m.instance.revision })
            .collect(),
        policies: table.policies.values().map(|p| Policy::clone(p)).collect(),
    };
    let json = serde_json::to_vec(&saved).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, path)
}

/// Reads a saved table of `tenant`: the table and when it was saved (Unix ms). `None`
/// when there is no file; an error when it is unreadable or of another tenant.
pub(crate) fn load(path: &Path, tenant: &str) -> Result<Option<(RoutingTable, u64)>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let saved: SavedTable = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if saved.format != FORMAT {
        return Err(format!("{}: unknown format {}", path.display(), saved.format));
    }
    if saved.tenant != tenant {
        return Err(format!("{}: saved for tenant {:?}, not {tenant:?}", path.display(), saved.tenant));
    }
    let instances: HashMap<String, Arc<Instance>> = saved
        .instances
        .into_iter()
        .map(|s| (s.record.instance_id.clone(), Arc::new(Instance { record: s.record, revision: s.revision })))
        .collect();
    let policies = saved.policies.into_iter().map(|p| ((p.kind, p.name.clone()), Arc::new(p))).collect();
    Ok(Some((RoutingTable::build(saved.revision, instances, policies, None), saved.saved_at_ms)))
}

/// Saves the table after every change (at most once a second) until shutdown.
pub(crate) async fn run_saver(
    path: PathBuf,
    tenant: String,
    table: TableHandle,
    mut revisions: watch::Receiver<i64>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            changed = revisions.changed() => if changed.is_err() { return },
        }
        let snapshot = table.load_full();
        let (p, t) = (path.clone(), tenant.clone());
        let result = tokio::task::spawn_blocking(move || save(&p, &t, &snapshot)).await;
        match result {
            Ok(Ok(())) => tracing::debug!(path = %path.display(), "saved the routing table"),
            Ok(Err(e)) => tracing::warn!(path = %path.display(), "cannot save the routing table: {e}"),
            Err(e) => tracing::warn!("saving the routing table panicked: {e}"),
        }
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::{Capability, HealthState, Registration};
    use agent_reach::policy::{PolicyKind, PolicySpec, Strategy};

    use super::*;

    #[test]
    fn a_saved_table_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let inst = Instance {
            record: InstanceRecord {
                instance_id: "a-1".into(),
                tenant: "default".into(),
                registration: Registration {
                    agent: "a".into(),
                    capabilities: vec![Capability { name: "c".into(), tags: vec!["x".into()] }],
                    endpoint: "http://127.0.0.1:1".into(),
                    ..Default::default()
                },
                sidecar_id: "s".into(),
                sidecar_address: "127.0.0.1:2".into(),
                state: HealthState::Up,
                load: Default::default(),
                registered_at_ms: 1,
            },
            revision: 41,
        };
        let policy = Policy {
            tenant: "default".into(),
            kind: PolicyKind::Capability,
            name: "c".into(),
            spec: PolicySpec { strategy: Some(Strategy::Random), ..Default::default() },
            description: String::new(),
        };
        let table = RoutingTable::build(
            42,
            HashMap::from([("a-1".to_string(), Arc::new(inst.clone()))]),
            HashMap::from([((PolicyKind::Capability, "c".to_string()), Arc::new(policy.clone()))]),
            None,
        );
        save(&path, "default", &table).unwrap();
        let (loaded, saved_at) = load(&path, "default").unwrap().unwrap();
        assert_eq!(loaded.revision, 42);
        assert_eq!(*loaded.instances["a-1"].instance, inst);
        assert_eq!(**loaded.policy(PolicyKind::Capability, "c").unwrap(), policy);
        assert!(saved_at > 0);
        assert!(load(&path, "other").unwrap_err().contains("tenant"));
        assert!(load(&dir.path().join("missing.json"), "default").unwrap().is_none());
    }
}
