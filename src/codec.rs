//! The one protobuf codec of every gRPC service and client generated from `proto/`
//! (`build.rs` sets it with `codec_path`), and of the sidecar's hand-served local API.
//!
//! It is tonic's prost codec, except for what a server answers to a request that is not a
//! valid protobuf message: INVALID_ARGUMENT with an `ErrorInfo` (reason
//! `INVALID_ARGUMENT`, metadata `field: request`) and a `BadRequest` violation, instead of
//! tonic's bare INTERNAL. The mapping applies to messages named `…Request` (every request
//! message of the API, following the protobuf style guide); a client that cannot decode a
//! reply (`…Reply`, `Chunk`, `WatchEvent`) keeps INTERNAL, which is what gRPC specifies for
//! a peer's bad response. A new service gets the mapping by being generated from `proto/`
//! with request messages named `…Request`; a hand-written server uses [`StrictCodec`] in
//! `tonic::server::Grpc::new`. The vendored A2A service (`lf.a2a.v1.A2AService`, served by
//! the sidecar) uses it too; its one request not named `…Request` is listed in
//! [`UNSUFFIXED_REQUESTS`]. That message is also an A2A reply, so an A2A *client* that cannot
//! decode it sees INVALID_ARGUMENT rather than INTERNAL (the sidecar never sends one).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Request messages whose names do not end in `Request`: A2A's
/// `CreateTaskPushNotificationConfig` takes a bare `TaskPushNotificationConfig`.
pub const UNSUFFIXED_REQUESTS: &[&str] = &["TaskPushNotificationConfig"];

/// At most this many bytes of a decode error's text are quoted in the status.
const MAX_QUOTED: usize = 128;

/// [`ProstCodec`] with malformed requests mapped to INVALID_ARGUMENT (see the module doc).
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        StrictCodec(ProstCodec::default())
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(self.0.decoder(), PhantomData)
    }
}

/// The decoder of [`StrictCodec`].
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(ProstDecoder<U>, PhantomData<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| decode_error::<U>(status))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// The short name of a message type, e.g. `RouteRequest`.
fn short_name<U>() -> &'static str {
    let full = std::any::type_name::<U>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Maps a decode failure of a `U`: INVALID_ARGUMENT for requests, unchanged otherwise.
pub fn decode_error<U>(status: Status) -> Status {
    let name = short_name::<U>();
    if !name.ends_with("Request") && !UNSUFFIXED_REQUESTS.contains(&name) {
        return status;
    }
    let detail = crate::reason::truncate(status.message(), MAX_QUOTED);
    crate::reason::invalid_argument("request", &format!("not a valid {name} protobuf message ({detail})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::error_info;

    #[test]
    fn requests_map_to_invalid_argument_with_a_reason() {
        let s = decode_error::<crate::proto::RouteRequest>(Status::internal("failed to decode Protobuf message: x"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            s.message(),
            "invalid request: not a valid RouteRequest protobuf message (failed to decode Protobuf message: x)"
        );
        let info = error_info(&s).unwrap();
        assert_eq!(info.reason, "INVALID_ARGUMENT");
        assert_eq!(info.metadata.get("field").map(String::as_str), Some("request"));
    }

    #[test]
    fn replies_keep_internal() {
        let s = decode_error::<crate::proto::RouteReply>(Status::internal("bad"));
        assert_eq!((s.code(), s.message()), (tonic::Code::Internal, "bad"));
    }

    #[test]
    fn a_long_decode_error_is_quoted_short() {
        let s = decode_error::<crate::proto::RouteRequest>(Status::internal("x".repeat(10_000)));
        assert!(s.message().len() < 256, "{}", s.message().len());
    }
}
