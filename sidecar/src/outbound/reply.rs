//! The caller's answer: the target side's answer with the route stamped on its headers
//! (serving instance, attempts, instances tried, fallback, `ar-route`), the reported load
//! read into the instance's stats, and a unary reply's serving instance appended to the
//! message.

use std::borrow::Cow;
use std::sync::Arc;

use agent_reach::model::Target;
use agent_reach::reason::{self, Reason};
use agent_reach_routing::{CallGuard, InstanceStats, Member, clock};
use http::{HeaderMap, HeaderValue, Response};
use tonic::Status;

use crate::call::{OutboundCall, Shape, push_target, target_text};
use crate::error::SidecarError;
use crate::grpc::{self, Body, Field, Frames, Hook, TrailersHook, header};
use crate::inbound::admission::parse_load;
use crate::telemetry::{CallOutcome, Routed, outcome_of};

/// The instance that answered an attempt, and how the call got there.
pub(crate) struct Served<'a> {
    pub call: &'a OutboundCall,
    pub member: &'a Member,
    pub attempts: u32,
    /// The instances tried before `member` (empty on a first attempt).
    pub tried: &'a [String],
    /// The target that was routed: the call's own, or its fallback.
    pub target: &'a Target,
    pub fallback_from: Option<&'a Target>,
    /// The strategy of the routed target's group, as the router resolved it.
    pub strategy: &'static str,
}

/// The caller's answer, or the failure it carries, each with how the call ended when an
/// agent answered (`None`: the answer could not be read).
pub(crate) enum Finished {
    Done(Routed),
    /// The agent (or the target's sidecar) answered with an error status.
    Failed {
        status: Status,
        answer: Routed,
    },
}

/// Reads the load reported in a streamed answer's trailers into the instance's stats, and
/// counts the call in flight at the instance until the answer ends.
struct Observed {
    _guard: CallGuard,
    stats: Arc<InstanceStats>,
}

impl TrailersHook for Observed {
    fn on_trailers(&self, trailers: &mut HeaderMap) {
        if let Some(load) = parse_load(trailers) {
            self.stats.report_load(load, clock());
        }
    }
}

/// Turns the target side's answer into the caller's answer: status-only answers and
/// streams pass through; a unary reply (read whole, up to `limit` bytes) gets the serving
/// instance appended. `hold` (a local admission slot) and `guard` last until the answer
/// ends. `answered_at` is when the answer's head arrived ([`clock`]).
pub(crate) async fn finish(
    answer: Response<Body>,
    hold: Option<Hook>,
    guard: CallGuard,
    served: &Served<'_>,
    limit: usize,
    answered_at: u64,
) -> Finished {
    let (mut parts, body) = answer.into_parts();
    let member = served.member;
    // The target's sidecar reports the load in the trailers, which are the headers of a
    // trailers-only answer or a whole one (both have their status in their headers).
    let code = grpc::status_code(&parts.headers);
    if code.is_some()
        && let Some(load) = parse_load(&parts.headers)
    {
        member.stats.report_load(load, answered_at);
    }
    // A whole answer (see `crate::hop`): its status and load are the caller's trailers
    // again, as gRPC has them; taken out before the route is stamped in their place.
    let whole = (code == Some(tonic::Code::Ok) && served.call.shape == Shape::Unary)
        .then(|| status_to_trailers(&mut parts.headers));
    let mut outcome = stamp(&mut parts.headers, served);
    if let Some(code) = code
        && code != tonic::Code::Ok
        && let Some(status) = Status::from_header_map(&parts.headers)
    {
        // Trailers-only: an error from the agent or the target's sidecar.
        outcome.outcome = outcome_of(&status).into();
        let resp = Response::from_parts(parts, Body::Empty);
        return Finished::Failed { status, answer: Routed { resp, outcome: Some(outcome) } };
    }
    if served.call.shape == Shape::Stream {
        let observed: Hook = Box::new(Observed { _guard: guard, stats: member.stats.clone() });
        let resp = Response::from_parts(parts, body.tap(hold, Some(observed)));
        return Finished::Done(Routed { resp, outcome: Some(outcome) });
    }
    let rec = &member.instance.record;
    let (data, trailers) = match grpc::read_whole(body, limit).await {
        Ok(read) => read,
        Err(e) => {
            let status = SidecarError::InstanceUnreachable {
                instance: rec.instance_id.clone(),
                cause: format!("reading its reply failed: {e}"),
            }
            .into_status();
            return Finished::Failed { answer: Routed::unrouted(grpc::status_response(status.clone())), status };
        }
    };
    drop((guard, hold));
    let trailers = match whole {
        // Its load was read with its status.
        Some(mut moved) => {
            if let Some(more) = trailers {
                moved.extend(more);
            }
            Some(moved)
        }
        None => {
            if let Some(load) = trailers.as_ref().and_then(parse_load) {
                member.stats.report_load(load, clock());
            }
            trailers
        }
    };
    if let Some(status) = trailers.as_ref().and_then(grpc::failed_status) {
        outcome.outcome = outcome_of(&status).into();
        let resp = Response::from_parts(parts, Body::Frames(Frames::raw(data).with_trailers(trailers)));
        return Finished::Failed { status, answer: Routed { resp, outcome: Some(outcome) } };
    }
    let Some(message) = grpc::single_message(&data) else {
        let status = reason::status(
            Reason::Internal,
            format!("the reply of {} is not a single uncompressed message", rec.instance_id),
            &[],
        );
        return Finished::Failed { answer: Routed::unrouted(grpc::status_response(status.clone())), status };
    };
    let reg = &rec.registration;
    let fallback_from = served.fallback_from.map(target_text).unwrap_or_default();
    // The `InvokeReply` fields the mesh adds, after the agent's.
    let fields = [
        (16, Field::text(&rec.instance_id)),
        (17, Field::text(&reg.agent)),
        (18, Field::text(&reg.version)),
        (19, Field::U32(served.attempts)),
        (20, Field::text(&fallback_from)),
    ];
    let resp =
        Response::from_parts(parts, Body::Frames(Frames::message_fields(message, &fields).with_trailers(trailers)));
    Finished::Done(Routed { resp, outcome: Some(outcome) })
}

/// Moves an answer's `grpc-status` and `ar-load` from its headers to trailers of their own.
fn status_to_trailers(headers: &mut HeaderMap) -> HeaderMap {
    // Room for both without growing (a map of capacity 2 grows at its second entry).
    let mut trailers = HeaderMap::with_capacity(3);
    for name in [grpc::HEADER_GRPC_STATUS, header::LOAD] {
        if let Some(value) = headers.remove(&name) {
            trailers.insert(name, value);
        }
    }
    trailers
}

/// Writes the route into the answer's headers; returns the call's outcome for telemetry.
fn stamp(h: &mut HeaderMap, served: &Served<'_>) -> CallOutcome {
    let rec = &served.member.instance.record;
    // The body is rebuilt (or re-framed), so the upstream length does not hold.
    h.remove(http::header::CONTENT_LENGTH);
    let instance = HeaderValue::from_str(&rec.instance_id).ok();
    // One attempt (the usual case): the instances tried are the one that served, whose
    // value is shared, not copied again.
    let tried = match (served.tried, &instance) {
        ([], Some(v)) => Some(v.clone()),
        (before, _) => tried_value(before, Some(&rec.instance_id)),
    };
    if let Some(v) = instance {
        h.insert(header::INSTANCE, v);
    }
    h.insert(header::ATTEMPTS, attempts_value(served.attempts));
    if let Some(v) = tried {
        h.insert(header::INSTANCES_TRIED, v);
    }
    if let Some(from) = served.fallback_from
        && let Ok(v) = HeaderValue::try_from(target_text(from))
    {
        h.insert(header::FALLBACK_FROM, v);
    }
    if let Ok(v) = HeaderValue::from_str(&rec.registration.version) {
        h.insert(header::AGENT_VERSION, v);
    }
    // `<strategy> <target> -> <instance> (attempt <n>)`, of the target that was routed (the
    // fallback's, when it served the call); joined by hand, not by `format!`, and handed
    // to the header without a copy.
    let strategy = served.strategy;
    let mut route = String::with_capacity(strategy.len() + served.target.name().len() + rec.instance_id.len() + 32);
    route.push_str(strategy);
    route.push(' ');
    push_target(&mut route, served.target);
    route.push_str(" -> ");
    route.push_str(&rec.instance_id);
    route.push_str(" (attempt ");
    route.push_str(grpc::decimal(served.attempts, &mut [0; 10]));
    route.push(')');
    if let Ok(v) = HeaderValue::try_from(route) {
        h.insert(header::ROUTE, v);
    }
    CallOutcome {
        outcome: Cow::Borrowed("OK"),
        served: served.member.instance.clone(),
        attempts: served.attempts,
        strategy,
        fallback: served.fallback_from.is_some(),
    }
}

/// DEADLINE_EXCEEDED for the caller, with the attempts made.
pub(crate) fn deadline_exceeded(call: &OutboundCall, attempts: u32, tried: Vec<String>) -> Response<Body> {
    tracing::debug!(after = ?call.started.elapsed(), "deadline exceeded");
    let status =
        SidecarError::DeadlineExceeded { deadline: call.timeout, attempts, tried: tried.clone() }.into_status();
    with_attempts(grpc::status_response(status), attempts, &tried)
}

/// Adds the attempts and instances tried to an answer's headers.
pub(crate) fn with_attempts(mut resp: Response<Body>, attempts: u32, tried: &[String]) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(header::ATTEMPTS, attempts_value(attempts));
    if let Some(v) = tried_value(tried, None) {
        h.insert(header::INSTANCES_TRIED, v);
    }
    resp
}

/// `ar-attempts`: a static value for the counts the router makes (at most
/// [`super::retry::MAX_ATTEMPTS`] per target, twice that with a fallback).
fn attempts_value(attempts: u32) -> HeaderValue {
    match attempts {
        0 => HeaderValue::from_static("0"),
        1 => HeaderValue::from_static("1"),
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        4 => HeaderValue::from_static("4"),
        5 => HeaderValue::from_static("5"),
        6 => HeaderValue::from_static("6"),
        n => HeaderValue::from(n),
    }
}

/// `ar-instances-tried`: the instances `tried`, then `last`, comma-separated. (An answer on
/// the first attempt does not come here: it shares its `ar-instance` value, see `stamp`.)
fn tried_value(tried: &[String], last: Option<&str>) -> Option<HeaderValue> {
    let ids: Vec<&str> = tried.iter().map(String::as_str).chain(last).collect();
    HeaderValue::try_from(ids.join(",")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_lists_read_as_before() {
        for n in [0, 1, 3, 6, 7, 10, 4_294_967_295] {
            assert_eq!(attempts_value(n), HeaderValue::from(n));
            assert_eq!(grpc::decimal(n, &mut [0; 10]), n.to_string());
        }
        let tried = |ids: &[&str], last| tried_value(&ids.iter().map(|s| s.to_string()).collect::<Vec<_>>(), last);
        assert_eq!(tried(&["a-1"], None), Some(HeaderValue::from_static("a-1")));
        assert_eq!(tried(&["a-1", "b-2"], None), Some(HeaderValue::from_static("a-1,b-2")));
        assert_eq!(tried(&[], None), Some(HeaderValue::from_static("")));
        // The instance that answered follows those tried before it.
        assert_eq!(tried(&[], Some("c-3")), Some(HeaderValue::from_static("c-3")));
        assert_eq!(tried(&["a-1"], Some("c-3")), Some(HeaderValue::from_static("a-1,c-3")));
        assert_eq!(tried(&["a-1", "b-2"], Some("c-3")), Some(HeaderValue::from_static("a-1,b-2,c-3")));
    }

    #[test]
    fn a_whole_answers_status_and_load_go_back_to_trailers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        headers.insert("ar-load", HeaderValue::from_static("0.250"));
        headers.insert("ar-instance", HeaderValue::from_static("i-1"));
        let trailers = status_to_trailers(&mut headers);
        let names = |m: &HeaderMap| m.keys().map(|n| n.as_str().to_string()).collect::<Vec<_>>();
        assert_eq!(names(&headers), ["content-type", "ar-instance"]);
        assert_eq!(names(&trailers), ["grpc-status", "ar-load"]);
        assert_eq!([&trailers["grpc-status"], &trailers["ar-load"]], ["0", "0.250"]);
        // Without a load, the status alone.
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        assert_eq!(names(&status_to_trailers(&mut headers)), ["grpc-status"]);
        assert!(headers.is_empty());
    }
}
