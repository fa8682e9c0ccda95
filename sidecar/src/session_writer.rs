//! Who writes a session: the writer of a local `PutSession` or `DeleteSession` is the
//! instance its agent credential (`ar-agent-credential`) proves, never a name in the
//! request.
//!
//! With a credential, the writer is verified: the request's `writer_instance` may be empty
//! or name that same instance (another is refused with PERMISSION_DENIED /
//! `CONTEXT_WRITER_MISMATCH`), and a credential that does not verify is refused with
//! UNAUTHENTICATED / `AGENT_CREDENTIAL_INVALID`, never downgraded. Without one, the writer
//! is the instance `writer_instance` names (it must be registered here) and is NOT
//! verified: control lets such a writer change only the fields no `session_writers` rule of
//! the tenant policy covers. In both cases the agent name comes from the instance's
//! registration. Control gets the writer and whether it is verified from this sidecar,
//! which it trusts as a mutual-TLS peer of the tenant (as the target's sidecar trusts the
//! caller it vouches for).

use agent_reach::reason::{self, Reason};
use tonic::Status;

use crate::registry::Registry;

/// The writer of a session write or delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SessionWriter {
    pub agent: String,
    pub instance: String,
    /// Proven by the agent credential.
    pub verified: bool,
}

/// The writer of a local session request with these `headers`, naming `named` as its
/// instance (may be empty when a credential is presented).
pub(crate) fn writer(registry: &Registry, headers: &http::HeaderMap, named: &str) -> Result<SessionWriter, Status> {
    let caller = crate::call::verify_credential(registry, headers).map_err(|e| e.into_status())?;
    if let Some(caller) = caller {
        if !named.is_empty() && named != &*caller.instance {
            return Err(reason::status(
                Reason::ContextWriterMismatch,
                format!(
                    "writer_instance {named:?} is not the instance the agent credential proves ({})",
                    caller.instance
                ),
                &[("writer_instance", named.to_string()), ("credential_instance", caller.instance.to_string())],
            ));
        }
        return Ok(SessionWriter {
            agent: caller.agent.to_string(),
            instance: caller.instance.to_string(),
            verified: true,
        });
    }
    if named.is_empty() {
        return Err(reason::invalid_argument(
            "writer_instance",
            "present the agent credential (ar-agent-credential) or name the instance (registered here) that writes",
        ));
    }
    let local = registry.get(named).ok_or_else(|| {
        reason::status(
            Reason::InstanceNotFound,
            format!("instance {named} is not registered at this sidecar"),
            &[("instance", named.to_string())],
        )
    })?;
    Ok(SessionWriter { agent: local.registration.agent.clone(), instance: local.instance_id.clone(), verified: false })
}
