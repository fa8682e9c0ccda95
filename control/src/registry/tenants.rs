//! Tenant records in the store: created or updated with a compare-and-swap that keeps the
//! creation time, and listed by name.

use agent_reach::model::{FieldError, MAX_DESCRIPTION_LEN, TenantRecord, validate_tenant};
use agent_reach_store::{Compare, Op, Revision, Txn};

use super::{CAS_ATTEMPTS, Registry, now_ms};
use crate::error::ControlError;
use crate::keys;
use crate::record::{self, encode};

impl Registry {
    /// Creates or updates a tenant's record (keeping its creation time).
    pub async fn put_tenant(&self, mut tenant: TenantRecord) -> Result<(TenantRecord, Revision), ControlError> {
        validate_tenant("tenant.name", &tenant.name)?;
        if tenant.description.len() > MAX_DESCRIPTION_LEN {
            return Err(
                FieldError::new("tenant.description", format!("longer than {MAX_DESCRIPTION_LEN} bytes")).into()
            );
        }
        let key = keys::tenant_record_key(&tenant.name);
        for _ in 0..CAS_ATTEMPTS {
            let existing = self.store.get(&key).await?;
            tenant.created_at_ms = match &existing {
                Some(kv) => record::decode_tenant(kv).map(|t| t.created_at_ms).unwrap_or_else(|_| now_ms()),
                None => now_ms(),
            };
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.clone(), existing.map_or(0, |kv| kv.mod_revision))],
                success: vec![Op::Put { key: key.clone(), value: encode(&tenant), lease: None }],
                failure: vec![],
            };
            let result = self.store.txn(txn).await?;
            if result.succeeded {
                return Ok((tenant, result.revision));
            }
        }
        Err(ControlError::Conflict(format!("tenant {}", tenant.name)))
    }

    /// Every tenant record, sorted by name.
    pub async fn list_tenants(&self) -> Result<Vec<(TenantRecord, Revision)>, ControlError> {
        let range = self.store.get_prefix(keys::TENANT_REGISTRY).await?;
        let mut out = Vec::with_capacity(range.kvs.len());
        for kv in &range.kvs {
            match record::decode_tenant(kv) {
                Ok(mut tenant) => {
                    // The key decides the name.
                    tenant.name = kv.key.strip_prefix(keys::TENANT_REGISTRY).unwrap_or(&tenant.name).to_string();
                    out.push((tenant, kv.mod_revision));
                }
                Err(e) => tracing::warn!("skipping {e}"),
            }
        }
        Ok(out)
    }
}
