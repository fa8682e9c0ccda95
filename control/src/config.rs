//! The control service's configuration: flags and `AGENT_REACH_*` environment variables,
//! parsed once at start into [`ControlConfig`]; bad values fail start naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// agent-reach-control: holds registrations on etcd leases and streams routing state to
/// every sidecar.
#[derive(Clone, Debug, Parser)]
#[command(name = "agent-reach-control", version, about)]
pub struct ControlArgs {
    /// gRPC listen address (Control API and grpc.health.v1).
    #[arg(long, env = "AGENT_REACH_LISTEN", default_value = "0.0.0.0:7800")]
    pub listen: SocketAddr,

    /// etcd endpoints, comma-separated ("http://etcd-0:2379,..."). Without it the control
    /// service keeps its state in memory (embedded store, for development: state is lost
    /// when the process stops and replicas do not share it).
    #[arg(long, env = "AGENT_REACH_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// CA certificate (PEM) to verify etcd with; enables TLS (endpoints must be https://).
    #[arg(long, env = "AGENT_REACH_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) for etcd's client-certificate authentication; needs
    /// --etcd-key-file.
    #[arg(long, env = "AGENT_REACH_ETCD_CERT_FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,

    /// Private key (PEM) of --etcd-cert-file.
    #[arg(long, env = "AGENT_REACH_ETCD_KEY_FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,

    /// Timeout of each etcd request.
    #[arg(long, env = "AGENT_REACH_ETCD_TIMEOUT", default_value = "5s", value_parser = agent_reach::duration::parse)]
    pub etcd_timeout: Duration,

    /// Lifetime of a registration's lease without renewals. Sidecars renew every third of
    /// it while their agent heartbeats.
    #[arg(long, env = "AGENT_REACH_LEASE_TTL", default_value = "15s", value_parser = agent_reach::duration::parse)]
    pub lease_ttl: Duration,

    /// Runtime worker threads (0 = one per core, 1 = a single-threaded runtime).
    #[arg(long, env = "AGENT_REACH_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// Log format: "text" or "json".
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Validated configuration of the control service (the parts the service itself uses).
#[derive(Clone, Debug)]
pub struct ControlConfig {
    pub lease_ttl: Duration,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { lease_ttl: Duration::from_secs(15) }
    }
}

impl TryFrom<&ControlArgs> for ControlConfig {
    type Error = String;

    fn try_from(a: &ControlArgs) -> Result<Self, String> {
        if a.lease_ttl < Duration::from_secs(2) {
            return Err(format!("--lease-ttl must be at least 2s (etcd's minimum), got {:?}", a.lease_ttl));
        }
        if a.lease_ttl.subsec_nanos() != 0 {
            return Err("--lease-ttl must be whole seconds (etcd leases have second granularity)".into());
        }
        if a.etcd_endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err("--etcd-endpoints: empty endpoint in the list".into());
        }
        let tls = a.etcd_ca_file.is_some() || a.etcd_cert_file.is_some();
        if tls && a.etcd_endpoints.is_empty() {
            return Err("--etcd-ca-file / --etcd-cert-file need --etcd-endpoints".into());
        }
        if let Some(plain) = a.etcd_endpoints.iter().find(|e| tls && !e.trim().starts_with("https://")) {
            return Err(format!("--etcd-endpoints: {plain} must be https:// when etcd TLS files are given"));
        }
        Ok(ControlConfig { lease_ttl: a.lease_ttl })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ttl_is_checked() {
        let a = ControlArgs::parse_from(["control", "--lease-ttl", "1s"]);
        assert!(ControlConfig::try_from(&a).unwrap_err().contains("--lease-ttl"));
        let a = ControlArgs::parse_from(["control", "--lease-ttl", "2500ms"]);
        assert!(ControlConfig::try_from(&a).unwrap_err().contains("--lease-ttl"));
        let a = ControlArgs::parse_from(["control"]);
        assert_eq!(ControlConfig::try_from(&a).unwrap().lease_ttl, Duration::from_secs(15));
        assert!(a.etcd_endpoints.is_empty());
        let a = ControlArgs::parse_from(["control", "--etcd-endpoints", "http://e:2379", "--etcd-ca-file", "/ca.pem"]);
        assert!(ControlConfig::try_from(&a).unwrap_err().contains("https://"));
        assert!(
            ControlArgs::try_parse_from(["control", "--etcd-cert-file", "/c.pem"]).is_err(),
            "a cert needs its key"
        );
    }
}
