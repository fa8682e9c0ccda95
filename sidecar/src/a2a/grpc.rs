//! The gRPC binding: `lf.a2a.v1.A2AService` on the sidecar's local API port. The request's
//! metadata (trace context, `grpc-timeout`) travels with the mesh call it becomes.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::proto::a2a_service_server::{A2aService, A2aServiceServer};
use super::proto::{self, AgentCard, StreamResponse, Task};
use super::{A2a, A2aError};

/// The path prefix of the service's methods.
pub(crate) const PATH_PREFIX: &str = "/lf.a2a.v1.A2AService/";

/// The tonic server of the service.
pub(crate) type Server = A2aServiceServer<Service>;

pub(crate) fn server(a2a: Arc<A2a>) -> Server {
    A2aServiceServer::new(Service(a2a))
}

/// Serves one request of the service.
pub(crate) async fn call(
    server: &Server,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<crate::grpc::Body> {
    use tower_service::Service as _;
    let mut svc = server.clone();
    match svc.call(req).await {
        Ok(resp) => resp.map(crate::grpc::Body::Tonic),
        Err(never) => match never {},
    }
}

/// `A2AService` over [`A2a`].
pub(crate) struct Service(Arc<A2a>);

type Events = Pin<Box<dyn Stream<Item = Result<StreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl A2aService for Service {
    async fn send_message(
        &self,
        request: Request<proto::SendMessageRequest>,
    ) -> Result<Response<proto::SendMessageResponse>, Status> {
        let (metadata, _, req) = request.into_parts();
        let answer = self.0.send(req, metadata.into_headers()).await.map_err(A2aError::into_status)?;
        Ok(Response::new(answer))
    }

    type SendStreamingMessageStream = Events;

    async fn send_streaming_message(
        &self,
        request: Request<proto::SendMessageRequest>,
    ) -> Result<Response<Events>, Status> {
        let (metadata, _, req) = request.into_parts();
        let events = self.0.send_streaming(req, metadata.into_headers()).await.map_err(A2aError::into_status)?;
        Ok(Response::new(Box::pin(events.map(Ok))))
    }

    async fn get_task(&self, request: Request<proto::GetTaskRequest>) -> Result<Response<Task>, Status> {
        let (metadata, _, req) = request.into_parts();
        self.0.get_task(req, metadata.into_headers()).await.map(Response::new).map_err(A2aError::into_status)
    }

    async fn list_tasks(
        &self,
        request: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksResponse>, Status> {
        let (metadata, _, req) = request.into_parts();
        self.0.list_tasks(req, metadata.into_headers()).await.map(Response::new).map_err(A2aError::into_status)
    }

    async fn cancel_task(&self, request: Request<proto::CancelTaskRequest>) -> Result<Response<Task>, Status> {
        let (metadata, _, req) = request.into_parts();
        self.0.cancel_task(req, metadata.into_headers()).await.map(Response::new).map_err(A2aError::into_status)
    }

    type SubscribeToTaskStream = Events;

    async fn subscribe_to_task(
        &self,
        request: Request<proto::SubscribeToTaskRequest>,
    ) -> Result<Response<Events>, Status> {
        let (metadata, _, req) = request.into_parts();
        let events = self.0.subscribe(req, metadata.into_headers()).await.map_err(A2aError::into_status)?;
        Ok(Response::new(Box::pin(events.map(Ok))))
    }

    async fn create_task_push_notification_config(
        &self,
        _: Request<proto::TaskPushNotificationConfig>,
    ) -> Result<Response<proto::TaskPushNotificationConfig>, Status> {
        Err(A2aError::PushNotificationNotSupported.into_status())
    }

    async fn get_task_push_notification_config(
        &self,
        _: Request<proto::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<proto::TaskPushNotificationConfig>, Status> {
        Err(A2aError::PushNotificationNotSupported.into_status())
    }

    async fn list_task_push_notification_configs(
        &self,
        _: Request<proto::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<proto::ListTaskPushNotificationConfigsResponse>, Status> {
        Err(A2aError::PushNotificationNotSupported.into_status())
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<proto::GetExtendedAgentCardRequest>,
    ) -> Result<Response<AgentCard>, Status> {
        self.0.card(&request.into_inner().tenant).map(Response::new).map_err(A2aError::into_status)
    }

    async fn delete_task_push_notification_config(
        &self,
        _: Request<proto::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pbjson_types::Empty>, Status> {
        Err(A2aError::PushNotificationNotSupported.into_status())
    }
}
