//! Malformed A2A requests answer INVALID_ARGUMENT: the generated `lf.a2a.v1.A2AService`
//! uses the root crate's [`agent_reach::codec::StrictCodec`] (`build.rs` sets it with
//! `codec_path`), which also knows A2A's one request not named `…Request`
//! (`TaskPushNotificationConfig`). These tests check that mapping on the A2A messages.

mod tests {
    use agent_reach::codec::decode_error;
    use agent_reach::reason::error_info;
    use tonic::Status;

    use crate::a2a_wire::proto;

    /// What the prost decoder answers for a message that does not decode.
    fn prost_failure() -> Status {
        Status::internal("failed to decode Protobuf message: buffer underflow")
    }

    /// The status a malformed `U` ends with: the strict codec's mapping.
    fn mapped<U>() -> Status {
        decode_error::<U>(prost_failure())
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
