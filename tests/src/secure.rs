//! Identity for the harness, on by default: every control service the harness starts runs
//! with mutual TLS required, certificates from one CA per test process (so replicas and
//! restarted controls sign for the same sidecars) and the bootstrap admin token
//! [`ADMIN_TOKEN`]; every sidecar the harness starts against such a control buys its
//! certificate with a join token minted here; the raw clients ([`crate::admin_client`],
//! [`crate::control_client`], [`crate::WatchProbe`]) speak TLS with a certificate or token.
//!
//! The harness remembers which control addresses it started with identity; a sidecar or
//! client pointed anywhere else stays plaintext. Tests that are about plaintext opt in
//! explicitly with the `*_plaintext` functions of the harness.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use agent_reach_control::ControlConfig;
use agent_reach_control::config::BootstrapToken;
use agent_reach_control::identity::{IdentityConfig, JoinTokens, Mtls};
use agent_reach_identity::{Ca, ClientAuth, Credentials, ExpectedPeer, TlsConfigs, WorkloadId};
use agent_reach_sidecar::SidecarConfig;
use agent_reach_sidecar::identity::{ControlTls, IdentitySettings, TlsConnector};
use agent_reach_store::Store;
use tonic::transport::Channel;

/// The bootstrap admin token of every control the harness starts with identity.
pub const ADMIN_TOKEN: &str = "e2e-harness-bootstrap-admin-token";

/// The trust domain of the harness's CA.
pub const TRUST_DOMAIN: &str = agent_reach_identity::DEFAULT_TRUST_DOMAIN;

/// The CA of every control the harness starts with identity (one per test process).
pub fn ca() -> Arc<Ca> {
    static CA: OnceLock<Arc<Ca>> = OnceLock::new();
    CA.get_or_init(|| Arc::new(Ca::generate(TRUST_DOMAIN).expect("generate the harness CA"))).clone()
}

/// Control addresses started with identity, with their store when the harness has it (join
/// tokens are minted straight into it; otherwise through the Admin API).
type Secured = Mutex<HashMap<SocketAddr, Option<Arc<dyn Store>>>>;

fn secured() -> &'static Secured {
    static SECURED: OnceLock<Secured> = OnceLock::new();
    SECURED.get_or_init(Default::default)
}

/// Records that the control at `addr` runs with the harness's identity.
pub(crate) fn remember(addr: SocketAddr, store: Option<Arc<dyn Store>>) {
    secured().lock().unwrap_or_else(|e| e.into_inner()).insert(addr, store);
}

/// Records that the control at `addr` is plaintext (an address may be reused).
pub(crate) fn forget(addr: SocketAddr) {
    secured().lock().unwrap_or_else(|e| e.into_inner()).remove(&addr);
}

/// The socket address of an endpoint ("http://127.0.0.1:7800" or "127.0.0.1:7800").
fn addr_of(endpoint: &str) -> Option<SocketAddr> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.trim_end_matches('/').parse().ok()
}

/// Whether `endpoint` is a control the harness started with identity, and its store.
fn lookup(endpoint: &str) -> Option<Option<Arc<dyn Store>>> {
    let addr = addr_of(endpoint)?;
    secured().lock().unwrap_or_else(|e| e.into_inner()).get(&addr).cloned()
}

/// Whether `endpoint` is a control the harness started with identity.
pub fn is_secured(endpoint: &str) -> bool {
    lookup(endpoint).is_some()
}

/// `config` with the harness's identity where the test left it unset: the harness CA and
/// `--mtls required` when it has no CA of its own, the bootstrap token [`ADMIN_TOKEN`] when
/// it has none.
pub fn secure_config(mut config: ControlConfig) -> ControlConfig {
    if config.identity.is_none() {
        config.identity = Some(IdentityConfig { ca: ca(), cert_ttl: agent_reach_identity::DEFAULT_CERT_TTL });
        config.mtls = Mtls::Required;
    }
    if config.admin_token.is_none() {
        config.admin_token = Some(BootstrapToken(ADMIN_TOKEN.to_string()));
    }
    config
}

/// `config` with identity settings (a fresh join token of its tenant and the harness's
/// trust bundle) when it has none and one of its control endpoints was started with
/// identity by the harness; unchanged otherwise.
pub async fn sidecar_identity(mut config: SidecarConfig) -> SidecarConfig {
    if config.identity.is_some() {
        return config;
    }
    let Some((endpoint, store)) = config.control.iter().find_map(|e| lookup(e).map(|s| (e.clone(), s))) else {
        return config;
    };
    let join_token = match store {
        Some(store) => {
            JoinTokens::new(store)
                .create(&config.tenant, Duration::from_secs(3600), false, "e2e harness")
                .await
                .unwrap_or_else(|e| panic!("mint a join token of {}: {e}", config.tenant))
                .secret
        }
        None => {
            let mut admin = crate::admin_client(&endpoint).await;
            let request = agent_reach::proto::CreateJoinTokenRequest {
                tenant: config.tenant.clone(),
                ttl_ms: 3_600_000,
                single_use: false,
                description: "e2e harness".into(),
            };
            admin
                .create_join_token(request)
                .await
                .unwrap_or_else(|e| panic!("mint a join token of {} at {endpoint}: {e}", config.tenant))
                .into_inner()
                .secret
        }
    };
    config.identity = Some(IdentitySettings {
        trust_domain: TRUST_DOMAIN.into(),
        trust_bundle_pem: ca().bundle_pem().to_string(),
        join_token,
    });
    config
}

/// TLS configurations of a certificate of the harness CA for sidecar `sidecar_id` of
/// `tenant`, valid for a day.
pub fn sidecar_tls(tenant: &str, sidecar_id: &str) -> TlsConfigs {
    let ca = ca();
    let uri = WorkloadId::new(TRUST_DOMAIN, tenant, sidecar_id).uri();
    let now = SystemTime::now();
    let (issued, key) = ca
        .issue_with_key(&uri, now - Duration::from_secs(60), now + Duration::from_secs(24 * 3600))
        .expect("issue a harness certificate");
    let creds = Credentials::from_pem(&issued.cert_pem, &key, ca.bundle_pem()).expect("harness credentials");
    TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain).expect("harness TLS configs")
}

/// A channel to `endpoint` presenting the certificate of sidecar `sidecar_id` of `tenant`
/// when the harness started that control with identity; plaintext otherwise.
pub fn channel_as(endpoint: &str, tenant: &str, sidecar_id: &str) -> Channel {
    if is_secured(endpoint) {
        TlsConnector::fixed(sidecar_tls(tenant, sidecar_id).client())
            .channel(endpoint)
            .unwrap_or_else(|e| panic!("channel to {endpoint}: {e}"))
    } else {
        Channel::from_shared(endpoint.to_string()).unwrap_or_else(|e| panic!("endpoint {endpoint}: {e}")).connect_lazy()
    }
}

/// A channel to `endpoint` that checks control's certificate and presents none (what the
/// Admin API needs: it authenticates by token), or plaintext.
pub fn anonymous_channel(endpoint: &str) -> Channel {
    if is_secured(endpoint) {
        let config = agent_reach_identity::tls::bootstrap_client(ca().bundle_pem(), TRUST_DOMAIN)
            .expect("bootstrap client config");
        TlsConnector::fixed(Arc::new(config)).channel(endpoint).unwrap_or_else(|e| panic!("channel to {endpoint}: {e}"))
    } else {
        Channel::from_shared(endpoint.to_string()).unwrap_or_else(|e| panic!("endpoint {endpoint}: {e}")).connect_lazy()
    }
}

/// The TLS toward control of a sidecar `sidecar_id` of `tenant` holding a harness
/// certificate, for the sidecar's own control clients, when `endpoint` has identity.
pub fn control_tls(endpoint: &str, tenant: &str, sidecar_id: &str) -> Option<Arc<ControlTls>> {
    if !is_secured(endpoint) {
        return None;
    }
    let settings = IdentitySettings {
        trust_domain: TRUST_DOMAIN.into(),
        trust_bundle_pem: ca().bundle_pem().to_string(),
        join_token: String::new(),
    };
    let tls = ControlTls::new(&settings).expect("control TLS");
    tls.install(sidecar_tls(tenant, sidecar_id));
    Some(Arc::new(tls))
}

/// Adds `authorization: Bearer <ADMIN_TOKEN>` to every Admin call.
#[derive(Clone)]
pub struct AdminToken;

impl tonic::service::Interceptor for AdminToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let value = format!("Bearer {ADMIN_TOKEN}").parse().expect("an ASCII header value");
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }
}
