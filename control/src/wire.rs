//! Watch events encoded once and shared by every stream that sends them.
//!
//! A tenant's routing state goes to every sidecar of the tenant: the same snapshot parts
//! and the same deltas, to a thousand streams at once. The feed encodes each delta once
//! ([`SharedDelta`]) and each snapshot once per routing change ([`SnapshotWire`], split in
//! parts), and every stream sends the same bytes ([`WireEvent`], reference-counted
//! `Bytes`). The codec of the `Watch` method ([`WireCodec`]) writes them as they are, so
//! the control service's work per watcher is a copy into the connection, not an encode.
//!
//! The bytes are a `WatchEvent` as prost writes it, with one freedom the protobuf encoding
//! allows: a snapshot part's `revision` and `resync` fields come first (they change with
//! the feed's head and the watcher's request; the instances and policies that follow do
//! not), so the shared body is encoded once per routing change, not once per revision.

use std::sync::OnceLock;

use agent_reach::codec::{StrictCodec, StrictDecoder};
use agent_reach::proto;
use agent_reach_store::Revision;
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, EncodeBuf, Encoder};

/// A snapshot larger than this (encoded) is sent in parts of at most this size each (a
/// single instance or policy larger than it travels alone), so a tenant of any size loads
/// through the sidecars' message size limit.
pub const SNAPSHOT_PART_BYTES: usize = 64 * 1024;

// Keys (field number << 3 | wire type) of the fields written by hand.
/// `WatchEvent.snapshot` (1, length-delimited).
const KEY_EVENT_SNAPSHOT: u8 = 1 << 3 | 2;
/// `WatchEvent.delta` (2, length-delimited).
const KEY_EVENT_DELTA: u8 = 2 << 3 | 2;
/// `Snapshot.revision` (1, varint).
const KEY_REVISION: u8 = 1 << 3;
/// `Snapshot.instances` (2, length-delimited).
const KEY_INSTANCE: u8 = 2 << 3 | 2;
/// `Snapshot.resync` (3, varint).
const KEY_RESYNC: u8 = 3 << 3;
/// `Snapshot.policies` (4, length-delimited).
const KEY_POLICY: u8 = 4 << 3 | 2;
/// `Snapshot.more` (5, varint).
const KEY_MORE: u8 = 5 << 3;

/// One encoded `WatchEvent`: `head` then `body`. The body is shared by every stream that
/// sends the same event; the head is a few bytes of its own (empty for a delta).
#[derive(Clone, Debug, Default)]
pub struct WireEvent {
    pub head: Bytes,
    pub body: Bytes,
}

impl WireEvent {
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The event as a message (for callers that want one, and for tests).
    pub fn decode(&self) -> Result<proto::WatchEvent, prost::DecodeError> {
        let mut whole = BytesMut::with_capacity(self.len());
        whole.put_slice(&self.head);
        whole.put_slice(&self.body);
        proto::WatchEvent::decode(whole.freeze())
    }
}

/// A delta of the feed's history (or of a catch-up), with its `WatchEvent` encoded on
/// first use and then shared.
#[derive(Debug)]
pub struct SharedDelta {
    pub delta: proto::Delta,
    wire: OnceLock<Bytes>,
}

impl SharedDelta {
    pub fn new(delta: proto::Delta) -> SharedDelta {
        SharedDelta { delta, wire: OnceLock::new() }
    }

    pub fn revision(&self) -> Revision {
        self.delta.revision
    }

    /// The `WatchEvent` carrying this delta, encoded once.
    pub fn wire(&self) -> WireEvent {
        let body = self.wire.get_or_init(|| {
            let mut buf = BytesMut::with_capacity(1 + 10 + self.delta.encoded_len());
            buf.put_u8(KEY_EVENT_DELTA);
            self.delta.encode_length_delimited(&mut buf).expect("the buffer grows");
            buf.freeze()
        });
        WireEvent { head: Bytes::new(), body: body.clone() }
    }
}

/// A snapshot's instances and policies, encoded once in parts of bounded size; each part
/// is sent with a small head naming the revision and the resync flag.
#[derive(Debug)]
pub struct SnapshotWire {
    /// Each part's `Snapshot` fields after the head: instances, policies, and `more` on
    /// every part but the last.
    parts: Vec<Bytes>,
}

impl SnapshotWire {
    /// Encodes `instances` then `policies` in parts whose items encode to at most `bound`
    /// bytes each with the part's other fields (one larger item travels alone). No items
    /// still make one (empty) part.
    pub fn build<'a>(
        instances: impl IntoIterator<Item = &'a proto::Instance>,
        policies: impl IntoIterator<Item = &'a proto::Policy>,
        bound: usize,
    ) -> SnapshotWire {
        let mut parts = Parts { done: Vec::new(), current: BytesMut::new(), bound };
        for i in instances {
            parts.push(KEY_INSTANCE, i);
        }
        for p in policies {
            parts.push(KEY_POLICY, p);
        }
        parts.done.push(parts.current.freeze());
        SnapshotWire { parts: parts.done }
    }

    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The events of this snapshot at `revision`, flagged `resync` or not.
    pub fn events(&self, revision: Revision, resync: bool) -> Vec<WireEvent> {
        self.parts
            .iter()
            .map(|body| WireEvent { head: head(revision, resync, body.len()), body: body.clone() })
            .collect()
    }
}

/// Room kept in every part for the fields outside the items: `revision` (key and up to 10
/// bytes), `resync` and `more` (2 bytes each).
const PART_FIELDS: usize = 11 + 2 + 2;

struct Parts {
    done: Vec<Bytes>,
    current: BytesMut,
    bound: usize,
}

impl Parts {
    fn push<M: Message>(&mut self, key: u8, item: &M) {
        let len = item.encoded_len();
        let field = 1 + prost::length_delimiter_len(len) + len;
        if !self.current.is_empty() && self.current.len() + field + PART_FIELDS > self.bound {
            let mut done = std::mem::take(&mut self.current);
            done.put_u8(KEY_MORE);
            done.put_u8(1);
            self.done.push(done.freeze());
        }
        self.current.reserve(field + 2);
        self.current.put_u8(key);
        item.encode_length_delimited(&mut self.current).expect("reserved");
    }
}

/// `WatchEvent.snapshot`'s key and length, then the `revision` and `resync` fields.
fn head(revision: Revision, resync: bool, body: usize) -> Bytes {
    let mut fields = BytesMut::with_capacity(16);
    if revision != 0 {
        fields.put_u8(KEY_REVISION);
        prost::encoding::encode_varint(revision as u64, &mut fields);
    }
    if resync {
        fields.put_u8(KEY_RESYNC);
        fields.put_u8(1);
    }
    let len = fields.len() + body;
    let mut out = BytesMut::with_capacity(1 + prost::length_delimiter_len(len) + fields.len());
    out.put_u8(KEY_EVENT_SNAPSHOT);
    prost::encode_length_delimiter(len, &mut out).expect("reserved");
    out.put_slice(&fields);
    out.freeze()
}

/// The codec of the `Watch` method as [`crate::routes`] serves it: events go out as the
/// bytes they already are; requests decode as every generated server decodes them
/// ([`StrictCodec`]: a malformed request is INVALID_ARGUMENT).
#[derive(Debug, Clone, Default)]
pub struct WireCodec;

impl Codec for WireCodec {
    type Encode = WireEvent;
    type Decode = proto::WatchRequest;
    type Encoder = WireEncoder;
    type Decoder = StrictDecoder<proto::WatchRequest>;

    fn encoder(&mut self) -> WireEncoder {
        WireEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictCodec::<proto::WatchEvent, proto::WatchRequest>::default().decoder()
    }
}

/// The encoder of [`WireCodec`].
#[derive(Debug, Clone, Default)]
pub struct WireEncoder;

impl Encoder for WireEncoder {
    type Item = WireEvent;
    type Error = Status;

    fn encode(&mut self, item: WireEvent, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.len());
        dst.put_slice(&item.head);
        dst.put_slice(&item.body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(i: usize, blob: usize) -> proto::Instance {
        proto::Instance {
            instance_id: format!("a-{i}"),
            registration: Some(proto::AgentRegistration {
                agent: "a".into(),
                metadata: [("blob".to_string(), "x".repeat(blob))].into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn whole(event: &WireEvent) -> Vec<u8> {
        [event.head.as_ref(), event.body.as_ref()].concat()
    }

    fn snapshot(event: &WireEvent) -> proto::Snapshot {
        match event.decode().unwrap().event {
            Some(proto::watch_event::Event::Snapshot(s)) => s,
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    #[test]
    fn a_delta_is_the_bytes_prost_writes() {
        let delta = proto::Delta {
            revision: 12,
            prev_revision: 7,
            upserted: vec![instance(1, 10)],
            removed_instance_ids: vec!["a-0".into()],
            ..Default::default()
        };
        let shared = SharedDelta::new(delta.clone());
        let expected = proto::WatchEvent { event: Some(proto::watch_event::Event::Delta(delta)) }.encode_to_vec();
        assert_eq!(whole(&shared.wire()), expected);
        // Encoded once: every later send shares the same buffer.
        assert_eq!(shared.wire().body.as_ptr(), shared.wire().body.as_ptr());
        assert_eq!(shared.revision(), 12);
    }

    #[test]
    fn a_large_snapshot_is_encoded_once_in_bounded_parts() {
        let instances: Vec<proto::Instance> = (0..1000).map(|i| instance(i, 4096)).collect();
        let policies = vec![proto::Policy { name: "p".into(), ..Default::default() }];
        let wire = SnapshotWire::build(&instances, &policies, 64 * 1024);
        assert!(wire.parts() >= 60, "{} parts", wire.parts());
        let events = wire.events(9, false);
        assert_eq!(events.len(), wire.parts());
        let mut ids = Vec::new();
        let mut policy_count = 0;
        for (i, event) in events.iter().enumerate() {
            let part = snapshot(event);
            assert!(event.len() <= 64 * 1024, "part {i}: {} bytes", event.len());
            assert_eq!((part.revision, part.resync, part.more), (9, false, i + 1 < events.len()));
            // Without resync, the very bytes prost writes for the same message.
            let expected = proto::WatchEvent { event: Some(proto::watch_event::Event::Snapshot(part.clone())) };
            assert_eq!(whole(event), expected.encode_to_vec(), "part {i}");
            ids.extend(part.instances.iter().map(|i| i.instance_id.clone()));
            policy_count += part.policies.len();
        }
        assert_eq!(ids, (0..1000).map(|i| format!("a-{i}")).collect::<Vec<_>>());
        assert_eq!(policy_count, 1);
        // Another revision, resync: the same shared bodies under new heads.
        let resync = wire.events(1_000_000, true);
        for (a, b) in events.iter().zip(&resync) {
            assert_eq!(a.body.as_ptr(), b.body.as_ptr());
            let part = snapshot(b);
            assert_eq!((part.revision, part.resync), (1_000_000, true));
        }
        assert_eq!(snapshot(&resync[3]).instances, snapshot(&events[3]).instances);
    }

    #[test]
    fn small_empty_and_oversized_snapshots() {
        let instances: Vec<proto::Instance> = (0..3).map(|i| instance(i, 10)).collect();
        let one = SnapshotWire::build(&instances, &[], SNAPSHOT_PART_BYTES);
        assert_eq!(one.parts(), 1);
        assert_eq!(snapshot(&one.events(5, false)[0]).instances.len(), 3);
        let empty = SnapshotWire::build(&[], &[], SNAPSHOT_PART_BYTES);
        let events = empty.events(0, false);
        assert_eq!(events.len(), 1);
        assert_eq!(snapshot(&events[0]), proto::Snapshot::default());
        // Items above the bound travel one per part.
        let alone = SnapshotWire::build(&instances, &[], 20);
        assert_eq!(alone.parts(), 3);
        assert!(!snapshot(&alone.events(5, false)[2]).more);
    }
}
