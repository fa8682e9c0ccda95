//! The `agentreach.v1.Control` service as the control port serves it: the generated
//! server for every method but `Watch`, which is answered here with the shared,
//! already-encoded events of [`crate::wire`] (the generated server would encode every
//! event again for every watcher). Same path, same request decoding, same statuses.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach::proto;
use agent_reach::proto::control_server::ControlServer;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{NamedService, ServerStreamingService};

use crate::service::ControlService;
use crate::watch::WireStream;
use crate::wire::{WireCodec, WireEvent};

/// The path of the `Watch` method.
pub const WATCH_PATH: &str = "/agentreach.v1.Control/Watch";

/// The Control service with `Watch` served from shared bytes (see the module doc).
#[derive(Clone)]
pub struct ControlRoutes {
    service: Arc<ControlService>,
    generated: ControlServer<ControlService>,
}

impl ControlRoutes {
    pub fn new(service: ControlService) -> ControlRoutes {
        let service = Arc::new(service);
        ControlRoutes { generated: ControlServer::from_arc(service.clone()), service }
    }
}

impl NamedService for ControlRoutes {
    const NAME: &'static str = <ControlServer<ControlService> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for ControlRoutes
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            return self.generated.call(req);
        }
        let method = WatchMethod(self.service.clone());
        Box::pin(async move { Ok(tonic::server::Grpc::new(WireCodec).server_streaming(method, req).await) })
    }
}

struct WatchMethod(Arc<ControlService>);

impl ServerStreamingService<proto::WatchRequest> for WatchMethod {
    type Response = WireEvent;
    type ResponseStream = WireStream;
    type Future = BoxFuture<tonic::Response<WireStream>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<proto::WatchRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch_wire(request).await })
    }
}
