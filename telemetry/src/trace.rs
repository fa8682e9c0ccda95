//! Spans per hop, with W3C trace context (`traceparent`, `tracestate`) in gRPC metadata.
//!
//! [`Tracing`] owns one tracer provider per process part (each sidecar or control service
//! in a process has its own, with its own service name). Sampling is parent-based: a call
//! that arrives with a sampled `traceparent` is recorded at every hop; a root call is
//! recorded with the configured ratio, or always when its entry hop forces it (the span
//! attribute [`FORCE_ATTRIBUTE`]). Recorded spans are exported over OTLP/gRPC when an
//! endpoint is configured, and the most recent ones are kept in memory ([`RecentSpans`])
//! for `/traces/{id}` on the admin port.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider, ShouldSample, SpanData, SpanProcessor,
};
use serde::{Deserialize, Serialize};

/// Span attribute that makes the sampler record a root span (and so its whole chain).
pub const FORCE_ATTRIBUTE: &str = "agent_reach.force_trace";

/// The name a span starts with in [`Tracing::start_span`], replaced when it is recorded.
const UNNAMED: &str = "agent-reach";

/// How spans are sampled and where they go.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// `service.name` of the spans ("agent-reach-sidecar", "agent-reach-control").
    pub service_name: String,
    /// `service.instance.id` (the sidecar id).
    pub service_instance: String,
    /// OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`; none = no export.
    pub otlp_endpoint: Option<String>,
    /// Share of root calls recorded (0.0..=1.0); calls with a sampled parent always are.
    pub sample_ratio: f64,
    /// Spans kept in memory for `/traces/{id}`.
    pub recent_spans: usize,
}

/// Samples roots by ratio, or always when forced by [`FORCE_ATTRIBUTE`].
#[derive(Clone, Debug)]
struct ForceOrRatio {
    ratio: Sampler,
}

impl ShouldSample for ForceOrRatio {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        if attributes.iter().any(|kv| kv.key.as_str() == FORCE_ATTRIBUTE && kv.value == Value::Bool(true)) {
            return SamplingResult {
                decision: SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: Default::default(),
            };
        }
        self.ratio.should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

/// A finished span as the admin port shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpanRecord {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub kind: String,
    pub service: String,
    pub start_unix_us: u64,
    pub duration_us: u64,
    pub status: String,
    pub attributes: BTreeMap<String, String>,
}

/// The most recent recorded spans, newest last.
#[derive(Clone, Debug, Default)]
pub struct RecentSpans {
    spans: Arc<Mutex<VecDeque<SpanRecord>>>,
    capacity: usize,
}

impl RecentSpans {
    pub fn new(capacity: usize) -> RecentSpans {
        RecentSpans { spans: Arc::default(), capacity }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<SpanRecord>> {
        // Poisoning only means a panic elsewhere; the buffer stays usable.
        self.spans.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, span: SpanRecord) {
        if self.capacity == 0 {
            return;
        }
        let mut spans = self.lock();
        if spans.len() >= self.capacity {
            spans.pop_front();
        }
        spans.push_back(span);
    }

    /// The spans of one trace (hex trace id), oldest first.
    pub fn trace(&self, trace_id: &str) -> Vec<SpanRecord> {
        self.lock().iter().filter(|s| s.trace_id == trace_id).cloned().collect()
    }

    /// The newest `n` spans, oldest first.
    pub fn newest(&self, n: usize) -> Vec<SpanRecord> {
        let spans = self.lock();
        spans.iter().skip(spans.len().saturating_sub(n)).cloned().collect()
    }

    /// Trace ids present, newest first, each once.
    pub fn trace_ids(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.lock().iter().rev() {
            if !out.contains(&s.trace_id) {
                out.push(s.trace_id.clone());
            }
        }
        out
    }
}

/// Feeds [`RecentSpans`].
#[derive(Debug)]
struct RecentProcessor {
    recent: RecentSpans,
    service: String,
}

impl SpanProcessor for RecentProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let start = span.start_time.duration_since(UNIX_EPOCH).unwrap_or_default();
        let duration = span.end_time.duration_since(span.start_time).unwrap_or_default();
        let parent = span.parent_span_id;
        self.recent.push(SpanRecord {
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_span_id: if parent == opentelemetry::trace::SpanId::INVALID {
                String::new()
            } else {
                parent.to_string()
            },
            name: span.name.to_string(),
            kind: format!("{:?}", span.span_kind).to_lowercase(),
            service: self.service.clone(),
            start_unix_us: start.as_micros() as u64,
            duration_us: duration.as_micros() as u64,
            status: match span.status {
                opentelemetry::trace::Status::Error { description } => format!("error: {description}"),
                opentelemetry::trace::Status::Ok => "ok".into(),
                opentelemetry::trace::Status::Unset => "unset".into(),
            },
            attributes: span.attributes.iter().map(|kv| (kv.key.to_string(), kv.value.to_string())).collect(),
        });
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// A tracer and where its spans go. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    recent: RecentSpans,
}

impl Tracing {
    /// Sets up sampling and export. With an OTLP endpoint this must run inside a tokio
    /// runtime (the exporter's gRPC client lives on it).
    pub fn new(config: &TraceConfig) -> Result<Tracing, String> {
        let recent = RecentSpans::new(config.recent_spans);
        let ratio = if config.sample_ratio.is_finite() { config.sample_ratio.clamp(0.0, 1.0) } else { 0.0 };
        let sampler = Sampler::ParentBased(Box::new(ForceOrRatio { ratio: Sampler::TraceIdRatioBased(ratio) }));
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", config.service_instance.clone()))
            .build();
        let mut builder = SdkTracerProvider::builder()
            .with_sampler(sampler)
            .with_resource(resource)
            .with_span_processor(RecentProcessor { recent: recent.clone(), service: config.service_instance.clone() });
        if let Some(endpoint) = &config.otlp_endpoint {
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .with_timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
            builder = builder.with_batch_exporter(exporter);
        }
        let provider = builder.build();
        let tracer = provider.tracer("agent-reach");
        Ok(Tracing { provider, tracer, recent })
    }

    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Starts a span of `kind` under `parent`, building its name and attributes only when
    /// the sampler records it. The sampler decides on the parent's flag, or for a root on
    /// the trace id and [`FORCE_ATTRIBUTE`] (given by `forced`, and kept on the span), never
    /// on the name or the other attributes; so a span that is not recorded (most calls, at
    /// the default ratio) costs no formatted name and no attribute list thrown away.
    pub fn start_span(
        &self,
        parent: &Context,
        kind: SpanKind,
        forced: bool,
        name: impl FnOnce() -> String,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> opentelemetry_sdk::trace::Span {
        use opentelemetry::trace::{Span as _, Tracer as _};
        let mut builder = self.tracer.span_builder(UNNAMED).with_kind(kind);
        if forced {
            builder = builder.with_attributes([KeyValue::new(FORCE_ATTRIBUTE, true)]);
        }
        let mut span = builder.start_with_context(&self.tracer, parent);
        if span.is_recording() {
            span.update_name(name());
            span.set_attributes(attributes());
        }
        span
    }

    pub fn recent(&self) -> &RecentSpans {
        &self.recent
    }

    /// Exports what is pending (tests and shutdown).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Flushes and stops export.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The W3C trace context header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
/// `00-` + 32 hex digits + `-` + 16 hex digits + `-` + 2 hex digits.
const TRACEPARENT_LEN: usize = 55;

/// The trace context a request carries (`traceparent`, `tracestate`), if any: what
/// `TraceContextPropagator::extract` gives, without its per-call parsing of header names
/// and splitting into a vector for the one form a sidecar sends (version 00, lowercase);
/// any other value is read by the propagator itself.
pub fn extract(headers: &http::HeaderMap) -> Context {
    let Some(value) = headers.get(TRACEPARENT) else {
        // No traceparent: the propagator finds no span context either.
        return Context::current();
    };
    match parse_traceparent(value.as_bytes()) {
        Some((trace_id, span_id, flags)) => {
            let state = headers
                .get(TRACESTATE)
                .and_then(|v| v.to_str().ok())
                .map(|s| s.parse::<TraceState>().unwrap_or_default())
                .unwrap_or_default();
            let sc = SpanContext::new(trace_id, span_id, flags, true, state);
            Context::current().with_remote_span_context(sc)
        }
        None => TraceContextPropagator::new().extract(&HeaderExtractor(headers)),
    }
}

/// A version-00 `traceparent` in lowercase hex with nonzero ids (the only flag kept is
/// sampled, as the propagator keeps); `None` for anything else.
fn parse_traceparent(v: &[u8]) -> Option<(TraceId, SpanId, TraceFlags)> {
    if v.len() != TRACEPARENT_LEN || &v[..3] != b"00-" || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    /// Up to 16 lowercase hex digits by a table, the check made once at the end (a
    /// branch per digit and `u128` shifts cost twice as much, on every mesh call).
    fn hex(digits: &[u8]) -> Option<u64> {
        const NOT_HEX: u8 = 0x10;
        const NIBBLE: [u8; 256] = {
            let mut t = [NOT_HEX; 256];
            let mut i = 0;
            while i < 10 {
                t[b'0' as usize + i] = i as u8;
                i += 1;
            }
            let mut i = 0;
            while i < 6 {
                t[b'a' as usize + i] = 10 + i as u8;
                i += 1;
            }
            t
        };
        let (mut acc, mut seen) = (0u64, 0u8);
        for &d in digits {
            let n = NIBBLE[usize::from(d)];
            seen |= n;
            acc = acc << 4 | u64::from(n & 0xf);
        }
        (seen & NOT_HEX == 0).then_some(acc)
    }
    let trace_id = TraceId::from(u128::from(hex(&v[3..19])?) << 64 | u128::from(hex(&v[19..35])?));
    let span_id = SpanId::from(hex(&v[36..52])?);
    let flags = TraceFlags::new(hex(&v[53..55])? as u8) & TraceFlags::SAMPLED;
    (trace_id != TraceId::INVALID && span_id != SpanId::INVALID).then_some((trace_id, span_id, flags))
}

/// Writes `cx`'s span as the `traceparent` and `tracestate` of a request, as
/// `TraceContextPropagator::inject_context` does (nothing for an invalid span context),
/// except that an empty `tracestate` is left out (as OpenTelemetry's Go and Java
/// propagators do): a header with no value would cost both ends of every hop an HPACK
/// entry and a map insert. `traceparent` is marked never-indexed: a value new on every
/// call would only churn the HPACK tables of both ends (each encode walking the entries of
/// the previous calls' values, each decode inserting one).
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return;
    }
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; TRACEPARENT_LEN];
    out[..3].copy_from_slice(b"00-");
    let mut put = |at: usize, bytes: &[u8]| {
        for (i, b) in bytes.iter().enumerate() {
            out[at + 2 * i] = DIGITS[usize::from(b >> 4)];
            out[at + 2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
    };
    put(3, &sc.trace_id().to_bytes());
    put(36, &sc.span_id().to_bytes());
    put(53, &[(sc.trace_flags() & TraceFlags::SAMPLED).to_u8()]);
    out[35] = b'-';
    out[52] = b'-';
    if let Ok(mut v) = http::HeaderValue::from_bytes(&out) {
        v.set_sensitive(true);
        headers.insert(TRACEPARENT, v);
    }
    let state = sc.trace_state().header();
    if !state.is_empty()
        && let Ok(v) = http::HeaderValue::from_str(&state)
    {
        headers.insert(TRACESTATE, v);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Span, TraceContextExt, Tracer};

    use super::*;

    fn config(ratio: f64) -> TraceConfig {
        TraceConfig {
            service_name: "test".into(),
            service_instance: "t-1".into(),
            otlp_endpoint: None,
            sample_ratio: ratio,
            recent_spans: 100,
        }
    }

    #[test]
    fn context_round_trips_through_headers() {
        let tracing = Tracing::new(&config(1.0)).unwrap();
        let span = tracing.tracer().start("root");
        let cx = Context::current_with_span(span);
        let mut headers = http::HeaderMap::new();
        inject(&cx, &mut headers);
        let tp = headers["traceparent"].to_str().unwrap().to_string();
        assert!(tp.starts_with("00-") && tp.ends_with("-01"), "{tp}");
        let back = extract(&headers);
        assert_eq!(back.span().span_context().trace_id(), cx.span().span_context().trace_id());
        assert!(back.span().span_context().is_remote());
    }

    /// Headers as the SDK's propagator writes them.
    struct SdkInjected(http::HeaderMap);

    impl opentelemetry::propagation::Injector for SdkInjected {
        fn set(&mut self, key: &str, value: String) {
            let name = http::HeaderName::from_bytes(key.as_bytes()).unwrap();
            self.0.insert(name, http::HeaderValue::from_str(&value).unwrap());
        }
    }

    #[test]
    fn extract_reads_what_the_propagator_reads() {
        let parents = [
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
            // Unknown flags are dropped.
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03"),
            // Refused: uppercase, zero ids, bad digits, an unknown version.
            Some("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"),
            Some("00-00000000000000000000000000000000-b7ad6b7169203331-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g"),
            // The bytes on either side of the digit ranges, in each field.
            Some("00-0af7651916cd43dd8448eb211c80319:-b7ad6b7169203331-01"),
            Some("00-/af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333`-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0G"),
            Some("00-0af7651916cd43ddg448eb211c80319c-b7ad6b7169203331-01"),
            Some("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            // Read by the propagator itself: a later version, surrounding space, a short id.
            Some("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra"),
            Some(" 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01"),
            Some("garbage"),
            None,
        ];
        let mut valid = 0;
        for parent in parents {
            for state in [None, Some("a=1,b=2"), Some("not valid=")] {
                let mut headers = http::HeaderMap::new();
                if let Some(p) = parent {
                    headers.insert("traceparent", http::HeaderValue::from_str(p).unwrap());
                }
                if let Some(s) = state {
                    headers.insert("tracestate", http::HeaderValue::from_str(s).unwrap());
                }
                let ours = extract(&headers);
                let sdk = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
                assert_eq!(ours.span().span_context(), sdk.span().span_context(), "{parent:?} {state:?}");
                valid += usize::from(ours.span().span_context().is_valid());
            }
        }
        assert_eq!(valid, 6 * 3, "the three version-00 parents and the three the propagator reads");
        let flags = |tp: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("traceparent", http::HeaderValue::from_str(tp).unwrap());
            extract(&h).span().span_context().trace_flags()
        };
        assert_eq!(flags("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03"), TraceFlags::SAMPLED);
    }

    #[test]
    fn inject_writes_what_the_propagator_writes_with_traceparent_never_indexed_and_no_empty_tracestate() {
        let state: TraceState = "a=1,b=2".parse().unwrap();
        let contexts = [
            SpanContext::new(
                TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c),
                SpanId::from(0xb7ad_6b71_6920_3331),
                TraceFlags::SAMPLED,
                false,
                state,
            ),
            SpanContext::new(
                TraceId::from(1),
                SpanId::from(u64::MAX),
                TraceFlags::default(),
                true,
                TraceState::default(),
            ),
            SpanContext::empty_context(),
        ];
        for sc in contexts {
            let cx = Context::new().with_remote_span_context(sc.clone());
            let mut ours = http::HeaderMap::new();
            inject(&cx, &mut ours);
            let mut sdk = SdkInjected(http::HeaderMap::new());
            TraceContextPropagator::new().inject_context(&cx, &mut sdk);
            if sdk.0.get("tracestate").is_some_and(|v| v.is_empty()) {
                sdk.0.remove("tracestate");
            }
            assert_eq!(ours, sdk.0, "{sc:?}");
            let expected = match (sc.is_valid(), sc.trace_state().header().is_empty()) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => 2,
            };
            assert_eq!(ours.len(), expected, "{sc:?}");
            assert!(ours.get("traceparent").is_none_or(http::HeaderValue::is_sensitive));
        }
    }

    #[test]
    fn ratio_zero_records_only_forced_or_sampled_parents() {
        let tracing = Tracing::new(&config(0.0)).unwrap();
        let mut plain = tracing.tracer().start("plain");
        assert!(!plain.is_recording());
        plain.end();
        let forced = tracing
            .tracer()
            .span_builder("forced")
            .with_attributes([KeyValue::new(FORCE_ATTRIBUTE, true)])
            .start(tracing.tracer());
        assert!(forced.is_recording());
        let cx = Context::current_with_span(forced);
        let mut child = tracing.tracer().start_with_context("child", &cx);
        assert!(child.is_recording(), "a sampled parent's children are recorded");
        child.end();
        cx.span().end();
        let trace_id = cx.span().span_context().trace_id().to_string();
        let spans = tracing.recent().trace(&trace_id);
        assert_eq!(spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["child", "forced"]);
        assert_eq!(spans[0].parent_span_id, spans[1].span_id);
        assert_eq!(tracing.recent().trace_ids(), [trace_id]);
    }

    #[test]
    fn start_span_builds_name_and_attributes_only_for_recorded_spans() {
        use std::cell::Cell;
        let tracing = Tracing::new(&config(0.0)).unwrap();
        let built = Cell::new(0);
        let name = || {
            built.set(built.get() + 1);
            "invoke x".to_string()
        };
        let attrs = || {
            built.set(built.get() + 1);
            vec![KeyValue::new("agent_reach.target", "x")]
        };
        // Ratio 0, not forced: dropped, and nothing was built for it.
        let mut dropped = tracing.start_span(&Context::new(), SpanKind::Server, false, name, attrs);
        assert!(!dropped.is_recording());
        assert!(dropped.span_context().is_valid(), "a dropped span still has a context to propagate");
        dropped.end();
        assert_eq!(built.get(), 0);
        // Forced root: recorded, with its name, attributes and the force attribute.
        let forced = tracing.start_span(&Context::new(), SpanKind::Server, true, name, attrs);
        assert!(forced.is_recording());
        let cx = Context::new().with_span(forced);
        // A child of a recorded parent is recorded; of a dropped one, not.
        let mut child = tracing.start_span(&cx, SpanKind::Client, false, || "attempt x".into(), Vec::new);
        assert!(child.is_recording());
        child.end();
        let dropped_cx = Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(7),
            SpanId::from(7),
            TraceFlags::default(),
            true,
            TraceState::default(),
        ));
        let unsampled = tracing.start_span(&dropped_cx, SpanKind::Server, false, name, attrs);
        assert!(!unsampled.is_recording());
        assert_eq!(unsampled.span_context().trace_id(), TraceId::from(7));
        cx.span().end();
        assert_eq!(built.get(), 2, "the forced root's name and attributes only");
        let spans = tracing.recent().trace(&cx.span().span_context().trace_id().to_string());
        assert_eq!(spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["attempt x", "invoke x"]);
        let root = &spans[1].attributes;
        assert_eq!(root.get("agent_reach.target").map(String::as_str), Some("x"));
        assert_eq!(root.get(FORCE_ATTRIBUTE).map(String::as_str), Some("true"));
        assert_eq!(spans[1].kind, "server");
    }
}
