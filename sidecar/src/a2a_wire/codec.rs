//! The codec of the generated `lf.a2a.v1.A2AService` server and client (`build.rs` sets it
//! with `codec_path`): [`agent_reach::codec::StrictCodec`], so a request that is not a valid
//! protobuf message answers INVALID_ARGUMENT with an `ErrorInfo` (reason `INVALID_ARGUMENT`,
//! `field: request`) like every other RPC of the sidecar, instead of tonic's bare INTERNAL.
//!
//! The strict codec recognises requests by their `…Request` name. Every A2A request follows
//! that, except `CreateTaskPushNotificationConfig`, whose request is a bare
//! `TaskPushNotificationConfig`; this codec maps that message's decode failures too. The same
//! message is also the reply of `Create`/`GetTaskPushNotificationConfig`, so an A2A *client*
//! that cannot decode such a reply sees INVALID_ARGUMENT rather than INTERNAL (this sidecar
//! never sends one: it does not support push notifications).

use agent_reach::codec::{StrictCodec, StrictDecoder};
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// The A2A request message whose name does not end in `Request`.
const UNSUFFIXED_REQUEST: &str = "TaskPushNotificationConfig";

/// At most this many bytes of a decode error's text are quoted (as the strict codec does).
const MAX_QUOTED: usize = 128;

/// [`StrictCodec`] that also maps [`UNSUFFIXED_REQUEST`] (module doc).
#[derive(Debug, Clone)]
pub struct A2aCodec<T, U>(StrictCodec<T, U>);

impl<T, U> Default for A2aCodec<T, U> {
    fn default() -> Self {
        A2aCodec(StrictCodec::default())
    }
}

impl<T, U> Codec for A2aCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = A2aDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        A2aDecoder(self.0.decoder())
    }
}

/// The decoder of [`A2aCodec`].
#[derive(Debug, Clone)]
pub struct A2aDecoder<U>(StrictDecoder<U>);

impl<U: Message + Default> Decoder for A2aDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(decode_error::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// What [`A2aDecoder`] answers when a `U` does not decode: the strict codec's mapping
/// (already applied to `status` for `…Request` messages), and the same for
/// [`UNSUFFIXED_REQUEST`].
fn decode_error<U>(status: Status) -> Status {
    let full = std::any::type_name::<U>();
    let name = full.rsplit("::").next().unwrap_or(full);
    if name != UNSUFFIXED_REQUEST || status.code() != tonic::Code::Internal {
        return status;
    }
    let detail = agent_reach::reason::truncate(status.message(), MAX_QUOTED);
    agent_reach::reason::invalid_argument("request", &format!("not a valid {name} protobuf message ({detail})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a_wire::proto;
    use agent_reach::reason::error_info;

    /// What the prost decoder answers for a message that does not decode.
    fn prost_failure() -> Status {
        Status::internal("failed to decode Protobuf message: buffer underflow")
    }

    /// The status a malformed `U` ends with: the strict codec's mapping, then this codec's.
    fn mapped<U>() -> Status {
        decode_error::<U>(agent_reach::codec::decode_error::<U>(prost_failure()))
    }

    #[test]
    fn every_a2a_request_maps_to_invalid_argument() {
        fn check<U>(name: &str) {
            let status = mapped::<U>();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{name}: {status:?}");
            assert_eq!(
                status.message(),
                format!(
                    "invalid request: not a valid {name} protobuf message (failed to decode Protobuf message: buffer underflow)"
                ),
            );
            let info = error_info(&status).unwrap();
            assert_eq!(info.reason, "INVALID_ARGUMENT");
            assert_eq!(info.metadata.get("field").map(String::as_str), Some("request"));
        }
        check::<proto::SendMessageRequest>("SendMessageRequest");
        check::<proto::GetTaskRequest>("GetTaskRequest");
        check::<proto::ListTasksRequest>("ListTasksRequest");
        check::<proto::CancelTaskRequest>("CancelTaskRequest");
        check::<proto::SubscribeToTaskRequest>("SubscribeToTaskRequest");
        check::<proto::TaskPushNotificationConfig>("TaskPushNotificationConfig");
        check::<proto::GetTaskPushNotificationConfigRequest>("GetTaskPushNotificationConfigRequest");
        check::<proto::ListTaskPushNotificationConfigsRequest>("ListTaskPushNotificationConfigsRequest");
        check::<proto::GetExtendedAgentCardRequest>("GetExtendedAgentCardRequest");
        check::<proto::DeleteTaskPushNotificationConfigRequest>("DeleteTaskPushNotificationConfigRequest");
    }

    #[test]
    fn replies_keep_internal() {
        for status in [mapped::<proto::Task>(), mapped::<proto::SendMessageResponse>(), mapped::<proto::AgentCard>()] {
            assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
            assert_eq!(status.message(), "failed to decode Protobuf message: buffer underflow");
        }
    }

    #[test]
    fn a_long_decode_error_is_quoted_short() {
        let status = decode_error::<proto::TaskPushNotificationConfig>(Status::internal("x".repeat(10_000)));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().len() < 256, "{}", status.message().len());
    }
}
