//! The routing-state stream a sidecar watches: one snapshot of its tenant's instances and
//! policies at revision R, then one delta per later revision, in order, with no gaps.
//!
//! A sidecar that reconnects with its last revision gets only the deltas after it. If the
//! store has compacted that history, or the revision is ahead of the store (the store was
//! replaced), it gets a fresh snapshot flagged `resync` instead of a silent gap. The stream
//! ends with UNAVAILABLE when the store fails, and ends when the service shuts down.

use agent_reach::convert::policy_to_proto;
use agent_reach::model::Instance;
use agent_reach::proto;
use agent_reach_store::{EventKind, Revision, StoreError, WatchStream};
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::keys;
use crate::registry::{Registry, decode, decode_policy};

/// Runs one sidecar's watch, sending events into `tx` until the receiver goes away,
/// `shutdown` turns true, or the store fails.
pub async fn run(
    registry: Registry,
    tenant: String,
    from_revision: Revision,
    tx: mpsc::Sender<Result<proto::WatchEvent, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::select! {
        _ = agent_reach::process::stopped(&mut shutdown) => {}
        r = stream(&registry, &tenant, from_revision, &tx) => {
            if let Err(status) = r {
                let _ = tx.send(Err(status)).await;
            }
        }
    }
}

async fn stream(
    registry: &Registry,
    tenant: &str,
    from_revision: Revision,
    tx: &mpsc::Sender<Result<proto::WatchEvent, Status>>,
) -> Result<(), Status> {
    let store = registry.store();
    let prefix = keys::tenant_prefix(tenant);
    let agents = keys::agents_prefix(tenant);
    let policies = keys::policies_prefix(tenant);
    let head = store.current_revision().await.map_err(store_status)?;
    // Resume when the sidecar's revision is still in the store's history.
    let mut resync = false;
    let mut watch = None;
    if from_revision > 0 && from_revision <= head {
        match store.watch_prefix(&prefix, from_revision + 1).await {
            Ok(w) => watch = Some(w),
            Err(StoreError::Compacted { .. }) => resync = true,
            Err(e) => return Err(store_status(e)),
        }
    } else if from_revision > head {
        resync = true;
    }
    let mut watch: WatchStream = match watch {
        Some(w) => w,
        None => send_snapshot(registry, tenant, &prefix, resync, tx).await?,
    };
    loop {
        let Some(batch) = watch.next().await else {
            return Err(Status::unavailable("store watch ended"));
        };
        let batch = match batch {
            Ok(b) => b,
            Err(StoreError::Compacted { .. }) => {
                // Fell behind the store's history: start over from a snapshot.
                watch = send_snapshot(registry, tenant, &prefix, true, tx).await?;
                continue;
            }
            Err(e) => return Err(store_status(e)),
        };
        // One delta per revision, in order.
        let mut delta: Option<proto::Delta> = None;
        for event in batch.events {
            let rev = event.kv.mod_revision;
            if delta.as_ref().is_some_and(|d| d.revision != rev) {
                send(tx, proto::watch_event::Event::Delta(delta.take().unwrap_or_default())).await?;
            }
            let d = delta.get_or_insert_with(|| proto::Delta { revision: rev, ..Default::default() });
            let key = event.kv.key.as_str();
            match event.kind {
                EventKind::Put if key.starts_with(&agents) => match decode(&event.kv) {
                    Ok(record) => d.upserted.push(proto::Instance::from(&Instance { record, revision: rev })),
                    Err(e) => tracing::warn!("skipping {e}"),
                },
                EventKind::Put if key.starts_with(&policies) => match decode_policy(&event.kv) {
                    Ok(policy) => d.upserted_policies.push(policy_to_proto(&policy, rev)),
                    Err(e) => tracing::warn!("skipping {e}"),
                },
                EventKind::Delete => {
                    if let Some((_, instance)) = keys::parse_instance_key(&agents, key) {
                        d.removed_instance_ids.push(instance.to_string());
                    } else if let Some((kind, name)) = keys::parse_policy_key(&policies, key) {
                        d.removed_policies.push(proto::PolicyRef { kind: proto::PolicyKind::from(kind) as i32, name });
                    }
                }
                EventKind::Put => {}
            }
        }
        if let Some(d) = delta {
            send(tx, proto::watch_event::Event::Delta(d)).await?;
        }
    }
}

/// Sends a snapshot and returns the watch that continues right after it.
async fn send_snapshot(
    registry: &Registry,
    tenant: &str,
    prefix: &str,
    resync: bool,
    tx: &mpsc::Sender<Result<proto::WatchEvent, Status>>,
) -> Result<WatchStream, Status> {
    let state = registry.tenant_state(tenant).await.map_err(|e| Status::unavailable(e.to_string()))?;
    let watch = registry.store().watch_prefix(prefix, state.revision + 1).await.map_err(store_status)?;
    let snapshot = proto::Snapshot {
        revision: state.revision,
        instances: state.instances.iter().map(proto::Instance::from).collect(),
        resync,
        policies: state.policies.iter().map(|(p, rev)| policy_to_proto(p, *rev)).collect(),
    };
    send(tx, proto::watch_event::Event::Snapshot(snapshot)).await?;
    Ok(watch)
}

async fn send(
    tx: &mpsc::Sender<Result<proto::WatchEvent, Status>>,
    event: proto::watch_event::Event,
) -> Result<(), Status> {
    tx.send(Ok(proto::WatchEvent { event: Some(event) })).await.map_err(|_| Status::cancelled("watcher went away"))
}

fn store_status(e: StoreError) -> Status {
    agent_reach::reason::status(agent_reach::reason::Reason::StoreUnavailable, e.to_string(), &[])
}
