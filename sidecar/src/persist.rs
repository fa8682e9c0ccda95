//! The last routing table on disk, so a sidecar restarted while control (or etcd) is down
//! still routes: saved at most once a second after changes, atomically and durably (a
//! uniquely named 0600 temporary file, fsync, rename, fsync of the directory) in a
//! directory others cannot write to (by default the user's state directory, not `/tmp`).
//! At start it is loaded only if every record and policy in it is valid, and only as a
//! stale table: at revision 0, so the first answer from control is a snapshot that
//! replaces it whole — nothing in the file outlives that answer.
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

/// [`SavedInstance`] as written: borrowed from the table, not copied.
#[derive(Serialize)]
struct SavingInstance<'a> {
    record: &'a InstanceRecord,
    revision: i64,
}

/// [`SavedTable`] as written: the table's records are streamed into the file, so saving a
/// table of 10,000 instances copies none of them and builds no document in memory.
#[derive(Serialize)]
struct SavingTable<'a> {
    format: u32,
    tenant: &'a str,
    revision: i64,
    saved_at_ms: u64,
    instances: Vec<SavingInstance<'a>>,
    policies: Vec<&'a Policy>,
}

/// The default table file, `<state dir>/agent-reach/<tenant>-<port>.table.json`, where the
/// state directory is `$XDG_STATE_HOME`, else `$HOME/.local/state` — a directory of the
/// user's, never a shared one such as `/tmp`. `None` (no persistence) when neither is set.
pub(crate) fn default_path(tenant: &str, port: u16) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()).map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| PathBuf::from(h).join(".local/state"))
    })?;
    Some(base.join("agent-reach").join(format!("{tenant}-{port}.table.json")))
}

/// Refuses a directory that others may write to: anyone who can write there can plant or
/// swap the table file.
fn check_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(std::io::Error::other(format!(
                "{} is writable by others (mode {:o}); use a private state directory",
                dir.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

/// The directory holding `path` (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Writes `table` to `path` atomically and durably: a new temporary file of a unique name
/// (mode 0600) in the same directory, fsynced, renamed over `path`, then the directory
/// fsynced. The directory is created (mode 0700) when missing and refused when others
/// may write to it.
pub(crate) fn save(path: &Path, tenant: &str, table: &RoutingTable) -> std::io::Result<()> {
    let saving = saving(tenant, table, table.revision, crate::control::unix_ms());
    write_private_with(path, |out| serde_json::to_writer(out, &saving).map_err(std::io::Error::other))
}

/// What [`save`] writes of `table`, at `revision` and `saved_at_ms`.
fn saving<'a>(tenant: &'a str, table: &'a RoutingTable, revision: i64, saved_at_ms: u64) -> SavingTable<'a> {
    SavingTable {
        format: FORMAT,
        tenant,
        revision,
        saved_at_ms,
        instances: table
            .instances
            .values()
            .map(|m| SavingInstance { record: &m.instance.record, revision: m.instance.revision })
            .collect(),
        policies: table.policies.values().map(|p| &**p).collect(),
    }
}

/// The file [`save`] would write of `table` at `revision` and `saved_at_ms`, in memory
/// (for the round trip of the fuzz target, [`crate::fuzzing::table_file`]).
pub(crate) fn encode(tenant: &str, table: &RoutingTable, revision: i64, saved_at_ms: u64) -> Vec<u8> {
    serde_json::to_vec(&saving(tenant, table, revision, saved_at_ms)).expect("a table serializes")
}

/// Writes `bytes` to `path` atomically and durably, readable by this user only (see
/// [`save`]); also keeps the workload certificate and key (`identity_file`).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_private_with(path, |out| std::io::Write::write_all(out, bytes))
}

/// [`write_private`] with the content streamed by `write` into a buffered file.
fn write_private_with(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::Write;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = dir_of(path);
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    check_dir(dir)?;
    let name = path.file_name().ok_or_else(|| std::io::Error::other("the file has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        crate::control::unix_ms()
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|f| {
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, f);
        write(&mut out)?;
        out.flush()?;
        out.get_ref().sync_all()?;
        std::fs::rename(&tmp, path)
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory is.
    std::fs::File::open(dir)?.sync_all()
}

/// Checks everything a loaded file claims: every instance and policy is valid, of
/// `tenant`, not duplicated, and no newer than the file's revision.
fn validate(saved: &SavedTable, tenant: &str) -> Result<(), String> {
    if saved.revision < 0 {
        return Err(format!("negative revision {}", saved.revision));
    }
    let mut ids = std::collections::HashSet::new();
    for (i, s) in saved.instances.iter().enumerate() {
        let r = &s.record;
        let bad = |why: String| format!("instances[{i}] ({:?}): {why}", r.instance_id);
        agent_reach::model::validate_name("instance_id", &r.instance_id).map_err(|e| bad(e.to_string()))?;
        if r.tenant != tenant {
            return Err(bad(format!("of tenant {:?}, not {tenant:?}", r.tenant)));
        }
        r.registration.validate().map_err(|e| bad(e.to_string()))?;
        if r.sidecar_id.is_empty() {
            return Err(bad("empty sidecar_id".into()));
        }
        let port_ok = r.sidecar_address.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) && !host.chars().any(char::is_whitespace)
        });
        if !port_ok {
            return Err(bad(format!("sidecar_address {:?} is not host:port", r.sidecar_address)));
        }
        if s.revision <= 0 || s.revision > saved.revision {
            return Err(bad(format!("revision {} outside 1..={}", s.revision, saved.revision)));
        }
        if !ids.insert(r.instance_id.as_str()) {
            return Err(bad("listed twice".into()));
        }
    }
    let mut names = std::collections::HashSet::new();
    for (i, p) in saved.policies.iter().enumerate() {
        let bad = |why: String| format!("policies[{i}] ({:?} {:?}): {why}", p.kind, p.name);
        p.validate().map_err(|e| bad(e.to_string()))?;
        if p.tenant != tenant {
            return Err(bad(format!("of tenant {:?}, not {tenant:?}", p.tenant)));
        }
        if !names.insert((p.kind, p.name.as_str())) {
            return Err(bad("listed twice".into()));
        }
    }
    Ok(())
}

/// Reads a saved table of `tenant`: the table and when it was saved (Unix ms). `None`
/// when there is no file; an error naming the file and the first bad field when it is
/// unreadable, writable by others, of another tenant, or holds anything invalid — the
/// sidecar then routes from nothing until control answers.
///
/// The table comes back at revision 0 whatever the file says, so it is stale until
/// control answers: the first watch asks for a snapshot, which replaces it whole, and no
/// delta applies on top of the file (an instance planted in it cannot survive).
pub(crate) fn load(path: &Path, tenant: &str) -> Result<Option<(RoutingTable, u64)>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    check_dir(dir_of(path)).map_err(|e| format!("{}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(format!("{}: writable by others (mode {:o})", path.display(), mode & 0o7777));
        }
    }
    parse(&bytes, tenant).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

/// A table file's content as a table of `tenant` at revision 0 and when it was saved;
/// the first bad thing in it otherwise. Never panics, whatever the bytes.
pub(crate) fn parse(bytes: &[u8], tenant: &str) -> Result<(RoutingTable, u64), String> {
    let saved: SavedTable = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if saved.format != FORMAT {
        return Err(format!("unknown format {}", saved.format));
    }
    if saved.tenant != tenant {
        return Err(format!("saved for tenant {:?}, not {tenant:?}", saved.tenant));
    }
    validate(&saved, tenant)?;
    tracing::debug!(revision = saved.revision, "loaded the saved routing table");
    let instances: HashMap<String, Arc<Instance>> = saved
        .instances
        .into_iter()
        .map(|s| (s.record.instance_id.clone(), Arc::new(Instance { record: s.record, revision: s.revision })))
        .collect();
    let policies = saved.policies.into_iter().map(|p| ((p.kind, p.name.clone()), Arc::new(p))).collect();
    Ok((RoutingTable::build(0, instances, policies, None), saved.saved_at_ms))
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
    use agent_reach::model::{Target, fixture};
    use agent_reach::policy::{PolicyKind, PolicySpec, Strategy};
    use agent_reach::proto;

    use super::*;
    use crate::control::{Applied, WatchStats, apply};

    fn instance(id: &str, revision: i64) -> Instance {
        fixture::instance(id).agent("a").capability("c", &["x"]).registered_at_ms(1).revision(revision).build()
    }

    fn policy() -> Policy {
        Policy {
            tenant: "default".into(),
            kind: PolicyKind::Capability,
            name: "c".into(),
            spec: PolicySpec { strategy: Some(Strategy::Random), ..Default::default() },
            description: String::new(),
        }
    }

    fn table(instances: &[Instance]) -> RoutingTable {
        RoutingTable::build(
            42,
            instances.iter().map(|i| (i.record.instance_id.clone(), Arc::new(i.clone()))).collect(),
            agent_reach_routing::table::Policies::from_iter([(
                (PolicyKind::Capability, "c".to_string()),
                Arc::new(policy()),
            )]),
            None,
        )
    }

    /// A private state directory, as the default one is.
    fn private_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        dir
    }

    /// The file content of a table of tenant "default" with `ids` at `revisions`.
    fn file_of(ids: &[(String, i64)]) -> Vec<u8> {
        let saved = SavedTable {
            format: FORMAT,
            tenant: "default".into(),
            revision: 1_000,
            saved_at_ms: 7,
            instances: ids
                .iter()
                .map(|(id, r)| SavedInstance { record: instance(id, *r).record, revision: *r })
                .collect(),
            policies: vec![policy()],
        };
        serde_json::to_vec(&saved).unwrap()
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic_the_table_file_parser(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1024)) {
            let _ = parse(&bytes, "default");
        }

        #[test]
        fn a_valid_table_file_round_trips_and_any_corruption_of_it_is_handled(
            ids in proptest::collection::btree_map("[a-z][a-z0-9-]{0,20}", 1i64..=1_000, 0..6),
            at in proptest::prelude::any::<proptest::sample::Index>(),
            byte in proptest::prelude::any::<u8>(),
        ) {
            let ids: Vec<(String, i64)> = ids.into_iter().collect();
            let file = file_of(&ids);
            let (table, saved_at) = parse(&file, "default").unwrap();
            proptest::prop_assert_eq!(saved_at, 7);
            proptest::prop_assert_eq!(table.revision, 0);
            proptest::prop_assert_eq!(table.instances.len(), ids.len());
            for (id, revision) in &ids {
                proptest::prop_assert_eq!(table.instances[id].instance.revision, *revision);
            }
            let mut corrupt = file.clone();
            corrupt[at.index(file.len())] = byte;
            let _ = parse(&corrupt, "default");
        }
    }

    #[test]
    fn a_saved_table_loads_back_as_stale() {
        let dir = private_dir();
        let path = dir.path().join("state").join("t.json");
        let inst = instance("a-1", 41);
        save(&path, "default", &table(std::slice::from_ref(&inst))).unwrap();
        let (loaded, saved_at) = load(&path, "default").unwrap().unwrap();
        // Revision 0: the first watch asks control for a snapshot.
        assert_eq!(loaded.revision, 0);
        assert_eq!(*loaded.instances["a-1"].instance, inst);
        assert_eq!(**loaded.policy(PolicyKind::Capability, "c").unwrap(), policy());
        assert!(saved_at > 0);
        assert!(load(&path, "other").unwrap_err().contains("tenant"));
        assert!(load(&dir.path().join("missing.json"), "default").unwrap().is_none());
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_private_durable_and_leaves_no_temporary_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = private_dir();
        let path = dir.path().join("new").join("t.json");
        for n in 0..3 {
            save(&path, "default", &table(&[instance("a-1", 40 + n)])).unwrap();
        }
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["t.json"], "only the table itself remains");

        // A directory others can write to is refused, for saving and for loading.
        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = save(&shared.path().join("t.json"), "default", &table(&[])).unwrap_err();
        assert!(err.to_string().contains("writable by others"), "{err}");
        std::fs::copy(&path, shared.path().join("t.json")).unwrap();
        let err = load(&shared.path().join("t.json"), "default").unwrap_err();
        assert!(err.contains("writable by others"), "{err}");
        // So is a file others can write to.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(load(&path, "default").unwrap_err().contains("writable by others"));
    }

    #[test]
    fn corrupt_or_invalid_files_are_refused_with_the_reason() {
        let dir = private_dir();
        let path = dir.path().join("t.json");
        let write = |saved: &SavedTable| std::fs::write(&path, serde_json::to_vec(saved).unwrap()).unwrap();
        let good = || SavedTable {
            format: FORMAT,
            tenant: "default".into(),
            revision: 42,
            saved_at_ms: 1,
            instances: vec![SavedInstance { record: instance("a-1", 41).record, revision: 41 }],
            policies: vec![policy()],
        };
        write(&good());
        assert!(load(&path, "default").unwrap().is_some());

        std::fs::write(&path, b"{\"format\": 1, \"tenant\": \"default\", \"revis").unwrap();
        assert!(load(&path, "default").unwrap_err().contains("EOF"));

        type Spoil = Box<dyn Fn(&mut SavedTable)>;
        let cases: Vec<(Spoil, &str)> = vec![
            (Box::new(|t| t.instances[0].record.tenant = "other".into()), "of tenant \"other\""),
            (Box::new(|t| t.instances[0].record.instance_id = "a 1".into()), "instance_id"),
            (Box::new(|t| t.instances[0].record.registration.endpoint = String::new()), "registration.endpoint"),
            (Box::new(|t| t.instances[0].record.registration.capabilities.clear()), "registration.capabilities"),
            (Box::new(|t| t.instances[0].record.sidecar_address = "nowhere".into()), "not host:port"),
            (Box::new(|t| t.instances[0].record.sidecar_id = String::new()), "sidecar_id"),
            (Box::new(|t| t.instances[0].revision = 43), "revision 43 outside 1..=42"),
            (
                Box::new(|t| {
                    let again = SavedInstance { record: t.instances[0].record.clone(), revision: 1 };
                    t.instances.push(again)
                }),
                "listed twice",
            ),
            (Box::new(|t| t.policies[0].tenant = "other".into()), "policies[0]"),
            (Box::new(|t| t.policies[0].name = String::new()), "policies[0]"),
            (Box::new(|t| t.policies.push(policy())), "listed twice"),
        ];
        for (spoil, why) in cases {
            let mut t = good();
            spoil(&mut t);
            write(&t);
            let err = load(&path, "default").unwrap_err();
            assert!(err.contains(why) && err.contains("t.json"), "expected {why:?} in {err:?}");
        }
    }

    #[test]
    fn the_first_snapshot_replaces_a_loaded_table_and_no_delta_applies_on_it() {
        let dir = private_dir();
        let path = dir.path().join("t.json");
        save(&path, "default", &table(&[instance("planted-1", 41), instance("real-1", 40)])).unwrap();
        let handle = TableHandle::default();
        handle.store(load(&path, "default").unwrap().unwrap().0);
        let stats = WatchStats::default();
        let target = Target::capability("c");
        let delta = |revision, prev_revision| proto::WatchEvent {
            event: Some(proto::watch_event::Event::Delta(proto::Delta {
                revision,
                prev_revision,
                removed_instance_ids: vec!["real-1".into()],
                ..Default::default()
            })),
        };
        // A delta that follows the file's revision does not apply: the table is at 0.
        assert!(matches!(apply(&handle, delta(43, 42), &stats), Some(Applied::Refused { gap: true, .. })));
        assert_eq!(handle.load().len(), 2);
        // Control's snapshot (its own revision, only the real instance) replaces it whole.
        let snapshot = proto::WatchEvent {
            event: Some(proto::watch_event::Event::Snapshot(proto::Snapshot {
                revision: 7,
                instances: vec![proto::Instance::from(&instance("real-1", 5))],
                ..Default::default()
            })),
        };
        assert!(matches!(apply(&handle, snapshot, &stats), Some(Applied::Snapshot { revision: 7, .. })));
        let now = handle.load_full();
        assert_eq!(now.revision, 7);
        assert!(!now.instances.contains_key("planted-1"));
        for _ in 0..50 {
            let (m, _) = agent_reach_routing::pick(&now, &agent_reach_routing::PickRequest::new(&target, 0)).unwrap();
            assert_eq!(m.id(), "real-1");
        }
    }
}
