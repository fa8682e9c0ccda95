//! Per-request limits of the control service's gRPC port, as a tower layer around every
//! service: a request whose header list is over `--max-header-list-bytes` is refused on
//! its stream with RESOURCE_EXHAUSTED `LIMIT_EXCEEDED` (`limit: max-header-list-bytes`;
//! h2 is told eight times the limit, so a list up to that reaches this layer and gets a
//! reason rather than h2's bare HTTP 431), and a request not answered within
//! `--request-timeout` (a stream: until its first message; e.g. a body that never
//! arrives) is refused the same way (`limit: request-timeout`). Both are counted in
//! [`ConnStats`] for `/metrics`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::reason::{self, Reason};
use tonic::Status;

use crate::limit_stats::ConnStats;

/// HPACK size of a request's header list (RFC 7541 §4.1: name + value + 32 per field),
/// pseudo-headers included.
pub(crate) fn header_list_size<B>(req: &http::Request<B>) -> usize {
    const FIELD: usize = 32;
    let uri = req.uri();
    let pseudo = (":method".len() + req.method().as_str().len() + FIELD)
        + (":path".len() + uri.path_and_query().map_or(1, |p| p.as_str().len()) + FIELD)
        + uri.scheme_str().map_or(0, |s| ":scheme".len() + s.len() + FIELD)
        + uri.authority().map_or(0, |a| ":authority".len() + a.as_str().len() + FIELD);
    pseudo + req.headers().iter().map(|(n, v)| n.as_str().len() + v.len() + FIELD).sum::<usize>()
}

/// The `LIMIT_EXCEEDED` status naming `flag`.
fn refusal(flag: &str, message: String) -> Status {
    reason::status(Reason::LimitExceeded, message, &[(reason::META_LIMIT, flag.trim_start_matches('-').to_string())])
}

/// The layer: the limits and the counters of refusals.
#[derive(Clone, Debug)]
pub struct RefusalLayer {
    max_header_list_bytes: usize,
    request_timeout: Duration,
    stats: Arc<ConnStats>,
}

impl RefusalLayer {
    pub(crate) fn new(max_header_list_bytes: u32, request_timeout: Duration, stats: Arc<ConnStats>) -> RefusalLayer {
        RefusalLayer { max_header_list_bytes: max_header_list_bytes as usize, request_timeout, stats }
    }
}

impl<S> tower::Layer<S> for RefusalLayer {
    type Service = Refusals<S>;

    fn layer(&self, inner: S) -> Refusals<S> {
        Refusals { inner, limits: self.clone() }
    }
}

/// A service within the layer's limits.
#[derive(Clone, Debug)]
pub struct Refusals<S> {
    inner: S,
    limits: RefusalLayer,
}

type Answer<E> = Result<http::Response<tonic::body::Body>, E>;

impl<S, B> tower::Service<http::Request<B>> for Refusals<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (max, timeout, stats) =
            (self.limits.max_header_list_bytes, self.limits.request_timeout, self.limits.stats.clone());
        let size = header_list_size(&req);
        if size > max {
            stats.header_list.fetch_add(1, Ordering::Relaxed);
            let status = refusal(
                "--max-header-list-bytes",
                format!("the request's header list is {size} bytes; this port accepts at most {max}"),
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let answer = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(timeout, answer).await {
                Ok(answer) => answer,
                Err(_) => {
                    stats.request_timeout.fetch_add(1, Ordering::Relaxed);
                    let status = refusal(
                        "--request-timeout",
                        format!("the request was not answered within {timeout:?} (its body may not have arrived)"),
                    );
                    Ok(status.into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    fn answer_after(
        delay: Duration,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
        Future = impl Future<Output = Answer<std::convert::Infallible>> + Send + 'static,
    > + Clone {
        tower::service_fn(move |_req: http::Request<()>| async move {
            tokio::time::sleep(delay).await;
            Ok(Status::ok("").into_http())
        })
    }

    fn limit_of(resp: &http::Response<tonic::body::Body>) -> (tonic::Code, String) {
        let status = Status::from_header_map(resp.headers()).expect("grpc-status");
        let info = reason::error_info(&status).expect("ErrorInfo");
        assert_eq!(info.reason, "LIMIT_EXCEEDED");
        (status.code(), info.metadata.get("limit").cloned().unwrap_or_default())
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_header_list_and_a_late_answer_are_refused_by_limit_and_counted() {
        let stats = Arc::new(ConnStats::default());
        let layer = RefusalLayer::new(1024, Duration::from_secs(60), stats.clone());
        let mut svc = layer.layer(answer_after(Duration::from_secs(59)));
        let req = || http::Request::post("http://x/agentreach.v1.Control/Route").body(()).unwrap();
        // Answered in 59 s: within the timeout.
        let resp = svc.ready().await.unwrap().call(req()).await.unwrap();
        assert_eq!(Status::from_header_map(resp.headers()).unwrap().code(), tonic::Code::Ok);
        // A header list over 1 KiB.
        let mut big = req();
        big.headers_mut().insert("x-big", "v".repeat(1000).parse().unwrap());
        let resp = svc.ready().await.unwrap().call(big).await.unwrap();
        assert_eq!(limit_of(&resp), (tonic::Code::ResourceExhausted, "max-header-list-bytes".into()));
        // An answer that would take 61 s: refused at 60 s.
        let mut slow = layer.layer(answer_after(Duration::from_secs(61)));
        let t = tokio::time::Instant::now();
        let resp = slow.ready().await.unwrap().call(req()).await.unwrap();
        assert_eq!(t.elapsed(), Duration::from_secs(60));
        assert_eq!(limit_of(&resp), (tonic::Code::ResourceExhausted, "request-timeout".into()));
        assert_eq!(stats.header_list.load(Ordering::Relaxed), 1);
        assert_eq!(stats.request_timeout.load(Ordering::Relaxed), 1);
    }
}
