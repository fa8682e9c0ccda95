//! The `agentreach.v1.Sessions` gRPC service: sidecars read, write, delete and watch their
//! tenant's session context, kept by an `agent_reach_session::SessionStore` (the control
//! service's own store by default, Redis with `--session-redis`).
//!
//! This module is the control service's one edge between session domain types and
//! protobuf, and the one place where a `SessionError` becomes a status. It checks the
//! tenant's name and, with mutual TLS on, that the calling sidecar's certificate is of that
//! tenant (the same check as every Control call: a request naming another tenant is refused
//! with `TENANT_MISMATCH`). Every watch stream ends when the service shuts down.

use std::sync::Arc;

use crate::identity::{Authorizer, request_peer};
use agent_reach::model::validate_tenant;
use agent_reach::proto;
use agent_reach::proto::sessions_server::Sessions;
use agent_reach::reason::{self, Reason};
use agent_reach_session::{Change, Field, FieldWrite, Session, SessionError, SessionStore, WritePolicy, Writer};
use futures_util::StreamExt;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The Sessions service.
pub struct SessionService {
    store: Arc<dyn SessionStore>,
    shutdown: watch::Receiver<bool>,
    authz: Arc<Authorizer>,
}

impl SessionService {
    pub fn new(
        store: Arc<dyn SessionStore>,
        shutdown: watch::Receiver<bool>,
        authz: Arc<Authorizer>,
    ) -> SessionService {
        SessionService { store, shutdown, authz }
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

fn write_from_proto(w: proto::SessionFieldWrite) -> Result<FieldWrite, Status> {
    let policy = match proto::WritePolicy::try_from(w.policy) {
        Ok(proto::WritePolicy::FirstWriter) => WritePolicy::FirstWriter,
        Ok(proto::WritePolicy::LastWriter | proto::WritePolicy::Unspecified) => WritePolicy::LastWriter,
        Ok(proto::WritePolicy::CompareAndSet) => WritePolicy::CompareAndSet { expected: w.expected_version },
        Err(_) => return Err(reason::invalid_argument("fields.policy", &format!("unknown write policy {}", w.policy))),
    };
    if policy != (WritePolicy::CompareAndSet { expected: w.expected_version }) && w.expected_version != 0 {
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
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        let session = self.store.get(&r.tenant, &r.session_id).await.map_err(status)?;
        Ok(Response::new(session_to_proto(session, &r.fields)))
    }

    async fn put_session(
        &self,
        request: Request<proto::PutSessionRequest>,
    ) -> Result<Response<proto::PutSessionReply>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        if r.writer_instance.is_empty() || r.writer_agent.is_empty() {
            return Err(reason::invalid_argument("writer_instance", "a write names its writer (agent and instance)"));
        }
        let writes = r.fields.into_iter().map(write_from_proto).collect::<Result<Vec<_>, _>>()?;
        let writer = Writer::new(r.writer_agent, r.writer_instance);
        let written = self.store.put(&r.tenant, &r.session_id, &writer, writes).await.map_err(status)?;
        Ok(Response::new(proto::PutSessionReply { version: written.version }))
    }

    async fn delete_session(
        &self,
        request: Request<proto::DeleteSessionRequest>,
    ) -> Result<Response<proto::DeleteSessionReply>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        let deleted = self.store.delete(&r.tenant, &r.session_id, &r.fields).await.map_err(status)?;
        Ok(Response::new(proto::DeleteSessionReply { deleted: deleted.is_some(), version: deleted.unwrap_or(0) }))
    }

    type WatchSessionStream = ChangeStream;

    async fn watch_session(
        &self,
        request: Request<proto::WatchSessionRequest>,
    ) -> Result<Response<ChangeStream>, Status> {
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
        assert_eq!(write_from_proto(w).unwrap_err().code(), Code::InvalidArgument);
    }
}
