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

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Link, SpanKind, TraceId, TracerProvider};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider, ShouldSample, SpanData, SpanProcessor,
};
use serde::{Deserialize, Serialize};

/// Span attribute that makes the sampler record a root span (and so its whole chain).
pub const FORCE_ATTRIBUTE: &str = "agent_reach.force_trace";

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

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

/// The trace context a request carries (`traceparent`, `tracestate`), if any.
pub fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `cx`'s span as the `traceparent` (and `tracestate`) of a request.
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
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
}
