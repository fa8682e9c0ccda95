//! The call's session delivered with the call: before a gRPC agent gets a `HandleRequest`,
//! its top-level fields are scanned (no payload copy) for the session id (field 4) and for
//! a `session` (field 20) the caller put in its own message, which is dropped: only this
//! sidecar's snapshot may reach the agent. When the call is of this sidecar's tenant and the
//! session cache holds the session ([`SessionCache::snapshot`]), the snapshot is appended
//! as field 20 (protobuf merges concatenated messages) under a fresh length prefix. The
//! same scan finds the `tenant` (field 19) the caller's sidecar wrote, which must be the
//! tenant the caller was verified as ([`Scanned::check_tenant`]).

use std::sync::Arc;

use agent_reach::proto;
use bytes::{Bytes, BytesMut};
use prost::Message;

use crate::error::DeliveryError;
use crate::grpc::PREFIX_LEN;
use crate::session::SessionCache;

/// `HandleRequest.session_id`, `HandleRequest.tenant` and `HandleRequest.session`.
const FIELD_SESSION_ID: u64 = 4;
const FIELD_TENANT: u64 = 19;
const FIELD_SESSION: u64 = 20;

/// What delivers sessions with calls.
#[derive(Clone)]
pub(crate) struct Snapshots {
    pub sessions: Arc<SessionCache>,
    /// The sidecar's tenant: only its calls get its sessions.
    pub tenant: Arc<str>,
    /// The largest session attached (encoded bytes); 0: none.
    pub max_bytes: usize,
}

impl Snapshots {
    pub(crate) fn new(sessions: Arc<SessionCache>, config: &crate::config::SidecarConfig) -> Snapshots {
        Snapshots { sessions, tenant: config.tenant.as_str().into(), max_bytes: config.session_snapshot_max_bytes }
    }
}

/// A message's bytes read by position: one buffer (the usual case: a small message crosses
/// the mesh in one DATA frame) or a message spread over a few ([`Parts`]). The scan is
/// written once for both; on one buffer each byte is a bounds check, not a walk over the
/// buffers.
trait Bytewise {
    fn len(&self) -> usize;

    fn byte(&self, at: usize) -> Option<u8>;

    /// Bytes `range` copied into one buffer.
    fn copy(&self, range: std::ops::Range<usize>) -> Vec<u8>;

    fn varint(&self, at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte(*at)?;
            *at += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
}

impl Bytewise for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.get(at).copied()
    }

    fn copy(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        self.get(range).map(<[u8]>::to_vec).unwrap_or_default()
    }
}

/// The message's bytes spread over a few buffers, read by position.
struct Parts<'a>(&'a [Bytes]);

impl Bytewise for Parts<'_> {
    fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    fn byte(&self, mut at: usize) -> Option<u8> {
        for part in self.0 {
            if at < part.len() {
                return Some(part[at]);
            }
            at -= part.len();
        }
        None
    }

    fn copy(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(range.len());
        let mut start = 0;
        for part in self.0 {
            let (lo, hi) = (range.start.max(start), range.end.min(start + part.len()));
            if lo < hi {
                out.extend_from_slice(&part[lo - start..hi - start]);
            }
            start += part.len();
        }
        out
    }
}

impl Parts<'_> {
    /// Whether the bytes of `range` are `expected` (no copy).
    fn equals(&self, range: std::ops::Range<usize>, expected: &[u8]) -> bool {
        range.len() == expected.len() && range.zip(expected).all(|(at, b)| self.byte(at) == Some(*b))
    }

    /// The bytes from `from` on, as slices of the buffers (no copy).
    fn tail(&self, mut from: usize) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(self.0.len());
        for part in self.0 {
            if from >= part.len() {
                from -= part.len();
                continue;
            }
            out.push(part.slice(from..));
            from = 0;
        }
        out
    }
}

/// The top-level fields that matter here of one uncompressed gRPC message.
#[derive(Debug, Default, PartialEq)]
struct Scan {
    /// The last `session_id` (the one a decoder keeps).
    session_id: String,
    /// Where the last `tenant`'s bytes are (the one a decoder keeps), if the message has one.
    tenant: Option<std::ops::Range<usize>>,
    /// Where the message's own `session` fields are (whole fields, key included).
    forged: Vec<std::ops::Range<usize>>,
}

/// `None` when the data is not one uncompressed, well-formed message (passed on unchanged:
/// the agent refuses what does not decode).
fn scan<B: Bytewise + ?Sized>(parts: &B) -> Option<Scan> {
    let total = parts.len();
    if total < PREFIX_LEN || parts.byte(0)? != 0 {
        return None;
    }
    let len = u32::from_be_bytes([parts.byte(1)?, parts.byte(2)?, parts.byte(3)?, parts.byte(4)?]) as usize;
    if PREFIX_LEN + len != total {
        return None;
    }
    let mut scan = Scan::default();
    let mut at = PREFIX_LEN;
    while at < total {
        let start = at;
        let key = parts.varint(&mut at)?;
        let (field, wire_type) = (key >> 3, key & 7);
        let end = match wire_type {
            0 => {
                parts.varint(&mut at)?;
                at
            }
            1 => at + 8,
            2 => {
                let n = usize::try_from(parts.varint(&mut at)?).ok()?;
                at.checked_add(n)?
            }
            5 => at + 4,
            _ => return None,
        };
        if end > total {
            return None;
        }
        if wire_type == 2 && field == FIELD_SESSION_ID {
            scan.session_id = String::from_utf8(parts.copy(at..end)).ok()?;
        } else if wire_type == 2 && field == FIELD_TENANT {
            scan.tenant = Some(at..end);
        } else if field == FIELD_SESSION {
            scan.forged.push(start..end);
        }
        at = end;
    }
    Some(scan)
}

/// A call's message (prefix included), its top-level fields scanned once.
pub(crate) struct Scanned {
    data: Vec<Bytes>,
    /// `None` when the data is not one uncompressed, well-formed message.
    scan: Option<Scan>,
}

impl Scanned {
    pub(crate) fn new(data: Vec<Bytes>) -> Scanned {
        let scan = match data.as_slice() {
            [one] => scan(&one[..]),
            several => scan(&Parts(several)),
        };
        Scanned { data, scan }
    }

    /// Refuses the call when its `tenant` field names another tenant than `verified`, the
    /// one its caller was verified as ([`super::check_tenant_field`]).
    pub(crate) fn check_tenant(&self, verified: &str) -> Result<(), DeliveryError> {
        let Some(range) = self.scan.as_ref().and_then(|s| s.tenant.clone()) else { return Ok(()) };
        let parts = Parts(&self.data);
        // The usual case, compared in place; any other value is copied and judged by the rule.
        if parts.equals(range.clone(), verified.as_bytes()) {
            return Ok(());
        }
        super::check_tenant_field(&String::from_utf8_lossy(&parts.copy(range)), verified)
    }

    /// The message as it came.
    pub(crate) fn into_data(self) -> Vec<Bytes> {
        self.data
    }
}

impl Snapshots {
    /// The call's message (`data`, prefix included) as the agent gets it: without a
    /// `session` of the caller's, with this sidecar's snapshot of its session when there is
    /// one. `tenant` is the caller's.
    pub(crate) fn attach(&self, scanned: Scanned, tenant: &str) -> Vec<Bytes> {
        let Scanned { data, scan } = scanned;
        let parts = Parts(&data);
        let Some(scan) = scan else { return data };
        let snapshot = (tenant == &*self.tenant && !scan.session_id.is_empty())
            .then(|| self.sessions.snapshot(&scan.session_id, self.max_bytes))
            .flatten();
        if snapshot.is_none() && scan.forged.is_empty() {
            return data;
        }
        let extension = snapshot
            .map(|s| proto::HandleRequest { session: Some(s), ..Default::default() }.encode_to_vec())
            .unwrap_or_default();
        let mut body: Vec<Bytes> = if scan.forged.is_empty() {
            parts.tail(PREFIX_LEN)
        } else {
            let mut kept = BytesMut::with_capacity(parts.len());
            let mut at = PREFIX_LEN;
            for range in &scan.forged {
                kept.extend_from_slice(&parts.copy(at..range.start));
                at = range.end;
            }
            kept.extend_from_slice(&parts.copy(at..parts.len()));
            vec![kept.freeze()]
        };
        let len = body.iter().map(Bytes::len).sum::<usize>() + extension.len();
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[1..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        body.insert(0, Bytes::copy_from_slice(&prefix));
        if !extension.is_empty() {
            body.push(extension.into());
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Bytes {
        let mut out = vec![0u8];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out.into()
    }

    fn split(data: &Bytes, at: &[usize]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut from = 0;
        for &to in at {
            out.push(data.slice(from..to));
            from = to;
        }
        out.push(data.slice(from..));
        out
    }

    #[test]
    fn finds_the_session_id_and_a_callers_own_session_across_buffers() {
        let forged = proto::HandleRequest {
            session: Some(proto::DeliveredSession { session_id: "s-1".into(), version: 99, ..Default::default() }),
            ..Default::default()
        }
        .encode_to_vec();
        let mut message = proto::HandleRequest {
            payload: Bytes::from(vec![7u8; 300]),
            session_id: "first".into(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        }
        .encode_to_vec();
        let forged_at = message.len() + PREFIX_LEN;
        message.extend_from_slice(&forged);
        message.extend_from_slice(
            &proto::HandleRequest { session_id: "s-1".into(), ..Default::default() }.encode_to_vec(),
        );
        let data = framed(&message);
        let whole = scan(&data[..]).unwrap();
        assert_eq!(whole.session_id, "s-1");
        assert_eq!(whole.forged, vec![forged_at..forged_at + forged.len()]);
        for cuts in [vec![], vec![3], vec![5, 200], vec![1, 2]] {
            let parts = split(&data, &cuts);
            assert_eq!(scan(&Parts(&parts)).as_ref(), Some(&whole), "cut at {cuts:?}");
        }
        // Not one uncompressed message: left alone, from one buffer or several.
        let mut compressed = data.to_vec();
        compressed[0] = 1;
        let short = data.slice(..data.len() - 1);
        let wire_type_7 = framed(&[0x0f, 1]);
        for bad in [&Bytes::from(compressed), &short, &wire_type_7] {
            assert_eq!(scan(&bad[..]), None);
            assert_eq!(scan(&Parts(&split(bad, &[2]))), None);
        }
        // A varint that runs past the message's end.
        assert_eq!(scan(&framed(&[0x08, 0x80])[..]), None);
    }

    #[tokio::test]
    async fn a_callers_own_session_is_dropped_and_the_rest_passed_on() {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let cache =
            SessionCache::new("t".into(), vec![("http://127.0.0.1:1".into(), channel)], Default::default(), shutdown);
        let snapshots = Snapshots { sessions: Arc::new(cache.unwrap()), tenant: "t".into(), max_bytes: 64 * 1024 };
        let call = proto::HandleRequest {
            payload: Bytes::from_static(b"hello"),
            session_id: "s-1".into(),
            instance_id: "i-1".into(),
            ..Default::default()
        };
        // Unchanged (the same buffers) when there is nothing to drop or attach: the
        // session is not followed here.
        let plain = framed(&call.encode_to_vec());
        let out = snapshots.attach(Scanned::new(vec![plain.clone()]), "t");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ptr(), plain.as_ptr());
        let forged = proto::DeliveredSession {
            session_id: "s-1".into(),
            version: 99,
            fields: vec![proto::SessionField { name: "role".into(), value: "admin".into(), ..Default::default() }],
        };
        let mut message = proto::HandleRequest { session: Some(forged), ..Default::default() }.encode_to_vec();
        message.extend_from_slice(&call.encode_to_vec());
        let data = framed(&message);
        let out: Vec<u8> = snapshots.attach(Scanned::new(split(&data, &[4, 9])), "t").concat();
        let len = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!((out[0], len), (0, out.len() - PREFIX_LEN));
        let delivered = proto::HandleRequest::decode(&out[PREFIX_LEN..]).unwrap();
        assert_eq!(delivered, call, "the caller's session is gone, everything else is as sent");
    }

    #[test]
    fn the_last_tenant_field_must_be_the_verified_tenant() {
        let message = |tenants: &[&str]| {
            let mut out =
                proto::HandleRequest { payload: Bytes::from(vec![1u8; 50]), ..Default::default() }.encode_to_vec();
            for t in tenants {
                out.extend_from_slice(
                    &proto::HandleRequest { tenant: t.to_string(), ..Default::default() }.encode_to_vec(),
                );
            }
            framed(&out)
        };
        let refused = |data: Vec<Bytes>| match Scanned::new(data).check_tenant("team-a") {
            Ok(()) => None,
            Err(DeliveryError::TenantMismatch { claimed, verified }) => Some((claimed, verified)),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(refused(vec![message(&[])]), None, "no tenant field claims nothing");
        // Cuts inside the tenant field's bytes (they start at 59) too.
        for cuts in [vec![], vec![56], vec![58, 60, 61]] {
            // The caller's sidecar wrote its own tenant last: whatever the caller wrote before it
            // is not what an agent decodes.
            assert_eq!(refused(split(&message(&["team-a"]), &cuts)), None);
            assert_eq!(refused(split(&message(&["team-b", "team-a"]), &cuts)), None);
            assert_eq!(
                refused(split(&message(&["team-a", "team-b"]), &cuts)),
                Some(("team-b".to_string(), "team-a".to_string()))
            );
            assert_eq!(refused(split(&message(&["team-a2"]), &cuts)), Some(("team-a2".into(), "team-a".into())));
            assert_eq!(refused(split(&message(&["team"]), &cuts)), Some(("team".into(), "team-a".into())));
        }
        let status = Scanned::new(vec![message(&["team-b"])]).check_tenant("team-a").unwrap_err().into_status();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        let info = agent_reach::reason::error_info(&status).unwrap();
        assert_eq!(
            (info.reason.as_str(), info.metadata["field"].as_str(), info.metadata["claimed"].as_str()),
            ("TENANT_MISMATCH", "tenant", "team-b")
        );
    }

    #[test]
    fn tail_and_copy_span_buffers() {
        let data = Bytes::from_static(b"0123456789");
        let parts = split(&data, &[2, 6]);
        let p = Parts(&parts);
        assert_eq!(p.copy(1..8), b"1234567");
        let tail: Vec<u8> = p.tail(3).iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(tail, b"3456789");
        assert_eq!(p.byte(9), Some(b'9'));
        assert_eq!(p.byte(10), None);
    }
}
