//! The `agentreach.v1.Sessions` gRPC service: sidecars read, write, delete and watch their
//! tenant's session context, kept by an `agent_reach_session::SessionStore` (the control
//! service's own store by default, Redis with `--session-redis`).
//!
//! This module is the control service's one edge between session domain types and
//! protobuf, and the one place where a `SessionError` becomes a status. It checks the
//! tenant's name and, with mutual TLS on, that the calling sidecar's certificate is of that
//! tenant (the same check as every Control call: a request naming another tenant is refused
//! with `TENANT_MISMATCH`). Every watch stream ends when the service shuts down.
//!
//! Writes get the field policies the tenant's policies declare ([`declared`]): the writer's
//! agent policy decides a field it names, else the first capability (by name) of the writer
//! instance whose policy names it. A write naming no policy takes the declared one
//! (`last_writer` when none is declared); a write naming another policy than the declared
//! one is refused with `CONTEXT_POLICY_OVERRIDE` unless the rule allows overrides. Rules
//! are read from the tenant's feed (memory), so they cost no store read. Who may write a
//! field at all is the tenant policy's `session_writers` ([`crate::session_writers`]),
//! checked first for writes and deletes.
//!
//! [`SessionCounters`] (in `ControlStats`, on `/metrics`): writes applied, calls refused by
//! reason, and the live sessions of each tenant this replica serves, counted every
//! [`LIVE_INTERVAL`] (and soon after a tenant's first write here).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::feed::{Feed, Feeds};
use crate::identity::{Authorizer, request_peer};
use crate::keys;
use crate::session_writers::{self, Touched};
use agent_reach::convert::write_policy_from_i32;
use agent_reach::model::validate_tenant;
use agent_reach::policy::PolicyKind;
use agent_reach::proto;
use agent_reach::proto::sessions_server::Sessions;
use agent_reach::reason::{self, Reason};
use agent_reach_session::{Change, Field, FieldWrite, Session, SessionError, SessionStore, WritePolicy, Writer};
use futures_util::StreamExt;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::stats::ControlStats;

pub use crate::session_stats::MAX_COUNTED_TENANTS;

/// How often the live sessions of each tenant are counted.
pub const LIVE_INTERVAL: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts the live sessions of every tenant seen, every [`LIVE_INTERVAL`] and when a new
/// tenant shows up, until `shutdown`.
async fn count_live(store: Arc<dyn SessionStore>, stats: Arc<ControlStats>, mut shutdown: watch::Receiver<bool>) {
    let counters = &stats.sessions;
    loop {
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(LIVE_INTERVAL) => {}
            _ = counters.new_tenant.notified() => {}
        }
        let tenants: Vec<String> = lock(&counters.tenants).iter().cloned().collect();
        for tenant in tenants {
            match store.live_sessions(&tenant).await {
                Ok(n) => {
                    lock(&counters.live).insert(tenant, n);
                }
                Err(e) => tracing::debug!("counting the live sessions of {tenant}: {e}"),
            }
        }
    }
}

/// The Sessions service.
pub struct SessionService {
    store: Arc<dyn SessionStore>,
    shutdown: watch::Receiver<bool>,
    authz: Arc<Authorizer>,
    feeds: Arc<Feeds>,
    stats: Arc<ControlStats>,
}

impl SessionService {
    /// The service; also starts the task counting live sessions for `stats` (it ends on
    /// `shutdown`).
    pub fn new(
        store: Arc<dyn SessionStore>,
        shutdown: watch::Receiver<bool>,
        authz: Arc<Authorizer>,
        feeds: Arc<Feeds>,
        stats: Arc<ControlStats>,
    ) -> SessionService {
        tokio::spawn(count_live(store.clone(), stats.clone(), shutdown.clone()));
        SessionService { store, shutdown, authz, feeds, stats }
    }

    /// Counts a call's outcome.
    fn counted<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        if let Err(status) = &result {
            self.stats.sessions.refused(status);
        }
        result
    }

    /// Checks the request's tenant: a valid name, and the calling sidecar's own (from its
    /// certificate) when mutual TLS is on.
    fn tenant<T>(&self, request: &Request<T>, tenant: &str) -> Result<(), Status> {
        validate_tenant("tenant", tenant).map_err(|f| reason::invalid_argument(&f.field, &f.reason))?;
        self.authz.sidecar(request_peer(request), tenant, None)?;
        Ok(())
    }
}

/// The status of a failed session call.
pub fn status(e: SessionError) -> Status {
    let message = e.to_string();
    match e {
        SessionError::FieldLocked { field, writer, version } => reason::status(
            Reason::ContextFieldLocked,
            message,
            &[
                ("field", field),
                ("writer_agent", writer.agent),
                ("writer_instance", writer.instance),
                ("version", version.to_string()),
            ],
        ),
        SessionError::Conflict { field, expected, current } => reason::status(
            Reason::ContextConflict,
            message,
            &[("field", field), ("expected_version", expected.to_string()), ("current_version", current.to_string())],
        ),
        SessionError::FieldTooLarge { field, size, limit } => reason::status(
            Reason::ContextTooLarge,
            message,
            &[
                ("limit_name", "max_field_bytes".into()),
                ("field", field),
                ("size", size.to_string()),
                ("limit", limit.to_string()),
            ],
        ),
        SessionError::SessionTooLarge { size, limit } => reason::status(
            Reason::ContextTooLarge,
            message,
            &[("limit_name", "max_session_bytes".into()), ("size", size.to_string()), ("limit", limit.to_string())],
        ),
        SessionError::TooManyFields { count, limit } => reason::status(
            Reason::ContextTooLarge,
            message,
            &[("limit_name", "max_fields".into()), ("size", count.to_string()), ("limit", limit.to_string())],
        ),
        SessionError::TooManySessions { limit } => {
            reason::status(Reason::ContextTooManySessions, message, &[("limit", limit.to_string())])
        }
        SessionError::Invalid { field, reason: why } => reason::invalid_argument(&field, &why),
        SessionError::Compacted { after } => {
            reason::status(Reason::ContextHistoryCompacted, message, &[("after_version", after.to_string())])
        }
        SessionError::Unavailable(_) => reason::status(Reason::StoreUnavailable, message, &[]),
        SessionError::Corrupt(_) => reason::status(Reason::Internal, message, &[]),
    }
}

fn field_to_proto(name: String, f: Field) -> proto::SessionField {
    proto::SessionField {
        name,
        value: f.value,
        content_type: f.content_type,
        version: f.version,
        writer_agent: f.writer.agent,
        writer_instance: f.writer.instance,
        written_at_ms: f.written_at_ms,
        locked: f.locked,
    }
}

/// The reply for a session read (only `fields` when not empty).
pub fn session_to_proto(session: Option<Session>, fields: &[String]) -> proto::GetSessionReply {
    let Some(session) = session else { return proto::GetSessionReply::default() };
    let fields = session
        .fields
        .into_iter()
        .filter(|(name, _)| fields.is_empty() || fields.contains(name))
        .map(|(name, f)| field_to_proto(name, f))
        .collect();
    proto::GetSessionReply { found: true, version: session.version, fields, cached: false }
}

/// A field rule declared by a policy, and which policy declared it.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub rule: proto::SessionFieldRule,
    pub kind: PolicyKind,
    pub name: String,
}

/// The rule the tenant's policies declare for `field` when `agent`'s instance `capabilities`
/// writes it: the agent's policy first, then its capabilities' in name order.
pub fn declared(feed: &Feed, agent: &str, capabilities: &[String], field: &str) -> Option<Declared> {
    let lookup = |kind: PolicyKind, name: &str| {
        feed.with_policy(kind, name, |p| {
            let rule = p?.spec.as_ref()?.session.get(field)?;
            Some(Declared { rule: *rule, kind, name: name.to_string() })
        })
    };
    lookup(PolicyKind::Agent, agent).or_else(|| capabilities.iter().find_map(|c| lookup(PolicyKind::Capability, c)))
}

/// The capabilities of the writer instance, sorted by name (none when it is not registered).
fn writer_capabilities(feed: &Feed, tenant: &str, writer: &Writer) -> Vec<String> {
    let Some(entry) = feed.instance(&keys::instance_key(tenant, &writer.agent, &writer.instance)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entry.stored.record.registration.capabilities.iter().map(|c| c.name.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn policy_name(p: Option<agent_reach::policy::SessionWritePolicy>) -> &'static str {
    p.map(|p| p.as_str()).unwrap_or("unspecified")
}

/// A write of one field from the wire, under the rule declared for it (if any).
pub fn write_from_proto(w: proto::SessionFieldWrite, declared: Option<&Declared>) -> Result<FieldWrite, Status> {
    use agent_reach::policy::SessionWritePolicy as P;
    let requested =
        write_policy_from_i32("fields.policy", w.policy).map_err(|f| reason::invalid_argument(&f.field, &f.reason))?;
    let chosen = match (requested, declared) {
        (None, None) => P::LastWriter,
        (None, Some(d)) => write_policy_from_i32("policy", d.rule.policy).ok().flatten().unwrap_or_default(),
        (Some(p), None) => p,
        (Some(p), Some(d)) => {
            let declared_policy = write_policy_from_i32("policy", d.rule.policy).ok().flatten().unwrap_or_default();
            if p != declared_policy && !d.rule.allow_override {
                return Err(reason::status(
                    Reason::ContextPolicyOverride,
                    format!(
                        "field {:?} is declared {} by the {} policy {:?}, which allows no override; the write \
                         asked for {}",
                        w.name,
                        declared_policy.as_str(),
                        d.kind.as_str(),
                        d.name,
                        policy_name(requested)
                    ),
                    &[
                        ("field", w.name.clone()),
                        ("declared_policy", declared_policy.as_str().to_string()),
                        ("requested_policy", policy_name(requested).to_string()),
                        ("policy_kind", d.kind.as_str().to_string()),
                        ("policy_name", d.name.clone()),
                    ],
                ));
            }
            p
        }
    };
    let policy = match chosen {
        P::FirstWriter => WritePolicy::FirstWriter,
        P::LastWriter => WritePolicy::LastWriter,
        P::CompareAndSet => WritePolicy::CompareAndSet { expected: w.expected_version },
    };
    if chosen != P::CompareAndSet && w.expected_version != 0 {
        return Err(reason::invalid_argument(
            "fields.expected_version",
            "only compare_and_set writes expect a version",
        ));
    }
    Ok(FieldWrite { name: w.name, value: w.value, content_type: w.content_type, policy })
}

/// A change as the watch stream carries it.
pub fn change_to_proto(change: Change) -> proto::SessionChange {
    match change {
        Change::Put { version, fields } => proto::SessionChange {
            version,
            put: fields.into_iter().map(|(name, f)| field_to_proto(name, f)).collect(),
            ..Default::default()
        },
        Change::Removed { version, fields } => proto::SessionChange { version, removed: fields, ..Default::default() },
        Change::Ended { version } => proto::SessionChange { version, ended: true, ..Default::default() },
    }
}

type ChangeStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<proto::SessionChange, Status>> + Send>>;

#[tonic::async_trait]
impl Sessions for SessionService {
    async fn get_session(
        &self,
        request: Request<proto::GetSessionRequest>,
    ) -> Result<Response<proto::GetSessionReply>, Status> {
        let result = async {
            self.tenant(&request, &request.get_ref().tenant)?;
            let r = request.get_ref();
            let session = self.store.get(&r.tenant, &r.session_id).await.map_err(status)?;
            Ok(Response::new(session_to_proto(session, &r.fields)))
        };
        self.counted(result.await)
    }

    async fn put_session(
        &self,
        request: Request<proto::PutSessionRequest>,
    ) -> Result<Response<proto::PutSessionReply>, Status> {
        let result = self.put(request).await;
        if result.is_ok() {
            self.stats.sessions.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.counted(result)
    }

    async fn delete_session(
        &self,
        request: Request<proto::DeleteSessionRequest>,
    ) -> Result<Response<proto::DeleteSessionReply>, Status> {
        let result = async {
            self.tenant(&request, &request.get_ref().tenant)?;
            let r = request.get_ref();
            let feed = self.feeds.get(&r.tenant).await.map_err(Status::from)?;
            let rules = session_writers::rules(&feed);
            if !rules.is_empty() {
                let writer = Writer::new(r.writer_agent.clone(), r.writer_instance.clone());
                let capabilities = writer_capabilities(&feed, &r.tenant, &writer);
                let names: Vec<&str> = r.fields.iter().map(String::as_str).collect();
                let touched = if names.is_empty() { Touched::Session } else { Touched::Fields(&names) };
                session_writers::check(&rules, &writer, r.writer_verified, &capabilities, touched)?;
            }
            drop(feed);
            let deleted = self.store.delete(&r.tenant, &r.session_id, &r.fields).await.map_err(status)?;
            if deleted.is_some() {
                self.stats.sessions.deletes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Response::new(proto::DeleteSessionReply { deleted: deleted.is_some(), version: deleted.unwrap_or(0) }))
        };
        self.counted(result.await)
    }

    type WatchSessionStream = ChangeStream;

    async fn watch_session(
        &self,
        request: Request<proto::WatchSessionRequest>,
    ) -> Result<Response<ChangeStream>, Status> {
        let result = self.watch(request).await;
        self.counted(result)
    }
}

impl SessionService {
    async fn put(
        &self,
        request: Request<proto::PutSessionRequest>,
    ) -> Result<Response<proto::PutSessionReply>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        if r.writer_instance.is_empty() || r.writer_agent.is_empty() {
            return Err(reason::invalid_argument("writer_instance", "a write names its writer (agent and instance)"));
        }
        let writer = Writer::new(r.writer_agent, r.writer_instance);
        let feed = self.feeds.get(&r.tenant).await.map_err(Status::from)?;
        let capabilities = writer_capabilities(&feed, &r.tenant, &writer);
        let names: Vec<&str> = r.fields.iter().map(|w| w.name.as_str()).collect();
        let rules = session_writers::rules(&feed);
        session_writers::check(&rules, &writer, r.writer_verified, &capabilities, Touched::Fields(&names))?;
        let writes = r
            .fields
            .into_iter()
            .map(|w| {
                let rule = declared(&feed, &writer.agent, &capabilities, &w.name);
                write_from_proto(w, rule.as_ref())
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(feed);
        let written = self.store.put(&r.tenant, &r.session_id, &writer, writes).await.map_err(status)?;
        self.stats.sessions.saw(&r.tenant);
        Ok(Response::new(proto::PutSessionReply { version: written.version }))
    }

    async fn watch(&self, request: Request<proto::WatchSessionRequest>) -> Result<Response<ChangeStream>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        let changes = self.store.watch(&r.tenant, &r.session_id, r.after_version).await.map_err(status)?;
        let mut shutdown = self.shutdown.clone();
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        let stream = changes.map(|c| c.map(change_to_proto).map_err(status)).take_until(Box::pin(stopped));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn refusals_carry_their_reason_and_details() {
        let locked = status(SessionError::FieldLocked {
            field: "user_id".into(),
            writer: Writer::new("intake", "intake-1"),
            version: 7,
        });
        assert_eq!(locked.code(), Code::FailedPrecondition);
        let info = reason::error_info(&locked).unwrap();
        assert_eq!(info.reason, "CONTEXT_FIELD_LOCKED");
        assert_eq!((info.metadata["writer_agent"].as_str(), info.metadata["version"].as_str()), ("intake", "7"));

        let conflict = status(SessionError::Conflict { field: "n".into(), expected: 3, current: 9 });
        assert_eq!(conflict.code(), Code::Aborted);
        assert_eq!(reason::error_info(&conflict).unwrap().metadata["current_version"], "9");

        let big = status(SessionError::SessionTooLarge { size: 5000, limit: 4096 });
        assert_eq!(big.code(), Code::ResourceExhausted);
        let info = reason::error_info(&big).unwrap();
        assert_eq!(
            (info.reason.as_str(), info.metadata["limit_name"].as_str()),
            ("CONTEXT_TOO_LARGE", "max_session_bytes")
        );
    }

    #[test]
    fn only_compare_and_set_expects_a_version() {
        let w = proto::SessionFieldWrite {
            name: "a".into(),
            policy: proto::WritePolicy::LastWriter as i32,
            expected_version: 3,
            ..Default::default()
        };
        assert_eq!(write_from_proto(w, None).unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn declared_policies_apply_unless_a_write_may_override_them() {
        let write = |policy: proto::WritePolicy, expected_version| proto::SessionFieldWrite {
            name: "user_id".into(),
            policy: policy as i32,
            expected_version,
            ..Default::default()
        };
        let declared = |policy: proto::WritePolicy, allow_override| Declared {
            rule: proto::SessionFieldRule { policy: policy as i32, allow_override },
            kind: PolicyKind::Agent,
            name: "intake".into(),
        };
        let first = declared(proto::WritePolicy::FirstWriter, false);
        let cas = declared(proto::WritePolicy::CompareAndSet, false);

        assert_eq!(
            write_from_proto(write(proto::WritePolicy::Unspecified, 0), None).unwrap().policy,
            WritePolicy::LastWriter
        );
        assert_eq!(
            write_from_proto(write(proto::WritePolicy::Unspecified, 0), Some(&first)).unwrap().policy,
            WritePolicy::FirstWriter
        );
        assert_eq!(
            write_from_proto(write(proto::WritePolicy::Unspecified, 4), Some(&cas)).unwrap().policy,
            WritePolicy::CompareAndSet { expected: 4 }
        );
        assert_eq!(
            write_from_proto(write(proto::WritePolicy::FirstWriter, 0), Some(&first)).unwrap().policy,
            WritePolicy::FirstWriter
        );
        let refused = write_from_proto(write(proto::WritePolicy::LastWriter, 0), Some(&first)).unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        let info = reason::error_info(&refused).unwrap();
        assert_eq!(info.reason, "CONTEXT_POLICY_OVERRIDE");
        assert_eq!(
            (info.metadata["declared_policy"].as_str(), info.metadata["requested_policy"].as_str()),
            ("first_writer", "last_writer")
        );
        assert_eq!((info.metadata["policy_kind"].as_str(), info.metadata["policy_name"].as_str()), ("agent", "intake"));
        let open = declared(proto::WritePolicy::FirstWriter, true);
        assert_eq!(
            write_from_proto(write(proto::WritePolicy::LastWriter, 0), Some(&open)).unwrap().policy,
            WritePolicy::LastWriter
        );
    }
}
