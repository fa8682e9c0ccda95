//! The mesh port over mutual TLS, when the sidecar has an identity: every connection
//! presents a sidecar certificate of the trust bundle (TLS 1.3, client certificates
//! required), completed off the accept loop, with the configuration current at the accept
//! (so a renewed certificate serves the next connections while open ones carry on).
//! A connection takes its slot of `--max-connections` when accepted, before its handshake,
//! and then one of its peer's `--max-connections-per-peer` (peers are sidecar identities).
//!
//! With `--mesh-mtls permissive` (migration only, warned about at start) a connection that
//! does not open with a TLS handshake is served in plaintext, without a peer identity
//! (counted: `agent_reach_mesh_plaintext_connections_total`); its requests are trusted as
//! on a plaintext mesh. TLS connections are checked exactly as in the required mode.
//!
//! The peer's identity travels with each request as [`MeshPeer`]; [`authorize`] refuses a
//! request whose `ar-tenant` header names another tenant than its certificate, and one
//! from another tenant's sidecar unless it is a Deliver naming that tenant
//! (PERMISSION_DENIED `TENANT_MISMATCH`, naming the certificate or the header). Such a
//! cross-tenant Deliver goes on only as far as this tenant's policies grant it (the
//! capability's `allowed_tenants`, checked before the instance is looked up, then in the
//! inbound stack's authorization).

use std::sync::Arc;
use std::time::Duration;

use agent_reach::reason::{self, Reason};
use agent_reach_identity::net::Accepted;
use agent_reach_identity::{PeerId, TlsConfigs};
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::coalesce;
use crate::limits::{Activity, Port};
use crate::serve::HandlerFuture;

/// The verified identity of a mesh request's peer, shared by the requests of its
/// connection (a clone per request is a reference count, not three `String` copies).
#[derive(Clone, Debug)]
pub struct MeshPeer(pub Arc<PeerId>);

/// Accepts TLS connections on `listener` until shutdown and serves HTTP/2 on them with
/// `handler` within `port`'s limits, each request carrying its [`MeshPeer`]; with
/// `permissive`, plaintext connections too (without one).
pub async fn serve<F>(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    permissive: bool,
    port: Arc<Port>,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> HandlerFuture + Clone + Send + Sync + 'static,
{
    if permissive {
        tracing::warn!(
            "mutual TLS on the mesh port is PERMISSIVE (--mesh-mtls permissive): plaintext connections are served \
             without a verified peer and their ar-tenant header is trusted (migration only; counted in \
             agent_reach_mesh_plaintext_connections_total)"
        );
    }
    let builder = port.builder();
    let (running, mut all_ended) = mpsc::channel::<()>(1);
    let admit = {
        let port = port.clone();
        move |_| port.admit()
    };
    let mut accepted =
        agent_reach_identity::net::accept_either_admitted(listener, configs, Arc::default(), admit, permissive);
    loop {
        let (tls, slot) = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => break,
            a = accepted.recv() => match a {
                Some(Ok((Accepted::Tls(tls), slot))) => {
                    crate::limits::serve_tcp(tls.get_ref().0);
                    (tls, slot)
                }
                Some(Ok((Accepted::Plain(tcp), slot))) => {
                    port.count_plaintext();
                    crate::limits::serve_tcp(&tcp);
                    let activity = Activity::new();
                    let service = port.clone().service(activity.clone(), handler.clone());
                    let (io, drain) = coalesce::coalesced(tcp);
                    let conn =
                        coalesce::Flushing::new(builder.serve_connection(TokioIo::new(port.guard(io)), service), drain);
                    let (port, shutdown, running) = (port.clone(), shutdown.clone(), running.clone());
                    tokio::spawn(async move {
                        port.drive(conn, |c| c.inner().graceful_shutdown(), activity, shutdown, slot, running).await;
                    });
                    continue;
                }
                Some(Err(_)) => continue,
                None => break,
            },
        };
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| agent_reach_identity::tls::peer_identity(Some(certs)).ok().flatten());
        let Some(peer) = peer else {
            // Client certificates are required by the handshake; this cannot be reached
            // with a verified chain, but a connection without an identity is not served.
            continue;
        };
        let Some(peer_slot) = port.admit_peer(&peer.to_string()) else { continue };
        let peer = Arc::new(peer);
        let handler = handler.clone();
        let activity = Activity::new();
        let service = port.clone().service(activity.clone(), move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(MeshPeer(peer.clone()));
            handler(req)
        });
        // As on the local port (`serve`): the guard reads what h2 reads and sees what it
        // writes, in front of the outbox; a poll's frames leave as one write to the TLS
        // stream (its records in one socket write).
        let (io, drain) = coalesce::coalesced_stream(*tls);
        let conn = coalesce::Flushing::new(builder.serve_connection(TokioIo::new(port.guard(io)), service), drain);
        let (port, shutdown, running) = (port.clone(), shutdown.clone(), running.clone());
        tokio::spawn(async move {
            port.drive(conn, |c| c.inner().graceful_shutdown(), activity, shutdown, slot, running).await;
            drop(peer_slot);
        });
    }
    drop(accepted);
    drop(running);
    if tokio::time::timeout(Duration::from_secs(10), all_ended.recv()).await.is_err() {
        tracing::warn!("mesh connections still open 10s after shutdown");
    }
}

/// Refuses a mesh request whose claimed tenant (`ar-tenant`, or the tenant field of
/// `ar-hop`) is not its certificate's tenant, or whose certificate is of another tenant
/// than this sidecar's (`ours`) unless the request is a Deliver claiming that tenant (a
/// cross-tenant call, which the policies decide next). Requests without a [`MeshPeer`]
/// (plaintext mesh) pass unchecked.
pub fn authorize(ours: &str, req: &Request<Incoming>) -> Result<(), Status> {
    let Some(MeshPeer(peer)) = req.extensions().get::<MeshPeer>() else { return Ok(()) };
    check_peer(ours, peer, req.uri().path(), req.headers())
}

/// [`authorize`] of a request from `peer` for `path`.
fn check_peer(ours: &str, peer: &PeerId, path: &str, headers: &http::HeaderMap) -> Result<(), Status> {
    let PeerId::Sidecar(id) = peer else {
        return Err(reason::status(Reason::Unauthenticated, format!("{peer} is not a sidecar"), &[]));
    };
    let deliver = matches!(path, crate::grpc::PATH_DELIVER | crate::grpc::PATH_DELIVER_STREAM);
    let claimed = crate::hop::claimed_tenant(headers)
        .map_err(|why| reason::status(Reason::InvalidArgument, format!("malformed mesh request: {why}"), &[]))?;
    let names_its_tenant = claimed.is_some_and(|(_, tenant)| tenant == id.tenant);
    if id.tenant != ours && !(deliver && names_its_tenant) {
        return Err(reason::status(
            Reason::TenantMismatch,
            format!("the caller's certificate is of tenant {:?}; this sidecar serves {ours:?}", id.tenant),
            &[("field", "certificate".into()), ("claimed", id.tenant.clone()), ("verified", ours.to_string())],
        ));
    }
    if let Some((field, claimed)) = claimed
        && claimed != id.tenant
    {
        return Err(reason::status(
            Reason::TenantMismatch,
            format!("{field} names tenant {claimed:?} but the caller's certificate is of tenant {:?}", id.tenant),
            &[("field", field.into()), ("claimed", claimed.to_string()), ("verified", id.tenant.clone())],
        ));
    }
    Ok(())
}

/// Mutual TLS configurations of sidecar `sidecar` of tenant `a`, issued by `ca` (trust
/// domain `mesh.test`), as on the mesh port (tests).
#[cfg(test)]
pub(crate) fn test_configs(ca: &agent_reach_identity::Ca, sidecar: &str) -> TlsConfigs {
    use agent_reach_identity::{ClientAuth, Credentials, ExpectedPeer, WorkloadId};
    let now = std::time::SystemTime::now();
    let id = WorkloadId::new("mesh.test", "a", sidecar);
    let (issued, key) = ca.issue_with_key(&id.uri(), now, now + Duration::from_secs(600)).unwrap();
    let creds = Credentials::from_pem(&issued.cert_pem, &key, ca.bundle_pem()).unwrap();
    TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain).unwrap()
}

#[cfg(test)]
mod tests {
    use agent_reach_identity::Ca;
    use tokio_rustls::TlsConnector;

    use super::*;
    use crate::limits::PortLimits;

    #[test]
    fn the_tenant_a_request_claims_in_either_form_is_checked_against_the_certificate() {
        use agent_reach::reason::error_info;
        let peer = PeerId::Sidecar(agent_reach_identity::WorkloadId::new("mesh.test", "team-a", "x"));
        let check = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = http::HeaderMap::new();
            for &(name, value) in pairs {
                headers.insert(name, http::HeaderValue::from_static(value));
            }
            check_peer("team-a", &peer, crate::grpc::PATH_DELIVER, &headers)
        };
        assert!(check(&[("ar-tenant", "team-a")]).is_ok());
        assert!(check(&[("ar-hop", "i-1|team-a|c||")]).is_ok());
        for (pairs, field) in
            [(&[("ar-tenant", "team-b")][..], "ar-tenant"), (&[("ar-hop", "i-1|team-b|c||")][..], "ar-hop")]
        {
            let refused = check(pairs).unwrap_err();
            let info = error_info(&refused).unwrap();
            assert_eq!((info.reason.as_str(), info.metadata["field"].as_str()), ("TENANT_MISMATCH", field));
            assert_eq!(info.metadata["claimed"], "team-b");
        }
        let both = check(&[("ar-hop", "i-1|team-a|c||"), ("ar-tenant", "team-a")]).unwrap_err();
        assert_eq!(both.code(), tonic::Code::InvalidArgument);
        assert!(both.message().contains("ar-hop and ar-tenant both"), "{}", both.message());
        let malformed = check(&[("ar-hop", "i-1|team-a")]).unwrap_err();
        assert_eq!(malformed.code(), tonic::Code::InvalidArgument);
    }

    #[tokio::test]
    async fn a_mutual_tls_connection_has_its_peer_watched_by_the_kernel() {
        let ca = Ca::generate("mesh.test").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let port = Arc::new(Port::new(PortLimits::default(), Arc::default()));
        let (_stop, shutdown) = watch::channel(false);
        let handler =
            |_| -> HandlerFuture { Box::pin(async { crate::grpc::status_response(Status::not_found("none")) }) };
        tokio::spawn(serve(listener, Arc::new(test_configs(&ca, "b")), false, port, shutdown, handler));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let client = tcp.local_addr().unwrap();
        let name = rustls::pki_types::ServerName::try_from(agent_reach_identity::tls::SERVER_NAME).unwrap();
        let tls = TlsConnector::from(test_configs(&ca, "a").client()).connect(name, tcp).await.unwrap();
        let (mut send, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        // Answered: the connection was accepted, its handshake done, and it is served.
        let (answer, _) = send.send_request(Request::post("http://sidecar/x").body(()).unwrap(), true).unwrap();
        assert_eq!(answer.await.unwrap().headers()["grpc-status"], "5");
        crate::limits::assert_served_tcp(addr, client);
    }
}
