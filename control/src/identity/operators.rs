//! Who may use the Admin API: bearer tokens with a role — `viewer` (reads), `operator`
//! (reads and changes: holds, policies, tenants, join tokens) or `admin` (everything,
//! including operators' tokens) — scoped to some tenants or to the whole cluster.
//!
//! A bootstrap admin token (cluster-wide) comes from a file (`--admin-token-file`); more
//! tokens are created through Admin and stored under `/agent-reach/v1/admin-tokens/<id>`
//! as SHA-256 hashes, with expiry and revocation. A token is `arat.<id>.<secret>`, sent as
//! `authorization: Bearer <token>`. No token: UNAUTHENTICATED; a role or tenant the token
//! does not allow: PERMISSION_DENIED (`ROLE_NOT_ALLOWED`, `TENANT_NOT_ALLOWED`). Every
//! change is written as a structured audit log line (target `audit`: who, what, tenant,
//! result).
//!
//! [`OperatorAuth::principal`] and [`Principal::authorize`] are the whole interface: other
//! front ends (a dashboard) use them the same way.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agent_reach_store::{Compare, Op, Store, Txn};
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::ControlError;
use crate::identity::tokens::{constant_time_eq, hex, random, sha256_hex, unix_ms};

/// Store prefix of operators' tokens.
pub const PREFIX: &str = "/agent-reach/v1/admin-tokens/";
const TOKEN_PREFIX: &str = "arat";
/// Longest lifetime of an operator token (0 at creation = this).
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a token may do, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Reads (viewer and up).
    Read,
    /// Changes: holds, policies, tenants, join tokens (operator and up).
    Change,
    /// Operators' tokens (admin only).
    ManageTokens,
}

/// Who is calling, and where they may act.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// "bootstrap", "token:<id>", or "anonymous" when authentication is off.
    pub name: String,
    pub role: Role,
    /// Tenants the principal may act on; empty = the whole cluster.
    pub tenants: Vec<String>,
}

impl Principal {
    /// Whether the principal may do `action` on `tenant` (`None`: cluster-wide, such as
    /// listing tenants or managing operators' tokens, which need a cluster scope).
    pub fn authorize(&self, action: Action, tenant: Option<&str>) -> Result<(), ControlError> {
        let needed = match action {
            Action::Read => Role::Viewer,
            Action::Change => Role::Operator,
            Action::ManageTokens => Role::Admin,
        };
        if self.role < needed {
            return Err(ControlError::RoleNotAllowed {
                who: self.name.clone(),
                role: self.role.as_str(),
                needed: needed.as_str(),
            });
        }
        if self.tenants.is_empty() {
            return Ok(());
        }
        match tenant {
            Some(t) if self.tenants.iter().any(|s| s == t) => Ok(()),
            _ => Err(ControlError::TenantNotAllowed {
                who: self.name.clone(),
                tenant: tenant.unwrap_or("(cluster)").to_string(),
            }),
        }
    }
}

/// An operator's token as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorToken {
    pub id: String,
    pub secret_sha256: String,
    pub role: Role,
    #[serde(default)]
    pub tenants: Vec<String>,
    pub created_ms: u64,
    pub expires_ms: u64,
    #[serde(default)]
    pub revoked_ms: Option<u64>,
    #[serde(default)]
    pub description: String,
}

/// Authentication of Admin calls.
pub struct OperatorAuth {
    store: Arc<dyn Store>,
    /// SHA-256 of the bootstrap token; `None` with `required` false means auth is off.
    bootstrap_sha256: Option<String>,
    required: bool,
}

impl OperatorAuth {
    /// Authentication with a bootstrap admin token (required from then on).
    pub fn new(store: Arc<dyn Store>, bootstrap_token: &str) -> OperatorAuth {
        OperatorAuth { store, bootstrap_sha256: Some(sha256_hex(bootstrap_token.trim().as_bytes())), required: true }
    }

    /// No authentication: every caller is a cluster admin (logged loudly at start).
    pub fn off(store: Arc<dyn Store>) -> OperatorAuth {
        OperatorAuth { store, bootstrap_sha256: None, required: false }
    }

    pub fn required(&self) -> bool {
        self.required
    }

    /// The principal of an `authorization` header value (`Bearer <token>`).
    pub async fn principal(&self, authorization: Option<&str>) -> Result<Principal, ControlError> {
        if !self.required {
            return Ok(Principal { name: "anonymous".into(), role: Role::Admin, tenants: vec![] });
        }
        let Some(token) = authorization.and_then(|h| h.strip_prefix("Bearer ")).map(str::trim) else {
            return Err(ControlError::Unauthenticated("an operator token is required (authorization: Bearer)".into()));
        };
        if let Some(hash) = &self.bootstrap_sha256
            && constant_time_eq(sha256_hex(token.as_bytes()).as_bytes(), hash.as_bytes())
        {
            return Ok(Principal { name: "bootstrap".into(), role: Role::Admin, tenants: vec![] });
        }
        let bad = || ControlError::Unauthenticated("unknown operator token".into());
        let mut parts = token.splitn(3, '.');
        let (Some(TOKEN_PREFIX), Some(id), Some(secret)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let key = format!("{PREFIX}{id}");
        let Some(kv) = self.store.get(&key).await? else { return Err(bad()) };
        let stored = decode(&key, &kv.value)?;
        if !constant_time_eq(sha256_hex(secret.as_bytes()).as_bytes(), stored.secret_sha256.as_bytes()) {
            return Err(bad());
        }
        if stored.revoked_ms.is_some() {
            return Err(ControlError::Unauthenticated(format!("operator token {id} has been revoked")));
        }
        if unix_ms(SystemTime::now()) >= stored.expires_ms {
            return Err(ControlError::Unauthenticated(format!("operator token {id} has expired")));
        }
        Ok(Principal { name: format!("token:{id}"), role: stored.role, tenants: stored.tenants })
    }

    /// Creates a token; returns it and its text (shown once).
    pub async fn create(
        &self,
        role: Role,
        tenants: Vec<String>,
        ttl: Duration,
        description: &str,
    ) -> Result<(OperatorToken, String), ControlError> {
        for (i, t) in tenants.iter().enumerate() {
            agent_reach::model::validate_tenant(&format!("tenants[{i}]"), t)?;
        }
        let ttl = if ttl.is_zero() { MAX_TTL } else { ttl.min(MAX_TTL) };
        let id = hex(&random::<6>());
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<32>());
        let now = unix_ms(SystemTime::now());
        let token = OperatorToken {
            id: id.clone(),
            secret_sha256: sha256_hex(secret.as_bytes()),
            role,
            tenants,
            created_ms: now,
            expires_ms: now + ttl.as_millis() as u64,
            revoked_ms: None,
            description: description.to_string(),
        };
        let key = format!("{PREFIX}{id}");
        let txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), 0)],
            success: vec![Op::Put { key, value: encode(&token), lease: None }],
            failure: vec![],
        };
        if !self.store.txn(txn).await?.succeeded {
            return Err(ControlError::Conflict(format!("operator token id {id}")));
        }
        Ok((token, format!("{TOKEN_PREFIX}.{id}.{secret}")))
    }

    pub async fn list(&self) -> Result<Vec<OperatorToken>, ControlError> {
        let range = self.store.get_prefix(PREFIX).await?;
        range.kvs.iter().map(|kv| decode(&kv.key, &kv.value)).collect()
    }

    pub async fn revoke(&self, id: &str) -> Result<OperatorToken, ControlError> {
        let key = format!("{PREFIX}{id}");
        let not_found = || ControlError::Invalid(agent_reach::model::FieldError::new("id", "no such operator token"));
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_found());
        }
        let Some(kv) = self.store.get(&key).await? else { return Err(not_found()) };
        let mut token = decode(&key, &kv.value)?;
        if token.revoked_ms.is_none() {
            token.revoked_ms = Some(unix_ms(SystemTime::now()));
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.clone(), kv.mod_revision)],
                success: vec![Op::Put { key: key.clone(), value: encode(&token), lease: None }],
                failure: vec![],
            };
            if !self.store.txn(txn).await?.succeeded {
                return Err(ControlError::Conflict(format!("operator token {id}")));
            }
        }
        Ok(token)
    }
}

/// Writes the audit line of a change.
pub fn audit<T, E: std::fmt::Display>(who: &Principal, what: &str, tenant: &str, result: &Result<T, E>) {
    match result {
        Ok(_) => tracing::info!(
            target: "audit", who = %who.name, role = who.role.as_str(), what, tenant, result = "ok", "admin change"
        ),
        Err(e) => tracing::info!(
            target: "audit", who = %who.name, role = who.role.as_str(), what, tenant, result = %e, "admin change refused"
        ),
    }
}

fn encode(token: &OperatorToken) -> bytes::Bytes {
    // Strings, numbers, an enum and options always serialize.
    bytes::Bytes::from(serde_json::to_vec(token).unwrap_or_default())
}

fn decode(key: &str, value: &[u8]) -> Result<OperatorToken, ControlError> {
    serde_json::from_slice(value).map_err(|e| ControlError::Corrupt { key: key.to_string(), why: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach_store::EmbeddedStore;

    #[tokio::test]
    async fn tokens_carry_roles_and_tenants() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let auth = OperatorAuth::new(store.clone(), "boot-secret");
        assert!(matches!(auth.principal(None).await, Err(ControlError::Unauthenticated(_))));
        let boot = auth.principal(Some("Bearer boot-secret")).await.unwrap();
        assert_eq!((boot.role, boot.tenants.len()), (Role::Admin, 0));
        let (_, viewer) = auth.create(Role::Viewer, vec![], Duration::ZERO, "").await.unwrap();
        let (op, operator_a) = auth.create(Role::Operator, vec!["a".into()], Duration::ZERO, "").await.unwrap();
        let viewer = auth.principal(Some(&format!("Bearer {viewer}"))).await.unwrap();
        assert!(viewer.authorize(Action::Read, Some("b")).is_ok());
        assert!(matches!(viewer.authorize(Action::Change, Some("b")), Err(ControlError::RoleNotAllowed { .. })));
        let operator = auth.principal(Some(&format!("Bearer {operator_a}"))).await.unwrap();
        assert!(operator.authorize(Action::Change, Some("a")).is_ok());
        assert!(matches!(operator.authorize(Action::Change, Some("b")), Err(ControlError::TenantNotAllowed { .. })));
        assert!(matches!(operator.authorize(Action::Read, None), Err(ControlError::TenantNotAllowed { .. })));
        assert!(matches!(operator.authorize(Action::ManageTokens, None), Err(ControlError::RoleNotAllowed { .. })));
        auth.revoke(&op.id).await.unwrap();
        assert!(matches!(
            auth.principal(Some(&format!("Bearer {operator_a}"))).await,
            Err(ControlError::Unauthenticated(m)) if m.contains("revoked")
        ));
        assert!(!String::from_utf8_lossy(&store.get_prefix(PREFIX).await.unwrap().kvs[0].value).contains("arat."));
        let off = OperatorAuth::off(store);
        assert_eq!(off.principal(None).await.unwrap().role, Role::Admin);
    }
}
