//! The `agentreach.v1.Control` gRPC service, and the one place where control errors become
//! `tonic::Status`.

use std::pin::Pin;

use agent_reach::convert::{health_state_from_i32, registration_from_proto};
use agent_reach::model::{FieldError, HealthState, Load, validate_tenant};
use agent_reach::proto;
use agent_reach::proto::control_server::Control;
use agent_reach::reason::{self, Reason};
use agent_reach_store::StoreError;
use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::registry::{NewInstance, Registry, RegistryError, Renewal};

/// Watch events buffered per sidecar before the watcher waits for it to read.
const WATCH_BUFFER: usize = 64;

/// The Control service.
pub struct ControlService {
    registry: Registry,
    shutdown: watch::Receiver<bool>,
}

impl ControlService {
    pub fn new(registry: Registry, shutdown: watch::Receiver<bool>) -> ControlService {
        ControlService { registry, shutdown }
    }
}

impl From<RegistryError> for Status {
    fn from(e: RegistryError) -> Status {
        match e {
            RegistryError::Invalid(f) => reason::invalid_argument(&f.field, &f.reason),
            RegistryError::Store(StoreError::Unavailable(why)) => {
                reason::status(Reason::StoreUnavailable, format!("store unavailable: {why}"), &[])
            }
            RegistryError::Store(e) => reason::status(Reason::Internal, e.to_string(), &[]),
            RegistryError::Corrupt { .. } => reason::status(Reason::Internal, e.to_string(), &[]),
        }
    }
}

fn identity(sidecar: Option<proto::SidecarIdentity>) -> Result<proto::SidecarIdentity, RegistryError> {
    sidecar.ok_or_else(|| FieldError::new("sidecar", "is required").into())
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn register(
        &self,
        request: Request<proto::ControlRegisterRequest>,
    ) -> Result<Response<proto::ControlRegisterReply>, Status> {
        let r = request.into_inner();
        let sidecar = identity(r.sidecar)?;
        let registration = registration_from_proto("registration", r.registration).map_err(RegistryError::from)?;
        let (lease, ttl, revision) = self
            .registry
            .register(NewInstance {
                tenant: r.tenant,
                instance_id: r.instance_id,
                sidecar_id: sidecar.sidecar_id,
                sidecar_address: sidecar.mesh_address,
                registration,
                state: health_state_from_i32(r.state).unwrap_or(HealthState::Up),
            })
            .await?;
        Ok(Response::new(proto::ControlRegisterReply {
            lease_id: lease,
            lease_ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
            revision,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<proto::ControlHeartbeatRequest>,
    ) -> Result<Response<proto::ControlHeartbeatReply>, Status> {
        let r = request.into_inner();
        let renewals = r
            .instances
            .into_iter()
            .map(|i| Renewal {
                instance_id: i.instance_id,
                agent: i.agent,
                lease: i.lease_id,
                state: health_state_from_i32(i.state),
                load: i.load.map(Load::from).unwrap_or_default(),
            })
            .collect();
        let expired = self.registry.renew(&r.tenant, renewals).await?;
        Ok(Response::new(proto::ControlHeartbeatReply { expired_instance_ids: expired }))
    }

    async fn deregister(
        &self,
        request: Request<proto::ControlDeregisterRequest>,
    ) -> Result<Response<proto::ControlDeregisterReply>, Status> {
        let r = request.into_inner();
        let revision = self.registry.deregister(&r.tenant, &r.agent, &r.instance_id, r.lease_id).await?;
        Ok(Response::new(proto::ControlDeregisterReply { revision }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let r = request.into_inner();
        validate_tenant("tenant", &r.tenant).map_err(RegistryError::from)?;
        if r.from_revision < 0 {
            return Err(RegistryError::from(FieldError::new("from_revision", "must not be negative")).into());
        }
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(crate::watch::run(self.registry.clone(), r.tenant, r.from_revision, tx, self.shutdown.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
