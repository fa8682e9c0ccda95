//! Compiles `proto/agentreach/v1/*.proto` with the protoc shipped by `protoc-bin-vendored`,
//! so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let files = [
        "proto/agentreach/v1/common.proto",
        "proto/agentreach/v1/policy.proto",
        "proto/agentreach/v1/agent.proto",
        "proto/agentreach/v1/session.proto",
        "proto/agentreach/v1/task.proto",
        "proto/agentreach/v1/sidecar.proto",
        "proto/agentreach/v1/mesh.proto",
        "proto/agentreach/v1/control.proto",
        "proto/agentreach/v1/admin.proto",
        "proto/agentreach/v1/identity.proto",
        "proto/agentreach/v1/idempotency.proto",
    ];
    // The descriptor set of the whole API, for gRPC server reflection (src/reflection.rs).
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("agentreach_v1_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        // Payloads stay `Bytes`: decoding from a `Bytes` buffer then slices instead of copying.
        .bytes(".")
        // Malformed requests answer INVALID_ARGUMENT on every generated server (src/codec.rs).
        .codec_path("crate::codec::StrictCodec")
        .compile_protos(&files, &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
