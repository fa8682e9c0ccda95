//! Agent credentials: what proves, on the local API, which registered agent is calling.
//!
//! `Register` mints one per instance: `arac.<instance id>.<secret>`, the secret 32 random
//! bytes (base64url). The sidecar keeps only the SHA-256 of the secret, in the instance's
//! registry entry, so a credential is bound to this sidecar's tenant, to the agent and to
//! the instance, and dies with the registration (a new `Register` of the same id mints a
//! new one and the old stops working). An agent presents it as the request metadata
//! `ar-agent-credential`; `outbound::invoke` turns it into the caller the sidecar vouches for
//! toward the target's sidecar. Calls without it are anonymous; a credential that does not
//! verify is refused (UNAUTHENTICATED `AGENT_CREDENTIAL_INVALID`), never downgraded to
//! anonymous. This module does not decide who may call whom (see `inbound::authz`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The prefix of every agent credential.
const PREFIX: &str = "arac.";

/// The SHA-256 of a credential's secret.
pub(crate) type CredentialHash = [u8; 32];

/// A new credential for `instance_id`, and the hash to keep.
pub(crate) fn mint(instance_id: &str) -> (String, CredentialHash) {
    let secret = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let hash = hash(&secret);
    (format!("{PREFIX}{instance_id}.{secret}"), hash)
}

fn hash(secret: &str) -> CredentialHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The instance id a credential names and the hash of its secret (`None`: not of the
/// credential form). Whether that instance is registered here with that hash is the
/// caller's check (`outbound::invoke`), which turns it into the verified caller.
pub(crate) fn parse(token: &str) -> Option<(&str, CredentialHash)> {
    let (instance_id, secret) = token.strip_prefix(PREFIX).and_then(|rest| rest.rsplit_once('.'))?;
    Some((instance_id, hash(secret)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_unguessable_and_hash_only_their_secret() {
        let (a, ha) = mint("planner-1");
        let (b, hb) = mint("planner-1");
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        let secret = a.strip_prefix("arac.planner-1.").unwrap();
        assert_eq!(secret.len(), 43);
        assert_eq!(hash(secret), ha);
    }
}
