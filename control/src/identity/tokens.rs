//! Join tokens: how a sidecar proves its right to a tenant before it has a certificate.
//!
//! A token is `arjt.<id>.<secret>`: the id names it (listed and revoked by id), the secret
//! (32 random bytes, base64url) proves it. The store keeps only the secret's SHA-256 under
//! `/agent-reach/v1/join-tokens/<id>` with the tenant it is bound to, its expiry, whether
//! it is single-use (and by which sidecar it was used) and when it was revoked. A
//! single-use token is marked used in a compare-and-swap transaction, so two sidecars
//! racing with one token cannot both win. A failed redemption writes nothing.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::model::{FieldError, MAX_DESCRIPTION_LEN, validate_tenant};
use agent_reach_store::{Compare, Op, Store, Txn};
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::{ControlError, TokenRefusal};

/// Store prefix of join tokens.
pub const PREFIX: &str = "/agent-reach/v1/join-tokens/";
/// Prefix of a token's text.
const TOKEN_PREFIX: &str = "arjt";
/// Lifetime of a token created without one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest lifetime of a token.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// A join token as stored (the secret only as a hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    pub id: String,
    pub tenant: String,
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub single_use: bool,
    #[serde(default)]
    pub used_by: Option<String>,
    #[serde(default)]
    pub revoked_ms: Option<u64>,
    #[serde(default)]
    pub description: String,
}

/// A new token: the record to store and the text to hand out once.
pub struct Created {
    pub token: JoinToken,
    pub secret: String,
}

/// Join tokens in the store.
pub struct JoinTokens {
    store: Arc<dyn Store>,
}

impl JoinTokens {
    pub fn new(store: Arc<dyn Store>) -> JoinTokens {
        JoinTokens { store }
    }

    /// Creates a token of `tenant` valid for `ttl` (0 = [`DEFAULT_TTL`]).
    pub async fn create(
        &self,
        tenant: &str,
        ttl: Duration,
        single_use: bool,
        description: &str,
    ) -> Result<Created, ControlError> {
        validate_tenant("tenant", tenant)?;
        let ttl = if ttl.is_zero() { DEFAULT_TTL } else { ttl };
        if ttl > MAX_TTL {
            return Err(FieldError::new("ttl_ms", format!("at most {} days", MAX_TTL.as_secs() / 86400)).into());
        }
        if description.len() > MAX_DESCRIPTION_LEN {
            return Err(FieldError::new("description", format!("longer than {MAX_DESCRIPTION_LEN} bytes")).into());
        }
        let id = hex(&random::<6>());
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<32>());
        let now = unix_ms(SystemTime::now());
        let token = JoinToken {
            id: id.clone(),
            tenant: tenant.to_string(),
            secret_sha256: sha256_hex(secret.as_bytes()),
            created_ms: now,
            expires_ms: now + ttl.as_millis() as u64,
            single_use,
            used_by: None,
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
            return Err(ControlError::Conflict(format!("join token id {id}")));
        }
        Ok(Created { secret: format!("{TOKEN_PREFIX}.{id}.{secret}"), token })
    }

    /// The tenant's tokens, by id.
    pub async fn list(&self, tenant: &str) -> Result<Vec<JoinToken>, ControlError> {
        validate_tenant("tenant", tenant)?;
        let range = self.store.get_prefix(PREFIX).await?;
        let mut out = Vec::new();
        for kv in range.kvs {
            let token = decode(&kv.key, &kv.value)?;
            if token.tenant == tenant {
                out.push(token);
            }
        }
        Ok(out)
    }

    /// Revokes a token of `tenant` (a token of another tenant is not found). Revoking a
    /// revoked token changes nothing.
    pub async fn revoke(&self, tenant: &str, id: &str) -> Result<JoinToken, ControlError> {
        validate_tenant("tenant", tenant)?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(FieldError::new("id", "not a join token id").into());
        }
        let key = format!("{PREFIX}{id}");
        for _ in 0..8 {
            let Some(kv) = self.store.get(&key).await? else {
                return Err(ControlError::JoinTokenNotFound(id.to_string()));
            };
            let mut token = decode(&key, &kv.value)?;
            if token.tenant != tenant {
                return Err(ControlError::JoinTokenNotFound(id.to_string()));
            }
            if token.revoked_ms.is_some() {
                return Ok(token);
            }
            token.revoked_ms = Some(unix_ms(SystemTime::now()));
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.clone(), kv.mod_revision)],
                success: vec![Op::Put { key: key.clone(), value: encode(&token), lease: None }],
                failure: vec![],
            };
            if self.store.txn(txn).await?.succeeded {
                return Ok(token);
            }
        }
        Err(ControlError::Conflict(format!("join token {id}")))
    }

    /// Checks `text` for a certificate of `sidecar` in `tenant`, and marks a single-use
    /// token used. Nothing is written unless the token is good.
    pub async fn redeem(
        &self,
        text: &str,
        tenant: &str,
        sidecar: &str,
    ) -> Result<Result<JoinToken, TokenRefusal>, ControlError> {
        let Some((id, secret)) = parse(text) else { return Ok(Err(TokenRefusal::Invalid)) };
        let key = format!("{PREFIX}{id}");
        let Some(kv) = self.store.get(&key).await? else { return Ok(Err(TokenRefusal::Invalid)) };
        let mut token = decode(&key, &kv.value)?;
        if !constant_time_eq(sha256_hex(secret.as_bytes()).as_bytes(), token.secret_sha256.as_bytes()) {
            return Ok(Err(TokenRefusal::Invalid));
        }
        if token.revoked_ms.is_some() {
            return Ok(Err(TokenRefusal::Revoked(token.id)));
        }
        if unix_ms(SystemTime::now()) >= token.expires_ms {
            return Ok(Err(TokenRefusal::Expired(token.id)));
        }
        if token.tenant != tenant {
            return Ok(Err(TokenRefusal::WrongTenant {
                id: token.id,
                token_tenant: token.tenant,
                requested: tenant.to_string(),
            }));
        }
        if !token.single_use {
            return Ok(Ok(token));
        }
        if let Some(by) = token.used_by {
            return Ok(Err(TokenRefusal::Used { id: token.id, by }));
        }
        token.used_by = Some(sidecar.to_string());
        let txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), kv.mod_revision)],
            success: vec![Op::Put { key: key.clone(), value: encode(&token), lease: None }],
            failure: vec![],
        };
        if self.store.txn(txn).await?.succeeded {
            return Ok(Ok(token));
        }
        // Someone changed the token meanwhile: used or revoked; say which.
        let now = self.store.get(&key).await?.map(|kv| decode(&key, &kv.value)).transpose()?;
        Ok(Err(match now {
            Some(t) if t.revoked_ms.is_some() => TokenRefusal::Revoked(t.id),
            Some(JoinToken { id, used_by: Some(by), .. }) => TokenRefusal::Used { id, by },
            _ => TokenRefusal::Invalid,
        }))
    }
}

/// The (id, secret) of a token's text.
fn parse(text: &str) -> Option<(&str, &str)> {
    let mut parts = text.trim().splitn(3, '.');
    let (prefix, id, secret) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = prefix == TOKEN_PREFIX
        && !id.is_empty()
        && id.len() <= 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && !secret.is_empty()
        && secret.len() <= 128;
    ok.then_some((id, secret))
}

fn encode(token: &JoinToken) -> bytes::Bytes {
    // A struct of strings, numbers and options always serializes.
    bytes::Bytes::from(serde_json::to_vec(token).unwrap_or_default())
}

fn decode(key: &str, value: &[u8]) -> Result<JoinToken, ControlError> {
    serde_json::from_slice(value).map_err(|e| ControlError::Corrupt { key: key.to_string(), why: e.to_string() })
}

/// Random bytes from `rand`'s thread generator (ChaCha, seeded by the OS).
pub(crate) fn random<const N: usize>() -> [u8; N] {
    std::array::from_fn(|_| rand::random())
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach_store::EmbeddedStore;

    #[tokio::test]
    async fn tokens_buy_certificates_until_revoked_used_or_expired() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let tokens = JoinTokens::new(store.clone());
        let reusable = tokens.create("team-a", Duration::ZERO, false, "ci").await.unwrap();
        // Only the hash is stored.
        let stored = store.get(&format!("{PREFIX}{}", reusable.token.id)).await.unwrap().unwrap();
        let secret = reusable.secret.rsplit('.').next().unwrap();
        assert!(!String::from_utf8_lossy(&stored.value).contains(secret));
        assert_eq!(reusable.token.expires_ms - reusable.token.created_ms, DEFAULT_TTL.as_millis() as u64);

        assert!(tokens.redeem(&reusable.secret, "team-a", "s1").await.unwrap().is_ok());
        assert!(tokens.redeem(&reusable.secret, "team-a", "s2").await.unwrap().is_ok());
        assert_eq!(
            tokens.redeem(&reusable.secret, "team-b", "s3").await.unwrap(),
            Err(TokenRefusal::WrongTenant {
                id: reusable.token.id.clone(),
                token_tenant: "team-a".into(),
                requested: "team-b".into()
            })
        );
        let wrong_secret = format!("arjt.{}.AAAA", reusable.token.id);
        assert_eq!(tokens.redeem(&wrong_secret, "team-a", "s1").await.unwrap(), Err(TokenRefusal::Invalid));
        assert_eq!(tokens.redeem("garbage", "team-a", "s1").await.unwrap(), Err(TokenRefusal::Invalid));

        let once = tokens.create("team-a", Duration::from_secs(60), true, "").await.unwrap();
        assert!(tokens.redeem(&once.secret, "team-a", "s1").await.unwrap().is_ok());
        assert_eq!(
            tokens.redeem(&once.secret, "team-a", "s2").await.unwrap(),
            Err(TokenRefusal::Used { id: once.token.id.clone(), by: "s1".into() })
        );

        // Revocation: of another tenant's token is not found; then refused with its reason.
        assert!(matches!(tokens.revoke("team-b", &reusable.token.id).await, Err(ControlError::JoinTokenNotFound(_))));
        let revoked = tokens.revoke("team-a", &reusable.token.id).await.unwrap();
        assert!(revoked.revoked_ms.is_some());
        let revision = store.current_revision().await.unwrap();
        assert_eq!(
            tokens.redeem(&reusable.secret, "team-a", "s1").await.unwrap(),
            Err(TokenRefusal::Revoked(reusable.token.id.clone()))
        );
        assert_eq!(store.current_revision().await.unwrap(), revision, "a refusal writes nothing");

        let listed = tokens.list("team-a").await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(tokens.list("team-b").await.unwrap().is_empty());
        assert!(matches!(tokens.create("team-a", MAX_TTL * 2, false, "").await, Err(ControlError::Invalid(_))));
    }

    #[tokio::test]
    async fn expired_tokens_are_refused() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let tokens = JoinTokens::new(store.clone());
        let created = tokens.create("team-a", Duration::from_secs(60), false, "").await.unwrap();
        let key = format!("{PREFIX}{}", created.token.id);
        let mut token = created.token.clone();
        token.expires_ms = unix_ms(SystemTime::now()) - 1;
        store.put(&key, encode(&token), None).await.unwrap();
        assert_eq!(
            tokens.redeem(&created.secret, "team-a", "s1").await.unwrap(),
            Err(TokenRefusal::Expired(created.token.id.clone()))
        );
    }
}
