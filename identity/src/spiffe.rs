//! SPIFFE ids of the mesh. A sidecar is
//! `spiffe://<trust-domain>/tenant/<tenant>/sidecar/<sidecar-id>`, the control service is
//! `spiffe://<trust-domain>/control`. Parsing is strict: exactly these shapes, DNS-label
//! tenants, sidecar ids of letters, digits, `-`, `_` and `.`; anything else is refused, so
//! an id always parses back into exactly the names it was built from.

use std::fmt;

use crate::IdentityError;

/// A sidecar's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadId {
    pub trust_domain: String,
    pub tenant: String,
    pub sidecar: String,
}

/// Who is at the other end of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerId {
    Sidecar(WorkloadId),
    Control { trust_domain: String },
}

impl WorkloadId {
    pub fn new(trust_domain: impl Into<String>, tenant: impl Into<String>, sidecar: impl Into<String>) -> Self {
        WorkloadId { trust_domain: trust_domain.into(), tenant: tenant.into(), sidecar: sidecar.into() }
    }

    /// The SPIFFE URI.
    pub fn uri(&self) -> String {
        format!("spiffe://{}/tenant/{}/sidecar/{}", self.trust_domain, self.tenant, self.sidecar)
    }

    /// Checks every part, as [`PeerId::parse`] would.
    pub fn validate(&self) -> Result<(), IdentityError> {
        match PeerId::parse(&self.uri())? {
            PeerId::Sidecar(id) if id == *self => Ok(()),
            _ => Err(IdentityError::InvalidId(self.uri(), "does not parse back into itself".into())),
        }
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

/// The control service's SPIFFE URI in `trust_domain`.
pub fn control_uri(trust_domain: &str) -> String {
    format!("spiffe://{trust_domain}/control")
}

impl PeerId {
    /// Parses a SPIFFE URI of the mesh.
    pub fn parse(uri: &str) -> Result<PeerId, IdentityError> {
        let bad = |why: &str| IdentityError::InvalidId(uri.to_string(), why.to_string());
        let rest = uri.strip_prefix("spiffe://").ok_or_else(|| bad("not a spiffe:// URI"))?;
        let (domain, path) = rest.split_once('/').ok_or_else(|| bad("no path"))?;
        if !is_dns_name(domain) {
            return Err(bad("bad trust domain"));
        }
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["control"] => Ok(PeerId::Control { trust_domain: domain.to_string() }),
            ["tenant", tenant, "sidecar", sidecar] => {
                if !is_dns_label(tenant) {
                    return Err(bad("bad tenant"));
                }
                if !is_sidecar_id(sidecar) {
                    return Err(bad("bad sidecar id"));
                }
                Ok(PeerId::Sidecar(WorkloadId::new(domain, *tenant, *sidecar)))
            }
            _ => Err(bad("neither /control nor /tenant/<tenant>/sidecar/<id>")),
        }
    }

    pub fn trust_domain(&self) -> &str {
        match self {
            PeerId::Sidecar(id) => &id.trust_domain,
            PeerId::Control { trust_domain } => trust_domain,
        }
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerId::Sidecar(id) => id.fmt(f),
            PeerId::Control { trust_domain } => f.write_str(&control_uri(trust_domain)),
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_sidecar_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s != "."
        && s != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_bad_ones_are_refused() {
        let id = WorkloadId::new("mesh.example", "team-a", "host-1.abc");
        assert_eq!(id.uri(), "spiffe://mesh.example/tenant/team-a/sidecar/host-1.abc");
        assert_eq!(PeerId::parse(&id.uri()).unwrap(), PeerId::Sidecar(id.clone()));
        assert!(id.validate().is_ok());
        assert_eq!(
            PeerId::parse("spiffe://mesh.example/control").unwrap(),
            PeerId::Control { trust_domain: "mesh.example".into() }
        );
        for bad in [
            "https://mesh.example/control",
            "spiffe://mesh.example",
            "spiffe://mesh.example/tenant/Team/sidecar/x",
            "spiffe://mesh.example/tenant/a/sidecar/x/y",
            "spiffe://mesh.example/tenant/a/sidecar/..",
            "spiffe://mesh.example/tenant/a%2Fb/sidecar/x",
            "spiffe://mesh.example/tenant//sidecar/x",
            "spiffe://MESH/control",
        ] {
            assert!(PeerId::parse(bad).is_err(), "{bad} parsed");
        }
    }
}
