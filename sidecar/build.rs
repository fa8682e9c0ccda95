//! Compiles the vendored A2A protocol (`proto/lf/a2a/v1/a2a.proto`, package `lf.a2a.v1`)
//! for the sidecar's A2A endpoints: prost messages, the tonic `A2AService` server, and serde
//! implementations in the protobuf JSON mapping (pbjson) for the JSON-RPC binding.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("lf_a2a_v1_descriptor.bin");
    tonic_prost_build::configure()
        .build_client(true)
        // Malformed requests answer INVALID_ARGUMENT, as on every other RPC (the root crate's
        // src/codec.rs, which names the one A2A request not called …Request).
        .codec_path("agent_reach::codec::StrictCodec")
        .file_descriptor_set_path(&descriptors)
        // Struct, Value, Timestamp and Empty with serde support in the JSON mapping.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(
            &[std::path::PathBuf::from("../proto/lf/a2a/v1/a2a.proto")],
            // The well-known types (struct, timestamp, empty) ship with the vendored protoc.
            &[std::path::PathBuf::from("../proto"), protoc_bin_vendored::include_path()?],
        )?;
    // Unknown fields are skipped, as the protobuf JSON mapping allows, so newer clients work.
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .ignore_unknown_fields()
        .build(&[".lf.a2a.v1"])?;
    println!("cargo:rerun-if-changed=../proto/lf");
    // How the sidecar is optimized, for `--version` (and so the benchmark's report): a
    // build from a PGO profile (scripts/build-pgo.sh) says so.
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    println!("cargo:rustc-env=AGENT_REACH_SIDECAR_BUILD={}", build_kind(&flags));
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    Ok(())
}

// `build_kind`, shared with the sidecar's tests.
include!("build_kind.rs");
