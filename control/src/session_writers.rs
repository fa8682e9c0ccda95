//! Which agents may write which session context fields: the tenant policy's
//! `session_writers` rules, applied by the Sessions service to every write and delete.
//!
//! A field a rule covers (the exact name, else the longest matching prefix; see
//! `SessionWriters::deciding`) may only be written or deleted by a VERIFIED writer (its
//! sidecar checked the agent credential it presented and says so over mutual TLS) whose
//! agent the rule names, or whose instance offers a capability the rule names. Deleting a
//! whole session removes every field, so it needs a writer every rule allows. Anything else
//! is refused with PERMISSION_DENIED / `CONTEXT_WRITER_NOT_ALLOWED` (metadata `field`,
//! `rule`, `writer_agent`, `writer_instance`, `verified`) before the store is touched, so a
//! refused write changes nothing. Fields no rule covers stay open to every agent of the
//! tenant. Rules are read from the tenant's feed (memory): no store read per write.

use agent_reach::convert::session_writers_from_proto;
use agent_reach::policy::{PolicyKind, SessionWriters};
use agent_reach::reason::{self, Reason};
use agent_reach_session::Writer;
use tonic::Status;

use crate::feed::Feed;

/// What a write or delete changes.
pub enum Touched<'a> {
    /// These fields.
    Fields(&'a [&'a str]),
    /// The whole session (a delete naming no field).
    Session,
}

/// The tenant policy's rules (none when it has none).
pub fn rules(feed: &Feed) -> Vec<SessionWriters> {
    feed.with_policy(PolicyKind::Tenant, "default", |p| {
        p.and_then(|p| p.spec.as_ref())
            .map(|s| s.session_writers.iter().cloned().map(session_writers_from_proto).collect())
            .unwrap_or_default()
    })
}

/// Whether `writer` (verified or not; an empty agent is an unknown writer) may change
/// `touched`, under `rules`.
pub fn check(
    rules: &[SessionWriters],
    writer: &Writer,
    verified: bool,
    capabilities: &[String],
    touched: Touched<'_>,
) -> Result<(), Status> {
    if rules.is_empty() {
        return Ok(());
    }
    let allowed =
        |rule: &SessionWriters| verified && !writer.agent.is_empty() && rule.allows(&writer.agent, capabilities);
    let refused = match touched {
        Touched::Fields(fields) => fields.iter().find_map(|field| {
            SessionWriters::deciding(rules, field).filter(|rule| !allowed(rule)).map(|rule| (field.to_string(), rule))
        }),
        Touched::Session => rules.iter().find(|rule| !allowed(rule)).map(|rule| ("*".to_string(), rule)),
    };
    let Some((field, rule)) = refused else { return Ok(()) };
    let mut names: Vec<String> = rule.agents.iter().map(|a| format!("agent {a}")).collect();
    names.extend(rule.capabilities.iter().map(|c| format!("instances of {c}")));
    let who = if writer.agent.is_empty() { "an unnamed writer".to_string() } else { writer.to_string() };
    let why = if verified {
        format!("{who} is not one of them")
    } else {
        format!("{who} is not verified (present the agent credential Register returned)")
    };
    let target = if field == "*" { "the whole session".to_string() } else { format!("field {field:?}") };
    Err(reason::status(
        Reason::ContextWriterNotAllowed,
        format!(
            "{target} may only be changed by {} (session_writers rule {:?} of the tenant policy); {why}",
            names.join(", "),
            rule.fields
        ),
        &[
            ("field", field),
            ("rule", rule.fields.clone()),
            ("writer_agent", writer.agent.clone()),
            ("writer_instance", writer.instance.clone()),
            ("verified", verified.to_string()),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn rule(fields: &str, agents: &[&str], capabilities: &[&str]) -> SessionWriters {
        SessionWriters {
            fields: fields.into(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn covered_fields_need_a_verified_writer_the_rule_names() {
        let rules = [rule("refund.*", &["refund"], &[]), rule("user_id", &[], &["intake"])];
        let refund = Writer::new("refund", "refund-1");
        let support = Writer::new("support", "support-1");
        let intake_cap = ["intake".to_string()];

        assert!(check(&rules, &refund, true, &[], Touched::Fields(&["refund.amount", "note"])).is_ok());
        assert!(check(&rules, &support, true, &intake_cap, Touched::Fields(&["user_id", "note"])).is_ok());
        assert!(check(&[], &support, false, &[], Touched::Session).is_ok());
        assert!(check(&rules, &support, false, &[], Touched::Fields(&["note"])).is_ok());

        let denied = check(&rules, &support, true, &[], Touched::Fields(&["note", "refund.amount"])).unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied);
        let info = reason::error_info(&denied).unwrap();
        assert_eq!(info.reason, "CONTEXT_WRITER_NOT_ALLOWED");
        let meta = |k: &str| info.metadata[k].clone();
        assert_eq!(
            [meta("field"), meta("rule"), meta("writer_agent"), meta("writer_instance"), meta("verified")],
            ["refund.amount", "refund.*", "support", "support-1", "true"]
        );

        let unverified = check(&rules, &refund, false, &[], Touched::Fields(&["refund.amount"])).unwrap_err();
        assert_eq!(reason::error_info(&unverified).unwrap().metadata["verified"], "false");
        assert!(unverified.message().contains("not verified"), "{}", unverified.message());

        // A whole-session delete needs every rule: refund alone may not write user_id.
        let whole = check(&rules, &refund, true, &[], Touched::Session).unwrap_err();
        let info = reason::error_info(&whole).unwrap();
        assert_eq!((info.metadata["field"].as_str(), info.metadata["rule"].as_str()), ("*", "user_id"));
        assert!(check(&rules, &refund, true, &intake_cap, Touched::Session).is_ok());
    }
}
