//! The one HTTP/1 client of the sidecar: calls to HTTP/JSON agents and their health probes.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub(crate) fn client() -> &'static Client<HttpConnector, Full<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
    })
}

/// GETs `url` and returns the status (health probes).
pub(crate) async fn get(url: &str) -> Result<StatusCode, String> {
    let req = Request::get(url).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let resp = client().request(req).await.map_err(|e| e.to_string())?;
    Ok(resp.status())
}
