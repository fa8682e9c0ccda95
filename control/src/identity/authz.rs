//! Who may make a Control call: the tenant and sidecar id of every Control request come
//! from the caller's certificate, and a request naming another tenant or sidecar is
//! refused (PERMISSION_DENIED, `TENANT_MISMATCH` or `SIDECAR_MISMATCH`, naming the field).
//! A sidecar deregisters only instances it registered, and revokes only their lease
//! (`INSTANCE_NOT_OWNED`).
//!
//! A sidecar's lease is its own too: when control grants a lease to a sidecar with a
//! certificate, it records the owner under `/agent-reach/v1/lease-owners/<lease>` (on the
//! lease itself, so the record goes with it), and a Register or Heartbeat naming a lease
//! of another sidecar is refused with `INSTANCE_NOT_OWNED` ([`LeaseOwners`]). A lease with
//! no owner on record (granted while mTLS was off) is not checked.
//!
//! [`Mtls`] says how strict the port is: `Required` (the default wherever TLS is on) wants
//! a sidecar certificate on every Control call; `Permissive` (migration only) lets calls
//! without one through as anonymous and counts them; `Off` serves plaintext and checks
//! nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent_reach_identity::{PeerId, WorkloadId};
use agent_reach_store::{LeaseId, Store};

use crate::error::ControlError;
use crate::stats::ControlStats;
use crate::{keys, record};

/// How the control port treats clients without a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mtls {
    /// Plaintext, nothing checked.
    Off,
    /// TLS; Control calls without a sidecar certificate pass as anonymous (counted).
    Permissive,
    /// TLS; every Control call needs a sidecar certificate.
    Required,
}

impl Mtls {
    pub fn parse(s: &str) -> Option<Mtls> {
        match s {
            "off" => Some(Mtls::Off),
            "permissive" => Some(Mtls::Permissive),
            "required" | "strict" => Some(Mtls::Required),
            _ => None,
        }
    }
}

/// Checks Control calls against their callers' certificates.
pub struct Authorizer {
    pub mode: Mtls,
    stats: Arc<ControlStats>,
}

impl Authorizer {
    /// Counts anonymous calls into `stats`.
    pub fn new(mode: Mtls, stats: Arc<ControlStats>) -> Authorizer {
        Authorizer { mode, stats }
    }

    /// The calling sidecar, after checking it against the `tenant` (and `sidecar_id`, when
    /// the request names one) of its request. `None`: mTLS is off, or an anonymous call in
    /// permissive mode.
    pub fn sidecar(
        &self,
        peer: Option<PeerId>,
        tenant: &str,
        sidecar_id: Option<&str>,
    ) -> Result<Option<WorkloadId>, ControlError> {
        if self.mode == Mtls::Off {
            return Ok(None);
        }
        match peer {
            Some(PeerId::Sidecar(id)) => {
                if id.tenant != tenant {
                    return Err(ControlError::TenantMismatch {
                        field: "tenant".into(),
                        claimed: tenant.to_string(),
                        verified: id.tenant,
                    });
                }
                if let Some(claimed) = sidecar_id.filter(|s| *s != id.sidecar) {
                    return Err(ControlError::SidecarMismatch { claimed: claimed.to_string(), verified: id.sidecar });
                }
                Ok(Some(id))
            }
            Some(PeerId::Control { .. }) => {
                Err(ControlError::Unauthenticated("a control certificate cannot act for a sidecar".into()))
            }
            None if self.mode == Mtls::Permissive => {
                self.stats.anonymous_calls.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            None => Err(ControlError::Unauthenticated(
                "a sidecar certificate is required (mutual TLS); get one with Identity.IssueCertificate".into(),
            )),
        }
    }
}

/// Store prefix of lease owners.
pub const LEASE_OWNERS: &str = "/agent-reach/v1/lease-owners/";
/// Owners remembered per replica at most (then forgotten and read again).
const KNOWN_LEASES: usize = 65_536;

/// Which sidecar each lease was granted to.
pub struct LeaseOwners {
    store: Arc<dyn Store>,
    /// Owners already read or written by this replica (a lease never changes owner).
    known: std::sync::Mutex<std::collections::HashMap<LeaseId, String>>,
}

impl LeaseOwners {
    pub fn new(store: Arc<dyn Store>) -> LeaseOwners {
        LeaseOwners { store, known: Default::default() }
    }

    /// Records that `lease` was granted to `owner`.
    pub async fn record(&self, lease: LeaseId, owner: &WorkloadId) -> Result<(), ControlError> {
        let uri = owner.uri();
        self.store.put(&format!("{LEASE_OWNERS}{lease:x}"), bytes::Bytes::from(uri.clone()), Some(lease)).await?;
        self.remember(lease, uri);
        Ok(())
    }

    /// Refuses `lease` unless it is `owner`'s (or has no owner on record, or is 0).
    pub async fn check(&self, lease: LeaseId, owner: &WorkloadId) -> Result<(), ControlError> {
        if lease == 0 {
            return Ok(());
        }
        let uri = owner.uri();
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(&lease).cloned();
        let recorded = match known {
            Some(k) => Some(k),
            None => self
                .store
                .get(&format!("{LEASE_OWNERS}{lease:x}"))
                .await?
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
        };
        match recorded {
            None => Ok(()),
            Some(r) if r == uri => {
                self.remember(lease, r);
                Ok(())
            }
            Some(r) => Err(ControlError::LeaseNotOwned { lease, owner: r }),
        }
    }

    fn remember(&self, lease: LeaseId, uri: String) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() >= KNOWN_LEASES {
            known.clear();
        }
        known.insert(lease, uri);
    }
}

/// Checks that `owner` registered the instance it asks to deregister, and that the lease
/// it asks to revoke (if any) is that instance's. Returns the lease the delete must still
/// find the record on (so a registration made meanwhile elsewhere is left alone).
pub async fn check_owner(
    store: &Arc<dyn Store>,
    owner: &WorkloadId,
    agent: &str,
    instance_id: &str,
    revoke_lease: LeaseId,
    expected_lease: LeaseId,
) -> Result<LeaseId, ControlError> {
    agent_reach::model::validate_name("agent", agent)?;
    agent_reach::model::validate_name("instance_id", instance_id)?;
    let key = keys::instance_key(&owner.tenant, agent, instance_id);
    let Some(kv) = store.get(&key).await? else {
        if revoke_lease != 0 {
            return Err(ControlError::NotOwned {
                instance: instance_id.to_string(),
                why: "no such instance to attribute the lease to".into(),
            });
        }
        return Ok(expected_lease);
    };
    let stored = record::decode_instance(&kv, &owner.tenant, agent, instance_id)?;
    if stored.record.sidecar_id != owner.sidecar {
        return Err(ControlError::NotOwned {
            instance: instance_id.to_string(),
            why: format!("registered by sidecar {:?}", stored.record.sidecar_id),
        });
    }
    if revoke_lease != 0 && revoke_lease != kv.lease {
        return Err(ControlError::NotOwned {
            instance: instance_id.to_string(),
            why: format!("lease {revoke_lease:x} is not the instance's"),
        });
    }
    Ok(if expected_lease == 0 { kv.lease } else { expected_lease })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar(tenant: &str, id: &str) -> Option<PeerId> {
        Some(PeerId::Sidecar(WorkloadId::new("td", tenant, id)))
    }

    #[test]
    fn the_certificate_decides_tenant_and_sidecar() {
        let stats = Arc::new(ControlStats::default());
        let required = Authorizer::new(Mtls::Required, stats.clone());
        assert_eq!(required.sidecar(sidecar("a", "s1"), "a", Some("s1")).unwrap().unwrap().sidecar, "s1");
        assert!(matches!(
            required.sidecar(sidecar("a", "s1"), "b", Some("s1")),
            Err(ControlError::TenantMismatch { ref field, ref claimed, ref verified })
                if field == "tenant" && claimed == "b" && verified == "a"
        ));
        assert!(matches!(
            required.sidecar(sidecar("a", "s1"), "a", Some("s2")),
            Err(ControlError::SidecarMismatch { .. })
        ));
        assert!(matches!(required.sidecar(None, "a", None), Err(ControlError::Unauthenticated(_))));
        assert!(matches!(
            required.sidecar(Some(PeerId::Control { trust_domain: "td".into() }), "a", None),
            Err(ControlError::Unauthenticated(_))
        ));

        let permissive = Authorizer::new(Mtls::Permissive, stats.clone());
        assert_eq!(permissive.sidecar(None, "a", Some("s1")).unwrap(), None);
        assert_eq!(stats.anonymous_calls.load(Ordering::Relaxed), 1);
        // A certificate is still checked in permissive mode.
        assert!(permissive.sidecar(sidecar("a", "s1"), "b", None).is_err());

        let off = Authorizer::new(Mtls::Off, stats);
        assert_eq!(off.sidecar(sidecar("a", "s1"), "b", None).unwrap(), None);
    }
}
