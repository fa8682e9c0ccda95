//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) over the `agentreach.v1` API
//! and `grpc.health.v1`, so `grpcurl … list/describe`, Postman and code generators in any
//! language discover a server's API without our protos.
//!
//! Control serves [`v1`] and [`v1alpha`] for [`CONTROL_SERVICES`]; a sidecar's local port
//! answers `/grpc.reflection.*` with [`routes`] for [`SIDECAR_SERVICES`].

use tonic::service::Routes;
use tonic_reflection::pb::{v1 as pb_v1, v1alpha as pb_v1alpha};
use tonic_reflection::server::{v1 as refl_v1, v1alpha as refl_v1alpha};

use crate::strict::Strict;

/// The encoded `FileDescriptorSet` of every `proto/agentreach/v1/*.proto` (from build.rs).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/agentreach_v1_descriptor.bin"));

const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// What the control port serves.
pub const CONTROL_SERVICES: &[&str] = &[
    "agentreach.v1.Control",
    "agentreach.v1.Admin",
    "agentreach.v1.Identity",
    "agentreach.v1.Sessions",
    "agentreach.v1.Tasks",
    "agentreach.v1.Idempotency",
    HEALTH,
    REFLECTION_V1,
    REFLECTION_V1ALPHA,
];
/// What a sidecar's local port serves.
pub const SIDECAR_SERVICES: &[&str] = &["agentreach.v1.Sidecar", HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA];

fn builder<'b>(services: &[&str]) -> tonic_reflection::server::Builder<'b> {
    let mut b = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    for s in services {
        b = b.with_service_name(*s);
    }
    b
}

/// The `grpc.reflection.v1` service listing `services`; a malformed request is answered
/// INVALID_ARGUMENT ([`Strict`]).
pub fn v1(
    services: &[&str],
) -> Strict<refl_v1::ServerReflectionServer<impl refl_v1::ServerReflection>, pb_v1::ServerReflectionRequest> {
    // The descriptor sets are compiled in and known to be valid (see the test below).
    Strict::new(builder(services).build_v1().expect("the compiled-in descriptor sets are valid"))
}

/// The `grpc.reflection.v1alpha` service listing `services` (what older grpcurl asks).
pub fn v1alpha(
    services: &[&str],
) -> Strict<
    refl_v1alpha::ServerReflectionServer<impl refl_v1alpha::ServerReflection>,
    pb_v1alpha::ServerReflectionRequest,
> {
    Strict::new(builder(services).build_v1alpha().expect("the compiled-in descriptor sets are valid"))
}

/// Both reflection services as one tower service, for servers that dispatch by path.
pub fn routes(services: &[&str]) -> Routes {
    Routes::new(v1(services)).add_service(v1alpha(services))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_descriptor_sets_build_both_services() {
        let _ = super::routes(super::CONTROL_SERVICES);
        let _ = super::routes(super::SIDECAR_SERVICES);
    }
}
