//! The entry of the outbound stack: `Sidecar/Invoke` and `Sidecar/InvokeStream` from local
//! agents. Verifies the caller's agent credential (if any), reads the caller's message,
//! decodes only the routing fields, and sends the call through the outbound stack.

use std::sync::Arc;
use std::time::Duration;

use agent_reach::convert::{priority_from_i32, target_from_proto};
use agent_reach::model::{FieldError, Target, TargetKind};
use agent_reach_routing::TableHandle;
use agent_reach_support::grpc_timeout;
use http::{Request, Response};
use hyper::body::Incoming;
use prost::Message;
use tokio::time::Instant;

use super::OutboundService;
use crate::call::{CallData, Caller, InvokeHead, OutboundCall, Shape, policy_of, verify_credential};
use crate::error::SidecarError;
use crate::grpc::{self, Body, ENVELOPE_ALLOWANCE, ReadError};
use crate::limits::BodyRead;
use crate::registry::Registry;

/// Serves `Sidecar/Invoke` and `Sidecar/InvokeStream`. Cloned per request (the local
/// API's handler takes one): its state is shared.
#[derive(Clone)]
pub(crate) struct InvokeEntry(Arc<EntryState>);

#[derive(Clone)]
struct EntryState {
    table: TableHandle,
    max_payload_bytes: usize,
    /// For calls without a deadline whose policy names none.
    default_timeout: Duration,
    /// How long the caller may take to send its message.
    body_read: BodyRead,
    stack: OutboundService,
    /// Local instances, whose agent credentials verify callers.
    registry: Arc<Registry>,
    /// Tables of the other tenants' capabilities callers were granted (`None`: such
    /// targets are refused).
    foreign: Option<Arc<super::foreign::Foreign>>,
}

impl InvokeEntry {
    pub(crate) fn new(
        table: TableHandle,
        max_payload_bytes: usize,
        default_timeout: Duration,
        body_read: BodyRead,
        stack: OutboundService,
        registry: Arc<Registry>,
    ) -> InvokeEntry {
        InvokeEntry(Arc::new(EntryState {
            table,
            max_payload_bytes,
            default_timeout,
            body_read,
            stack,
            registry,
            foreign: None,
        }))
    }

    /// Routes targets named `tenant/capability` to the other tenant's granted instances.
    pub(crate) fn with_foreign(mut self, foreign: Arc<super::foreign::Foreign>) -> InvokeEntry {
        Arc::make_mut(&mut self.0).foreign = Some(foreign);
        self
    }

    /// A call to another tenant's capability (`tenant/capability`) gets that tenant's
    /// granted instances as its table, and the capability's own name as its target; a
    /// call within the tenant is left as it is.
    async fn route_foreign(&self, mut call: OutboundCall) -> Result<OutboundCall, SidecarError> {
        let TargetKind::Capability(name) = &call.target.kind else { return Ok(call) };
        let Some((tenant, capability)) = super::foreign::split(name)? else { return Ok(call) };
        let Some(foreign) = &self.0.foreign else {
            return Err(FieldError::new("target.capability", "calls to other tenants are not served here").into());
        };
        let (tenant, capability) = (tenant.to_string(), capability.to_string());
        call.table = foreign.table(&call.table, &tenant, &capability).await?;
        call.target.kind = TargetKind::Capability(capability);
        call.foreign_tenant = Some(tenant.into());
        Ok(call)
    }

    /// What a `Route` explanation of `target` reads: the target as a call to it is routed
    /// and the table it is routed over — the tenant's `own`, or for `tenant/capability` that
    /// tenant's granted instances, fetched as for a call (this tenant's egress grant first,
    /// then control's `LookupGranted`, which needs the other tenant's grant too).
    pub(crate) async fn route_view(
        &self,
        target: Option<agent_reach::proto::Target>,
        own: Arc<agent_reach_routing::RoutingTable>,
    ) -> Result<(Target, Arc<agent_reach_routing::RoutingTable>), SidecarError> {
        let mut target = target_of(target)?;
        let TargetKind::Capability(name) = &target.kind else { return Ok((target, own)) };
        let Some((tenant, capability)) = super::foreign::split(name)? else { return Ok((target, own)) };
        let Some(foreign) = &self.0.foreign else {
            return Err(FieldError::new("target.capability", "calls to other tenants are not served here").into());
        };
        let (tenant, capability) = (tenant.to_string(), capability.to_string());
        let table = Box::pin(foreign.table(&own, &tenant, &capability)).await?;
        target.kind = TargetKind::Capability(capability);
        Ok((target, table))
    }

    /// [`InvokeEntry::route_foreign`], boxed: only a call naming `tenant/capability` waits
    /// there (for the table of that tenant, from control), and that wait's future is
    /// larger than the rest of the call's, which would carry it unboxed.
    async fn foreign_routed(&self, call: OutboundCall) -> Result<OutboundCall, SidecarError> {
        match &call.target.kind {
            TargetKind::Capability(name) if name.contains('/') => Box::pin(self.route_foreign(call)).await,
            _ => Ok(call),
        }
    }

    /// Reads the call and sends it through the outbound stack.
    pub(crate) async fn invoke(&self, req: Request<Incoming>, shape: Shape) -> Response<Body> {
        let call = match self.read_call(req, shape).await {
            Ok(c) => c,
            Err(e) => return grpc::status_response(e.into_status()),
        };
        let call = match self.foreign_routed(call).await {
            Ok(c) => c,
            Err(e) => return grpc::status_response(e.into_status()),
        };
        match self.0.stack.call(call).await {
            Ok(resp) => resp,
            Err(e) => grpc::status_response(e.into_status()),
        }
    }

    /// Sends an encoded `InvokeRequest` made inside the sidecar (the A2A endpoints) through
    /// the outbound stack, as if a local agent had sent it with `headers`.
    pub(crate) async fn call(&self, message: bytes::Bytes, headers: http::HeaderMap, shape: Shape) -> Response<Body> {
        self.call_pinned(message, headers, shape, None).await
    }

    /// [`InvokeEntry::call`] to the one instance `pin` of the target (the A2A endpoints,
    /// for a task that instance owns); `None`: any instance.
    pub(crate) async fn call_pinned(
        &self,
        message: bytes::Bytes,
        headers: http::HeaderMap,
        shape: Shape,
        pin: Option<&str>,
    ) -> Response<Body> {
        // An agent credential on the A2A request is verified as on Invoke; without one the
        // call has no verified caller.
        let caller = match verify_credential(&self.0.registry, &headers) {
            Ok(caller) => caller,
            Err(e) => return grpc::status_response(e.into_status()),
        };
        let mut call = match self.check_call(message, headers, shape, Instant::now(), caller) {
            Ok(c) => c,
            Err(e) => return grpc::status_response(e.into_status()),
        };
        call.pin = pin.map(Into::into);
        match self.0.stack.call(call).await {
            Ok(resp) => resp,
            Err(e) => grpc::status_response(e.into_status()),
        }
    }

    /// Sends an encoded `InvokeRequest` made inside the sidecar through the outbound stack
    /// as `caller`, whom the sidecar verified earlier (a durable task's submitter, recorded
    /// from its credential when the task was submitted; `None`: anonymous).
    pub(crate) async fn call_as(
        &self,
        message: bytes::Bytes,
        headers: http::HeaderMap,
        shape: Shape,
        caller: Option<Caller>,
    ) -> Response<Body> {
        let checked = self.check_call(message, headers, shape, Instant::now(), caller);
        let call = match async { self.foreign_routed(checked?).await }.await {
            Ok(c) => c,
            Err(e) => return grpc::status_response(e.into_status()),
        };
        match self.0.stack.call(call).await {
            Ok(resp) => resp,
            Err(e) => grpc::status_response(e.into_status()),
        }
    }

    /// Reads and checks the caller's message.
    async fn read_call(&self, req: Request<Incoming>, shape: Shape) -> Result<OutboundCall, SidecarError> {
        let started = Instant::now();
        let (parts, mut body) = req.into_parts();
        // Who is calling is settled before anything else: a bad credential is refused even
        // when the call would fail for another reason.
        let caller = verify_credential(&self.0.registry, &parts.headers)?;
        let limit = self.0.max_payload_bytes;
        let message = match self.0.body_read.within(grpc::read_message(&mut body, limit + ENVELOPE_ALLOWANCE)).await? {
            Ok(m) => m,
            Err(ReadError::TooLarge(size)) => return Err(SidecarError::PayloadTooLarge { size, limit }),
            Err(ReadError::Compressed) => {
                return Err(
                    FieldError::new("grpc-encoding", "compressed requests are not supported; use identity").into()
                );
            }
            Err(ReadError::Malformed(why)) => return Err(FieldError::new("request", why).into()),
            Err(ReadError::Body(e)) => return Err(SidecarError::Internal(format!("reading the request: {e}"))),
        };
        self.check_call(message, parts.headers, shape, started, caller)
    }

    /// Decodes the routing fields of an `InvokeRequest` and checks them.
    fn check_call(
        &self,
        message: bytes::Bytes,
        headers: http::HeaderMap,
        shape: Shape,
        started: Instant,
        caller: Option<crate::call::Caller>,
    ) -> Result<OutboundCall, SidecarError> {
        let limit = self.0.max_payload_bytes;
        let mut head = InvokeHead::decode(message.clone())
            .map_err(|e| FieldError::new("request", format!("not a valid InvokeRequest: {e}")))?;
        if head.payload.len() > limit {
            return Err(SidecarError::PayloadTooLarge { size: head.payload.len(), limit });
        }
        if head.idempotency_key.len() > agent_reach::model::MAX_IDEMPOTENCY_KEY_LEN {
            return Err(FieldError::new(
                "idempotency_key",
                format!("longer than {} bytes", agent_reach::model::MAX_IDEMPOTENCY_KEY_LEN),
            )
            .into());
        }
        // Taken: the call carries the checked target, never the message's.
        let target = target_of(head.target.take())?;
        let priority = priority_from_i32(head.priority);
        let table = self.0.table.load_full();
        let timeout = headers
            .get(grpc::HEADER_GRPC_TIMEOUT)
            .and_then(|v| grpc_timeout::parse(v.as_bytes()))
            .or_else(|| {
                policy_of(&table, &target)
                    .and_then(|s| s.default_timeout_ms)
                    .map(|ms| Duration::from_millis(u64::from(ms)))
            })
            .unwrap_or(self.0.default_timeout);
        Ok(OutboundCall::new(CallData {
            message,
            head,
            target,
            priority,
            headers: Arc::new(headers),
            shape,
            started,
            timeout,
            deadline: started + timeout,
            table,
            trace: opentelemetry::Context::new(),
            caller,
            foreign_tenant: None,
            pin: None,
        }))
    }
}

/// The call's target; a capability of another tenant is named `tenant/capability`
/// (checked here, routed by [`InvokeEntry::route_foreign`]).
fn target_of(target: Option<agent_reach::proto::Target>) -> Result<Target, FieldError> {
    use agent_reach::proto::target::Kind;
    let foreign = match target.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(Kind::Capability(c)) => super::foreign::split(c)?.map(|(t, c)| (t.to_string(), c.to_string())),
        _ => None,
    };
    let Some((tenant, capability)) = foreign else { return target_from_proto(target) };
    let mut checked = target_from_proto(
        target.map(|t| agent_reach::proto::Target { kind: Some(Kind::Capability(capability.clone())), ..t }),
    )?;
    checked.kind = TargetKind::Capability(format!("{tenant}/{capability}"));
    Ok(checked)
}

/// The `InvokeReply` of a unary answer of the outbound stack (what [`InvokeEntry::call`]
/// returns), or its status; reads at most `limit` bytes.
pub(crate) async fn read_reply(
    resp: Response<Body>,
    limit: usize,
) -> Result<agent_reach::proto::InvokeReply, tonic::Status> {
    use tonic::Status;
    let stored = grpc::StoredResponse::collect(resp, limit)
        .await
        .map_err(|e| Status::internal(format!("reading the answer: {e}")))?;
    let status =
        stored.trailers.as_ref().and_then(Status::from_header_map).or_else(|| Status::from_header_map(&stored.headers));
    match status {
        Some(s) if s.code() != tonic::Code::Ok => Err(s),
        _ if stored.data.len() < grpc::PREFIX_LEN => Err(Status::internal("the mesh answered no message")),
        _ => agent_reach::proto::InvokeReply::decode(stored.data.slice(grpc::PREFIX_LEN..))
            .map_err(|e| Status::internal(format!("the mesh's answer is not an InvokeReply: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::proto;
    use bytes::Bytes;

    use crate::call::InvokeMetadata;

    use super::*;

    #[test]
    fn invoke_head_reads_the_routing_fields_of_an_invoke_request() {
        let req = proto::InvokeRequest {
            target: Some(agent_reach::model::Target::capability("c").into()),
            payload: Bytes::from_static(b"payload"),
            content_type: "x".into(),
            session_id: "s".into(),
            priority: proto::Priority::Low as i32,
            idempotency_key: "k".into(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            message_id: "m".into(),
            caller: Some(proto::Caller { agent: "a".into(), instance_id: "a-1".into() }),
        };
        let wire = Bytes::from(req.encode_to_vec());
        let head = InvokeHead::decode(wire.clone()).unwrap();
        assert_eq!(head.target, req.target);
        assert_eq!(head.payload, req.payload);
        assert_eq!((head.content_type.as_str(), head.session_id.as_str()), ("x", "s"));
        assert_eq!((head.priority, head.idempotency_key.as_str()), (3, "k"));
        assert_eq!(head.message_id, "m");
        assert_eq!(head.caller, req.caller);
        assert_eq!(InvokeMetadata::decode(wire).unwrap().metadata, req.metadata);
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use crate::outbound::size_of_output;

    #[test]
    fn the_entry_future_stays_small() {
        // Inside the local API's boxed handler future, copied whole when boxed (a debug
        // build's size; 3,336 bytes when the rare fetch of another tenant's table was
        // inline).
        let invoke =
            size_of_output(|(e, r): (InvokeEntry, Request<Incoming>)| async move { e.invoke(r, Shape::Unary).await });
        assert!(invoke <= 2048, "InvokeEntry::invoke's future is {invoke} bytes");
    }
}
