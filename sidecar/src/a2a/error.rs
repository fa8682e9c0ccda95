//! Errors of the A2A endpoints and the two forms a client sees them in: a gRPC status with
//! a `google.rpc.ErrorInfo` (domain `a2a-protocol.org` and the A2A reason for protocol
//! errors; the mesh's own status, domain `agent-reach.dev`, for a call the mesh refused or
//! that failed), and a JSON-RPC error object with the A2A error code.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` the A2A specification gives its errors.
pub(crate) const A2A_DOMAIN: &str = "a2a-protocol.org";

/// Why an A2A request failed.
#[derive(Debug)]
pub(crate) enum A2aError {
    TaskNotFound(String),
    TaskNotCancelable(String),
    PushNotificationNotSupported,
    UnsupportedOperation(String),
    InvalidParams(String),
    InvalidRequest(String),
    MethodNotFound(String),
    ParseError(String),
    /// The mesh refused the call or it failed: the mesh's status, reason and all.
    Mesh(Status),
    /// An A2A agent's own error (its status has the A2A `ErrorInfo`), passed on unchanged.
    Agent(Status),
    Internal(String),
}

impl A2aError {
    /// The A2A reason, JSON-RPC code and gRPC code of a protocol error.
    fn a2a(&self) -> Option<(&'static str, i64, Code)> {
        Some(match self {
            A2aError::TaskNotFound(_) => ("TASK_NOT_FOUND", -32001, Code::NotFound),
            A2aError::TaskNotCancelable(_) => ("TASK_NOT_CANCELABLE", -32002, Code::FailedPrecondition),
            A2aError::PushNotificationNotSupported => {
                ("PUSH_NOTIFICATION_NOT_SUPPORTED", -32003, Code::FailedPrecondition)
            }
            A2aError::UnsupportedOperation(_) => ("UNSUPPORTED_OPERATION", -32004, Code::FailedPrecondition),
            A2aError::InvalidParams(_) => ("INVALID_PARAMS", -32602, Code::InvalidArgument),
            A2aError::InvalidRequest(_) => ("INVALID_REQUEST", -32600, Code::InvalidArgument),
            A2aError::MethodNotFound(_) => ("METHOD_NOT_FOUND", -32601, Code::NotFound),
            A2aError::ParseError(_) => ("INVALID_REQUEST", -32700, Code::InvalidArgument),
            A2aError::Internal(_) => ("INTERNAL_ERROR", -32603, Code::Internal),
            A2aError::Mesh(_) | A2aError::Agent(_) => return None,
        })
    }

    fn message(&self) -> String {
        match self {
            A2aError::TaskNotFound(id) => format!("task {id:?} not found"),
            A2aError::TaskNotCancelable(why) | A2aError::UnsupportedOperation(why) => why.clone(),
            A2aError::PushNotificationNotSupported => {
                "push notifications are not supported by this sidecar's A2A endpoint".into()
            }
            A2aError::InvalidParams(why)
            | A2aError::InvalidRequest(why)
            | A2aError::ParseError(why)
            | A2aError::Internal(why) => why.clone(),
            A2aError::MethodNotFound(m) => format!("method {m:?} not found"),
            A2aError::Mesh(s) | A2aError::Agent(s) => s.message().to_string(),
        }
    }

    /// The gRPC status of the error.
    pub(crate) fn into_status(self) -> Status {
        match self.a2a() {
            Some((reason, _, code)) => Status::with_error_details(
                code,
                self.message(),
                ErrorDetails::with_error_info(reason, A2A_DOMAIN, std::collections::HashMap::new()),
            ),
            None => match self {
                A2aError::Mesh(s) | A2aError::Agent(s) => s,
                _ => unreachable!("only mesh errors lack an A2A reason"),
            },
        }
    }

    /// The JSON-RPC error object of the error. A mesh error keeps its reason in `data`.
    pub(crate) fn to_jsonrpc(&self) -> serde_json::Value {
        match (self.a2a(), self) {
            (Some((reason, code, _)), _) => serde_json::json!({
                "code": code,
                "message": self.message(),
                "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": A2A_DOMAIN}],
            }),
            (None, A2aError::Mesh(status)) => {
                let code = if status.code() == Code::InvalidArgument { -32602 } else { -32603 };
                let mut info = serde_json::json!({
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "grpcCode": format!("{:?}", status.code()),
                });
                if let Some(e) = agent_reach::reason::error_info(status) {
                    info["reason"] = e.reason.into();
                    info["domain"] = e.domain.into();
                    info["metadata"] = serde_json::to_value(e.metadata).unwrap_or_default();
                }
                serde_json::json!({"code": code, "message": status.message(), "data": [info]})
            }
            (None, A2aError::Agent(status)) => {
                let info = agent_reach::reason::error_info(status).unwrap_or_default();
                let code = JSONRPC_CODES.iter().find(|(r, _)| *r == info.reason).map_or(-32603, |(_, c)| *c);
                serde_json::json!({
                    "code": code,
                    "message": status.message(),
                    "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": info.reason, "domain": info.domain}],
                })
            }
            (None, _) => unreachable!("only mesh and agent errors lack an A2A reason"),
        }
    }
}

/// The JSON-RPC codes of the A2A errors by their `ErrorInfo` reason (A2A v1.0 §5.4).
const JSONRPC_CODES: [(&str, i64); 13] = [
    ("TASK_NOT_FOUND", -32001),
    ("TASK_NOT_CANCELABLE", -32002),
    ("PUSH_NOTIFICATION_NOT_SUPPORTED", -32003),
    ("UNSUPPORTED_OPERATION", -32004),
    ("CONTENT_TYPE_NOT_SUPPORTED", -32005),
    ("INVALID_AGENT_RESPONSE", -32006),
    ("EXTENDED_AGENT_CARD_NOT_CONFIGURED", -32007),
    ("EXTENSION_SUPPORT_REQUIRED", -32008),
    ("VERSION_NOT_SUPPORTED", -32009),
    ("INVALID_PARAMS", -32602),
    ("INVALID_REQUEST", -32600),
    ("METHOD_NOT_FOUND", -32601),
    ("INTERNAL_ERROR", -32603),
];

impl A2aError {
    /// A failed call's status: the A2A agent's own error when it carries A2A's `ErrorInfo`,
    /// else the mesh's.
    pub(crate) fn from_status(status: Status) -> A2aError {
        match agent_reach::reason::error_info(&status) {
            Some(info) if info.domain == A2A_DOMAIN => A2aError::Agent(status),
            _ => A2aError::Mesh(status),
        }
    }
}

impl From<crate::a2a_wire::WireError> for A2aError {
    fn from(e: crate::a2a_wire::WireError) -> Self {
        match e {
            crate::a2a_wire::WireError::InvalidParams(why) => A2aError::InvalidParams(why),
            crate::a2a_wire::WireError::Internal(why) => A2aError::Internal(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_errors_carry_the_a2a_reason_in_both_bindings() {
        let status = A2aError::TaskNotFound("t1".into()).into_status();
        assert_eq!(status.code(), Code::NotFound);
        let info = status.get_details_error_info().expect("error info");
        assert_eq!((info.reason.as_str(), info.domain.as_str()), ("TASK_NOT_FOUND", A2A_DOMAIN));
        let json = A2aError::TaskNotCancelable("done".into()).to_jsonrpc();
        assert_eq!(json["code"], -32002);
        assert_eq!(json["data"][0]["reason"], "TASK_NOT_CANCELABLE");
    }

    #[test]
    fn an_agents_a2a_error_passes_on_with_its_code() {
        let from_agent = Status::with_error_details(
            Code::NotFound,
            "Task not found",
            ErrorDetails::with_error_info("TASK_NOT_FOUND", A2A_DOMAIN, std::collections::HashMap::new()),
        );
        let e = A2aError::from_status(from_agent);
        assert!(matches!(e, A2aError::Agent(_)), "{e:?}");
        let json = e.to_jsonrpc();
        assert_eq!((json["code"].as_i64(), json["message"].as_str()), (Some(-32001), Some("Task not found")));
        assert_eq!(json["data"][0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(e.into_status().code(), Code::NotFound);
        let mesh = agent_reach::reason::status(agent_reach::reason::Reason::RateLimited, "slow down", &[]);
        assert!(matches!(A2aError::from_status(mesh), A2aError::Mesh(_)));
    }

    #[test]
    fn mesh_errors_keep_the_mesh_reason() {
        let mesh = agent_reach::reason::status(agent_reach::reason::Reason::RateLimited, "slow down", &[]);
        let json = A2aError::Mesh(mesh.clone()).to_jsonrpc();
        assert_eq!(json["code"], -32603);
        assert_eq!(json["data"][0]["reason"], "RATE_LIMITED");
        assert_eq!(json["data"][0]["grpcCode"], "ResourceExhausted");
        let status = A2aError::Mesh(mesh).into_status();
        assert_eq!(status.code(), Code::ResourceExhausted);
    }
}
