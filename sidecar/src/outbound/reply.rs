//! The caller's answer: the target side's answer with the route stamped on its headers
//! (serving instance, attempts, instances tried, fallback, `ar-route`), the reported load
//! read into the instance's stats, and a unary reply's serving instance appended to the
//! message.

use std::sync::Arc;

use agent_reach::model::Target;
use agent_reach::proto;
use agent_reach::reason::{self, Reason};
use agent_reach_routing::{CallGuard, InstanceStats, Member, clock, resolve};
use http::{HeaderMap, HeaderValue, Response};
use prost::Message;
use tonic::{Code, Status};

use crate::call::{OutboundCall, Shape};
use crate::error::SidecarError;
use crate::grpc::{self, Body, Frames, Hook, TrailersHook, header};
use crate::inbound::admission::parse_load;
use crate::telemetry::{CallOutcome, outcome_of};

/// The instance that answered an attempt, and how the call got there.
pub(crate) struct Served<'a> {
    pub call: &'a OutboundCall,
    pub member: &'a Member,
    pub attempts: u32,
    pub tried: &'a [String],
    /// The target that was routed: the call's own, or its fallback.
    pub target: &'a Target,
    pub fallback_from: Option<&'a Target>,
}

/// The caller's answer, or the failure it carries.
pub(crate) enum Finished {
    Done(Response<Body>),
    /// The agent (or the target's sidecar) answered with an error status.
    Failed {
        status: Status,
        resp: Response<Body>,
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
/// ends.
pub(crate) async fn finish(
    answer: Response<Body>,
    hold: Option<Hook>,
    guard: CallGuard,
    served: &Served<'_>,
    limit: usize,
) -> Finished {
    let (mut parts, body) = answer.into_parts();
    let mut outcome = stamp(&mut parts.headers, served);
    let member = served.member;
    if let Some(load) = parse_load(&parts.headers) {
        member.stats.report_load(load, clock());
    }
    if let Some(status) = Status::from_header_map(&parts.headers).filter(|s| s.code() != Code::Ok) {
        // Trailers-only: an error from the agent or the target's sidecar.
        outcome.outcome = outcome_of(&status);
        parts.extensions.insert(outcome);
        return Finished::Failed { status, resp: Response::from_parts(parts, Body::Empty) };
    }
    parts.extensions.insert(outcome.clone());
    if served.call.shape == Shape::Stream {
        let observed: Hook = Box::new(Observed { _guard: guard, stats: member.stats.clone() });
        return Finished::Done(Response::from_parts(parts, body.tap(hold, Some(observed))));
    }
    let rec = &member.instance.record;
    let collected = match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit)).await {
        Ok(c) => c,
        Err(e) => {
            let status = SidecarError::InstanceUnreachable {
                instance: rec.instance_id.clone(),
                cause: format!("reading its reply failed: {e}"),
            }
            .into_status();
            return Finished::Failed { resp: grpc::status_response(status.clone()), status };
        }
    };
    drop((guard, hold));
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    if let Some(load) = trailers.as_ref().and_then(parse_load) {
        member.stats.report_load(load, clock());
    }
    let status = trailers.as_ref().and_then(Status::from_header_map);
    if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
        outcome.outcome = outcome_of(&status);
        parts.extensions.insert(outcome);
        let resp = Response::from_parts(parts, Body::Frames(Frames::raw(data).with_trailers(trailers)));
        return Finished::Failed { status, resp };
    }
    let Some(message) = grpc::single_message(&data) else {
        let status = reason::status(
            Reason::Internal,
            format!("the reply of {} is not a single uncompressed message", rec.instance_id),
            &[],
        );
        return Finished::Failed { resp: grpc::status_response(status.clone()), status };
    };
    let reg = &rec.registration;
    let extension = proto::InvokeReply {
        instance_id: rec.instance_id.clone(),
        agent: reg.agent.clone(),
        agent_version: reg.version.clone(),
        attempts: served.attempts,
        fallback_from: served.fallback_from.map(Target::to_string).unwrap_or_default(),
        ..Default::default()
    }
    .encode_to_vec();
    Finished::Done(Response::from_parts(
        parts,
        Body::Frames(Frames::message(message, &extension).with_trailers(trailers)),
    ))
}

/// Writes the route into the answer's headers; returns the call's outcome for telemetry.
fn stamp(h: &mut HeaderMap, served: &Served<'_>) -> CallOutcome {
    let (call, rec) = (served.call, &served.member.instance.record);
    // The body is rebuilt (or re-framed), so the upstream length does not hold.
    h.remove(http::header::CONTENT_LENGTH);
    if let Ok(v) = HeaderValue::from_str(&rec.instance_id) {
        h.insert(header::INSTANCE, v);
    }
    h.insert(header::ATTEMPTS, HeaderValue::from(served.attempts));
    if let Ok(v) = HeaderValue::from_str(&served.tried.join(",")) {
        h.insert(header::INSTANCES_TRIED, v);
    }
    if let Some(from) = served.fallback_from
        && let Ok(v) = HeaderValue::from_str(&from.to_string())
    {
        h.insert(header::FALLBACK_FROM, v);
    }
    if let Ok(v) = HeaderValue::from_str(&rec.registration.version) {
        h.insert(header::AGENT_VERSION, v);
    }
    // The group of the target that was routed (the fallback's, when it served the call),
    // looked up by agent or by capability as the router did.
    let strategy = resolve(&call.table, served.target).map(|g| g.strategy().as_str()).unwrap_or("least_loaded");
    let route = format!("{strategy} {} -> {} (attempt {})", served.target, rec.instance_id, served.attempts);
    if let Ok(v) = HeaderValue::from_str(&route) {
        h.insert(header::ROUTE, v);
    }
    CallOutcome {
        outcome: "OK".into(),
        instance: rec.instance_id.clone(),
        agent: rec.registration.agent.clone(),
        agent_version: rec.registration.version.clone(),
        attempts: served.attempts,
        strategy,
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
    h.insert(header::ATTEMPTS, HeaderValue::from(attempts));
    if let Ok(v) = HeaderValue::from_str(&tried.join(",")) {
        h.insert(header::INSTANCES_TRIED, v);
    }
    resp
}
