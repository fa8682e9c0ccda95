//! How `/metrics` reads the sizes of the maps the stacks bound: telemetry sits below the
//! stacks, so the sidecar hands it closures over the maps rather than their types.

use std::sync::Arc;

use crate::{inbound, outbound, pool, session, telemetry};

/// The maps that grow with input, each with its cap (README "Limits on input").
pub(crate) struct Maps<'a> {
    pub rate_limits: &'a Arc<outbound::ratelimit::RateLimits>,
    pub gates: &'a Arc<inbound::admission::Gates>,
    pub pools: Vec<Arc<pool::Pool>>,
    pub cache: &'a Arc<outbound::cache::ResultCache>,
    pub idempotency: &'a Arc<inbound::idempotency::Store>,
    pub owners: &'a Arc<outbound::owners::Owners>,
    pub sessions: &'a Arc<session::SessionCache>,
}

/// The closures reading each map's size (entries; bytes for the maps bounded in bytes).
pub(crate) fn sizes(m: Maps<'_>) -> telemetry::BoundedMaps {
    let (r, g, c, i, o) =
        (m.rate_limits.clone(), m.gates.clone(), m.cache.clone(), m.idempotency.clone(), m.owners.clone());
    let (cb, ib, pools, s) = (m.cache.clone(), m.idempotency.clone(), m.pools, m.sessions.clone());
    telemetry::BoundedMaps {
        entries: vec![
            ("rate_buckets", Box::new(move || r.pair_buckets())),
            ("admission_gates", Box::new(move || g.len())),
            ("pool_slots", Box::new(move || pools.iter().map(|p| p.slots()).sum())),
            ("result_cache", Box::new(move || c.len())),
            ("idempotency", Box::new(move || i.keys())),
            ("idempotency_owners", Box::new(move || o.len())),
            ("sessions_absent", Box::new(move || s.absent_sessions())),
        ],
        bytes: vec![
            ("result_cache", Box::new(move || cb.bytes())),
            ("idempotency", Box::new(move || ib.stored_bytes())),
        ],
    }
}
