//! `agent-reach-bench`: measurements of the Agent-Reach call path.
//!
//! Two tools live here. [`latency`] is a quick in-process probe (direct vs two sidecar
//! hops, sequential calls). [`orchestrate`] is the side-by-side benchmark of issue #7: it
//! starts control, two sidecars, an echo agent, two nginx and two Envoy processes on
//! 127.0.0.1, verifies every path with a real gRPC client, drives each path closed-loop
//! with h2load and open-loop with [`load`] (this crate's fixed-rate generator), streams
//! 64 KiB chunks through it with [`stream`], reads CPU and RSS of every proxy process from
//! `/proc` ([`procstat`]) and, where the CPU exposes them, instructions and cycles with
//! `perf stat` ([`hwcounters`]), measures sidecar RSS with
//! large routing tables ([`table_rss`]) and writes JSON plus a markdown table
//! ([`report`]). With `--tls` the hop between the two proxies of every path is TLS 1.3 with
//! client certificates ([`tls`]). Nothing here is used by the mesh itself.

pub mod agent;
pub mod embedded;
pub mod h2load;
pub mod hwcounters;
pub mod instructions;
pub mod latency;
pub mod load;
pub mod machine;
pub mod orchestrate;
pub mod overload;
pub mod procs;
pub mod procstat;
pub mod proxies;
pub mod report;
pub mod stream;
pub mod table_rss;
pub mod tls;
pub mod verify;
pub mod wire;
