//! `agent-reach trace <trace-id>`: the recent hops of one trace, gathered from the
//! in-memory span buffers of the sidecars' admin ports — for setups without a tracing
//! backend. Prints the spans as a tree (or JSON with `--output json`).

use std::collections::BTreeMap;

use agent_reach_telemetry::SpanRecord;

/// GETs `/traces/{id}` from an admin address ("host:port" or "http://host:port").
async fn fetch(admin: &str, trace_id: &str) -> Result<Vec<SpanRecord>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = admin.trim_start_matches("http://").trim_end_matches('/');
    let mut tcp = tokio::net::TcpStream::connect(authority).await.map_err(|e| format!("{admin}: {e}"))?;
    let request = format!("GET /traces/{trace_id} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.map_err(|e| format!("{admin}: {e}"))?;
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.map_err(|e| format!("{admin}: {e}"))?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{admin}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{admin}: {}", head.lines().next().unwrap_or_default()));
    }
    serde_json::from_str(body).map_err(|e| format!("{admin}: {e}"))
}

/// Gathers and prints the spans of `trace_id` from every admin address.
pub async fn run(trace_id: &str, admins: &[String], json: bool) -> Result<(), String> {
    if trace_id.len() != 32 || !trace_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{trace_id:?} is not a trace id (32 hex digits, as in traceparent)"));
    }
    let mut spans = Vec::new();
    for admin in admins {
        match fetch(admin, &trace_id.to_ascii_lowercase()).await {
            Ok(s) => spans.extend(s),
            Err(e) => eprintln!("agent-reach: skipping {e}"),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&spans).map_err(|e| e.to_string())?);
        return Ok(());
    }
    if spans.is_empty() {
        return Err(format!("no span of trace {trace_id} in the recent buffers of {}", admins.join(", ")));
    }
    spans.sort_by_key(|s| s.start_unix_us);
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&SpanRecord>> = BTreeMap::new();
    let mut roots = Vec::new();
    for s in &spans {
        if s.parent_span_id.is_empty() || !ids.contains(s.parent_span_id.as_str()) {
            roots.push(s);
        } else {
            children.entry(s.parent_span_id.as_str()).or_default().push(s);
        }
    }
    let start = spans.first().map(|s| s.start_unix_us).unwrap_or_default();
    println!("trace {trace_id}: {} span(s)", spans.len());
    fn print(s: &SpanRecord, depth: usize, start: u64, children: &BTreeMap<&str, Vec<&SpanRecord>>) {
        let pick = |k: &str| s.attributes.get(k).map(String::as_str).unwrap_or("");
        let detail = [
            ("instance", pick("agent_reach.instance")),
            ("attempt", pick("agent_reach.attempt")),
            ("outcome", pick("agent_reach.outcome")),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
        println!(
            "{:indent$}{} [{}] +{:.3} ms {:.3} ms  {}  {}",
            "",
            s.name,
            s.service,
            (s.start_unix_us.saturating_sub(start)) as f64 / 1000.0,
            s.duration_us as f64 / 1000.0,
            detail,
            if s.status.starts_with("error") { s.status.as_str() } else { "" },
            indent = depth * 2
        );
        for c in children.get(s.span_id.as_str()).into_iter().flatten() {
            print(c, depth + 1, start, children);
        }
    }
    for r in roots {
        print(r, 0, start, &children);
    }
    Ok(())
}
