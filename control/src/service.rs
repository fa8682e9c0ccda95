//! The `agentreach.v1.Control` gRPC service: sidecars register instances on their lease,
//! renew it with batched heartbeats, deregister, and watch their tenant's routing state.
//! Errors become statuses in [`crate::error`].

use std::sync::Arc;

use agent_reach::convert::{health_state_from_i32, registration_from_proto};
use agent_reach::model::{FieldError, HealthState, Load, validate_name, validate_tenant};
use agent_reach::proto;
use agent_reach::proto::control_server::Control;
use agent_reach_store::Store;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::error::ControlError;
use crate::feed::Feeds;
use crate::identity::{Authorizer, authz, request_peer};
use crate::registry::{Beat, NewInstance, Registry};
use crate::stats::ControlStats;
use crate::watch::{EventStream, Subscription, WireStream};

/// Most instances (and so lease ids) one heartbeat renews; a sidecar's heartbeat carries
/// its local instances.
pub const MAX_INSTANCES_PER_HEARTBEAT: usize = 4096;

/// The Control service.
pub struct ControlService {
    registry: Arc<Registry>,
    feeds: Arc<Feeds>,
    store: Arc<dyn Store>,
    stats: Arc<ControlStats>,
    shutdown: watch::Receiver<bool>,
    authz: Arc<Authorizer>,
    leases: authz::LeaseOwners,
    /// Leases for the reports of sidecars without local agents.
    report_leases: crate::report_leases::ReportLeases,
}

impl ControlService {
    pub fn new(
        registry: Arc<Registry>,
        feeds: Arc<Feeds>,
        store: Arc<dyn Store>,
        stats: Arc<ControlStats>,
        shutdown: watch::Receiver<bool>,
        authz: Arc<Authorizer>,
    ) -> ControlService {
        let leases = authz::LeaseOwners::new(store.clone());
        let report_leases = crate::report_leases::ReportLeases::default();
        ControlService { registry, feeds, store, stats, shutdown, authz, leases, report_leases }
    }
}

impl ControlService {
    /// A sidecar's routing-state stream ([`crate::watch`]), as encoded events shared with
    /// every other stream of the tenant.
    pub async fn watch_wire(&self, request: Request<proto::WatchRequest>) -> Result<Response<WireStream>, Status> {
        let peer = request_peer(&request);
        let r = request.into_inner();
        validate_tenant("tenant", &r.tenant).map_err(ControlError::from)?;
        self.authz.sidecar(peer, &r.tenant, r.sidecar.as_ref().map(|s| s.sidecar_id.as_str()))?;
        if r.from_revision < 0 {
            return Err(ControlError::from(FieldError::new("from_revision", "must not be negative")).into());
        }
        if *self.shutdown.borrow() {
            return Err(ControlError::ShuttingDown.into());
        }
        let feed = self.feeds.get(&r.tenant).await?;
        let subscription =
            Subscription::new(feed, self.store.clone(), self.stats.clone(), r.from_revision, self.shutdown.clone());
        Ok(Response::new(subscription.into_stream()))
    }
}

fn identity(sidecar: Option<proto::SidecarIdentity>) -> Result<proto::SidecarIdentity, ControlError> {
    sidecar.ok_or_else(|| FieldError::new("sidecar", "is required").into())
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn register(
        &self,
        request: Request<proto::ControlRegisterRequest>,
    ) -> Result<Response<proto::ControlRegisterReply>, Status> {
        let peer = request_peer(&request);
        let r = request.into_inner();
        let sidecar = identity(r.sidecar)?;
        let caller = self.authz.sidecar(peer, &r.tenant, Some(&sidecar.sidecar_id))?;
        if let Some(caller) = &caller {
            self.leases.check(r.lease_id, caller).await?;
        }
        let requested_lease = r.lease_id;
        let registration = registration_from_proto("registration", r.registration).map_err(ControlError::from)?;
        let registered = self
            .registry
            .register(NewInstance {
                tenant: r.tenant,
                instance_id: r.instance_id,
                sidecar_id: sidecar.sidecar_id,
                sidecar_address: sidecar.mesh_address,
                registration,
                state: health_state_from_i32(r.state).unwrap_or(HealthState::Up),
                lease: r.lease_id,
            })
            .await?;
        if let Some(caller) = &caller
            && requested_lease == 0
        {
            self.leases.record(registered.lease, caller).await?;
        }
        Ok(Response::new(proto::ControlRegisterReply {
            lease_id: registered.lease,
            lease_ttl_ms: u32::try_from(registered.lease_ttl.as_millis()).unwrap_or(u32::MAX),
            revision: registered.revision,
            generation: registered.generation,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<proto::ControlHeartbeatRequest>,
    ) -> Result<Response<proto::ControlHeartbeatReply>, Status> {
        let peer = request_peer(&request);
        let r = request.into_inner();
        if r.instances.len() > MAX_INSTANCES_PER_HEARTBEAT {
            let why = format!("{} instances; at most {MAX_INSTANCES_PER_HEARTBEAT} per heartbeat", r.instances.len());
            return Err(ControlError::from(FieldError::new("instances", why)).into());
        }
        let caller = self.authz.sidecar(peer, &r.tenant, r.sidecar.as_ref().map(|s| s.sidecar_id.as_str()))?;
        if let Some(caller) = &caller {
            let mut leases: Vec<i64> = r.instances.iter().map(|i| i.lease_id).chain([r.lease_id]).collect();
            leases.sort_unstable();
            leases.dedup();
            for lease in leases {
                self.leases.check(lease, caller).await?;
            }
        }
        let beats: Vec<Beat> = r
            .instances
            .into_iter()
            .map(|i| Beat {
                instance_id: i.instance_id,
                agent: i.agent,
                lease: i.lease_id,
                state: health_state_from_i32(i.state),
                load: i.load.map(Load::from),
            })
            .collect();
        let alone = r.lease_id == 0 && beats.is_empty();
        let outcome = self.registry.heartbeat(&r.tenant, r.lease_id, beats).await?;
        // The traffic report, on the lease just renewed (never one that expired), or, from a
        // sidecar without agents, on a lease control keeps for it. Losing a report costs
        // the dashboard one interval; the heartbeat still counts.
        if let (Some(report), Some(sidecar)) = (r.report, &r.sidecar)
            && !outcome.lease_expired
        {
            let lease = if alone {
                validate_name("sidecar.sidecar_id", &sidecar.sidecar_id).map_err(ControlError::from)?;
                self.report_leases
                    .lease_for(self.store.as_ref(), &r.tenant, &sidecar.sidecar_id, report.interval_ms)
                    .await
            } else {
                Ok(r.lease_id)
            };
            let stored = match lease {
                Ok(lease) => {
                    let now = crate::registry::now_ms();
                    let store = self.store.as_ref();
                    crate::reports::store_report(store, &r.tenant, &sidecar.sidecar_id, lease, report, now).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = stored {
                tracing::warn!(sidecar = %sidecar.sidecar_id, "cannot store the sidecar's report: {e}");
            }
        }
        Ok(Response::new(proto::ControlHeartbeatReply {
            expired_instance_ids: outcome.expired,
            replaced_instance_ids: outcome.replaced,
            lease_expired: outcome.lease_expired,
        }))
    }

    async fn deregister(
        &self,
        request: Request<proto::ControlDeregisterRequest>,
    ) -> Result<Response<proto::ControlDeregisterReply>, Status> {
        let peer = request_peer(&request);
        let r = request.into_inner();
        let mut expected = r.expected_lease_id;
        if let Some(owner) = self.authz.sidecar(peer, &r.tenant, None)? {
            expected = authz::check_owner(&self.store, &owner, &r.agent, &r.instance_id, r.lease_id, expected).await?;
        }
        let revision = self.registry.deregister(&r.tenant, &r.agent, &r.instance_id, r.lease_id, expected).await?;
        Ok(Response::new(proto::ControlDeregisterReply { revision }))
    }

    async fn lookup_granted(
        &self,
        request: Request<proto::LookupGrantedRequest>,
    ) -> Result<Response<proto::LookupGrantedReply>, Status> {
        let peer = request_peer(&request);
        let r = request.into_inner();
        validate_tenant("tenant", &r.tenant).map_err(ControlError::from)?;
        let caller = self.authz.sidecar(peer, &r.tenant, r.sidecar.as_ref().map(|s| s.sidecar_id.as_str()))?;
        // Only a certificate says which tenant asks: without one there is no caller tenant
        // to hold to the grants.
        if caller.is_none() {
            let why = "a cross-tenant lookup needs a sidecar certificate (mutual TLS)".into();
            return Err(ControlError::Unauthenticated(why).into());
        }
        let reply = crate::grants::lookup(&self.registry, &r.tenant, &r.target_tenant, &r.capability).await?;
        Ok(Response::new(reply))
    }

    type WatchStream = EventStream;

    /// The control port answers `Watch` with [`ControlService::watch_wire`] (see
    /// [`crate::routes`]); this generated entry point serves the same stream decoded into
    /// messages, for a `ControlServer` mounted without those routes.
    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        use futures_util::StreamExt;
        let stream = self.watch_wire(request).await?.into_inner();
        let decoded = stream.map(|event| {
            event.and_then(|wire| wire.decode().map_err(|e| Status::internal(format!("watch event: {e}"))))
        });
        Ok(Response::new(Box::pin(decoded)))
    }
}
