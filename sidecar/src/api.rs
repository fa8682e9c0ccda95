//! What the local and mesh ports answer: the method dispatch of `agentreach.v1.Sidecar`
//! (register, heartbeat, route, invoke, session context, durable tasks) and of `agentreach.v1.Mesh`
//! (deliver), plus health and reflection on both.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use agent_reach::convert::{health_state_from_i32, registration_from_proto};
use agent_reach::model::Load;
use agent_reach::proto;
use http::{Request, Response};
use hyper::body::Incoming;
use tonic::{Code, Status};

use crate::call::{Shape, boxed};
use crate::grpc::{self, Body};
use crate::inbound::deliver::MeshEntry;
use crate::outbound::invoke::InvokeEntry;
use crate::serve::HandlerFuture;
use crate::shared::Inner;
use crate::{error, mesh_tls, session, tasks};

/// The local port's handler. The method is chosen before any future is made, and each
/// method's future is boxed on its own: a call's future is as large as its own method's
/// (an `Invoke` does not carry room for a `Register`'s); the calls' futures are made in
/// their box ([`boxed`]), not copied into it.
pub(crate) fn local_api(
    inner: Arc<Inner>,
    invoke: InvokeEntry,
    a2a: crate::a2a::grpc::Server,
    req: Request<Incoming>,
) -> HandlerFuture {
    if let Some(token) = &inner.config.local_token
        && let Err(status) = token.check(req.uri().path(), req.headers())
    {
        return ready(grpc::status_response(status));
    }
    match req.uri().path() {
        grpc::PATH_INVOKE => boxed!(async move {
            let _call = inner.calls.begin();
            invoke.invoke(req, Shape::Unary).await
        }),
        grpc::PATH_INVOKE_STREAM => boxed!(async move {
            let _call = inner.calls.begin();
            invoke.invoke(req, Shape::Stream).await
        }),
        session::PATH_GET | session::PATH_PUT | session::PATH_DELETE | session::PATH_WATCH => {
            Box::pin(async move { session::local_api(inner.sessions.clone(), inner.registry.clone(), req).await })
        }
        p if tasks::PATHS.contains(&p) => {
            Box::pin(async move { tasks::local_api(inner.tasks.clone(), inner.registry.clone(), req).await })
        }
        p if p.starts_with(crate::a2a::grpc::PATH_PREFIX) => Box::pin(async move {
            let _call = inner.calls.begin();
            crate::a2a::grpc::call(&a2a, req).await
        }),
        p if p.starts_with("/grpc.health.v1.Health/") => Box::pin(async move { health(&inner, req).await }),
        p if p.starts_with("/grpc.reflection.") => Box::pin(reflection(req)),
        _ => Box::pin(local_rpc(inner, invoke, req)),
    }
}

/// The local API's other unary methods (registration, heartbeats, routes).
async fn local_rpc(inner: Arc<Inner>, invoke: InvokeEntry, req: Request<Incoming>) -> Response<Body> {
    match req.uri().path() {
        "/agentreach.v1.Sidecar/Register" => {
            unary(req, move |r: tonic::Request<proto::RegisterRequest>| {
                let inner = inner.clone();
                async move {
                    let r = r.into_inner();
                    let registration =
                        registration_from_proto("registration", r.registration).map_err(error::SidecarError::from)?;
                    inner.registry.register(registration, r.instance_id, health_state_from_i32(r.state)).await
                }
            })
            .await
        }
        "/agentreach.v1.Sidecar/Heartbeat" => {
            unary(req, move |r: tonic::Request<proto::HeartbeatRequest>| {
                let inner = inner.clone();
                async move {
                    let r = r.into_inner();
                    inner.registry.heartbeat(&r.instance_id, health_state_from_i32(r.state), r.load.map(Load::from))?;
                    Ok(proto::HeartbeatReply {})
                }
            })
            .await
        }
        "/agentreach.v1.Sidecar/Deregister" => {
            unary(req, move |r: tonic::Request<proto::DeregisterRequest>| {
                let inner = inner.clone();
                async move {
                    inner.registry.deregister(&r.into_inner().instance_id).await?;
                    Ok(proto::DeregisterReply {})
                }
            })
            .await
        }
        "/agentreach.v1.Sidecar/Route" => {
            unary(req, move |r: tonic::Request<proto::RouteRequest>| {
                let (inner, invoke) = (inner.clone(), invoke.clone());
                async move { route_rpc(&inner, &invoke, r.into_inner()).await }
            })
            .await
        }
        p => unknown_method(p),
    }
}

/// An answer ready at once, boxed as a handler's.
fn ready(resp: Response<Body>) -> HandlerFuture {
    Box::pin(std::future::ready(resp))
}

/// gRPC server reflection of the local API (see `agent_reach::reflection`).
async fn reflection(req: Request<Incoming>) -> Response<Body> {
    use tower_service::Service;
    static ROUTES: std::sync::OnceLock<tonic::service::Routes> = std::sync::OnceLock::new();
    let mut svc =
        ROUTES.get_or_init(|| agent_reach::reflection::routes(agent_reach::reflection::SIDECAR_SERVICES)).clone();
    match svc.call(req).await {
        Ok(resp) => resp.map(Body::Tonic),
        Err(never) => match never {},
    }
}

/// The mesh port's handler; like [`local_api`], each method's future boxed on its own.
pub(crate) fn mesh_api(inner: Arc<Inner>, mesh: MeshEntry, req: Request<Incoming>) -> HandlerFuture {
    if let Err(status) = mesh_tls::authorize(&inner.config.tenant, &req) {
        return ready(grpc::status_response(status));
    }
    match req.uri().path() {
        grpc::PATH_DELIVER => boxed!(async move {
            let _call = inner.calls.begin();
            mesh.deliver(req, Shape::Unary).await
        }),
        grpc::PATH_DELIVER_STREAM => boxed!(async move {
            let _call = inner.calls.begin();
            mesh.deliver(req, Shape::Stream).await
        }),
        p if p.starts_with("/grpc.health.v1.Health/") => Box::pin(async move { health(&inner, req).await }),
        p => ready(unknown_method(p)),
    }
}

/// The answer gRPC defines for a method the server does not have.
fn unknown_method(path: &str) -> Response<Body> {
    grpc::status_response(Status::new(Code::Unimplemented, format!("unknown method {path}")))
}

async fn health(inner: &Inner, req: Request<Incoming>) -> Response<Body> {
    use tower_service::Service;
    // Malformed requests: INVALID_ARGUMENT, not tonic-health's INTERNAL.
    let mut svc = agent_reach::strict::Strict::<_, tonic_health::pb::HealthCheckRequest>::new(inner.health.clone());
    match svc.call(req).await {
        Ok(resp) => resp.map(Body::Tonic),
        Err(never) => match never {},
    }
}

/// `Route`: the candidates a call to the target would be picked from, over the table the
/// call would be routed with (another tenant's granted instances for `tenant/capability`).
async fn route_rpc(
    inner: &Inner,
    invoke: &InvokeEntry,
    r: proto::RouteRequest,
) -> Result<proto::RouteReply, error::SidecarError> {
    let (target, table) = invoke.route_view(r.target, inner.table.load_full()).await?;
    agent_reach_routing::resolve(&table, &target)?;
    let max = if r.max_candidates == 0 { 5 } else { r.max_candidates as usize };
    let request = agent_reach_routing::PickRequest {
        target: &target,
        priority: agent_reach::convert::priority_from_i32(r.priority),
        hash_key: (!r.session_id.is_empty()).then_some(r.session_id.as_str()),
        exclude: &[],
        version: None,
        now: agent_reach_routing::clock(),
        prefer: None,
    };
    let explanation = agent_reach_routing::explain(&table, &request, max);
    let (stale, age) = inner.watch_stats.staleness();
    Ok(proto::RouteReply {
        candidates: explanation
            .candidates
            .iter()
            .map(|c| proto::RouteCandidate {
                instance: Some(proto::Instance::from(&*c.member.instance)),
                score: c.score,
                note: c.note.clone(),
            })
            .collect(),
        skipped: explanation.skipped.into_iter().map(proto::SkippedInstance::from).collect(),
        table_revision: table.revision,
        strategy: explanation.strategy.unwrap_or_default().as_str().to_string(),
        table_stale: stale,
        table_age_ms: age.as_millis() as i64,
    })
}

/// Serves one unary tonic RPC with `handler`; errors become statuses in
/// [`error::SidecarError::into_status`].
async fn unary<Req, Resp, F, Fut>(req: Request<Incoming>, handler: F) -> Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(tonic::Request<Req>) -> Fut + Send,
    Fut: Future<Output = Result<Resp, error::SidecarError>> + Send + 'static,
{
    struct Svc<F>(F);
    impl<Req, Resp, F, Fut> tonic::server::UnaryService<Req> for Svc<F>
    where
        F: FnMut(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, error::SidecarError>> + Send + 'static,
    {
        type Response = Resp;
        type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Resp>, Status>> + Send>>;
        fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
            let fut = (self.0)(request);
            Box::pin(async move { fut.await.map(tonic::Response::new).map_err(error::SidecarError::into_status) })
        }
    }
    let mut grpc = tonic::server::Grpc::new(agent_reach::codec::StrictCodec::<Resp, Req>::default());
    grpc.unary(Svc(handler), req).await.map(Body::Tonic)
}
