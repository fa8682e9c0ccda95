# syntax=docker/dockerfile:1.7
#
# The agent-reach image: agent-reach-control, agent-reach-sidecar and the agent-reach CLI in
# one minimal, non-root runtime image. The Helm chart (charts/agent-reach) runs it with
# command /usr/local/bin/agent-reach-control or /usr/local/bin/agent-reach-sidecar.
#
#   docker build -t ghcr.io/agent-reach/agent-reach:0.1.0 .
#
# The build needs no system protoc: tools/protoc (named by .cargo/config.toml) runs the protoc
# of the protoc-bin-vendored crate. Not exercised by the repository's tests (no Docker engine
# on the CI machines); see charts/agent-reach/README.md.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---- build -------------------------------------------------------------------------------
FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src

# The whole workspace (every member's Cargo.toml is needed to load it), including tools/ and
# .cargo/ for the vendored protoc; .dockerignore keeps target/, .git/ and charts/ out.
COPY . .

# Cache mounts keep the registry and target dir between builds; the binaries are copied out
# of the cached target dir in the same step, since cache mounts are not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
        -p agent-reach-control -p agent-reach-sidecar -p agent-reach-cli \
 && mkdir -p /out \
 && cp target/release/agent-reach-control target/release/agent-reach-sidecar target/release/agent-reach /out/

# ---- runtime -----------------------------------------------------------------------------
# distroless "cc": glibc, libgcc (Rust's unwinder), CA certificates, no shell, no package
# manager; the :nonroot tag runs as uid/gid 65532, the user the chart's securityContext sets.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime

LABEL org.opencontainers.image.title="agent-reach" \
      org.opencontainers.image.description="Agent-Reach service mesh for AI agents: control service, sidecar and CLI" \
      org.opencontainers.image.source="https://github.com/agent-reach/agent-reach" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /out/agent-reach-control /out/agent-reach-sidecar /out/agent-reach /usr/local/bin/

USER 65532:65532
# control: gRPC 7800, HTTP admin 7801; sidecar: local API 7700, mesh 7701.
EXPOSE 7700 7701 7800 7801
ENTRYPOINT ["/usr/local/bin/agent-reach"]
CMD ["--help"]
