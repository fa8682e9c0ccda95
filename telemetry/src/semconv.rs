//! OpenTelemetry semantic-convention attributes that mesh spans carry besides their own
//! `agent_reach.*` ones, so that Jaeger, Tempo and GenAI observability tools read a hop
//! natively: the RPC conventions (`rpc.system`, `rpc.service`, `rpc.method`,
//! `server.address`, `server.port`, `rpc.grpc.status_code`) and the GenAI agent ones for an
//! agent invocation (`gen_ai.operation.name = invoke_agent`, `gen_ai.agent.name`,
//! `gen_ai.agent.id`). Only builds attribute lists; which span gets which is the sidecar's
//! business.

use opentelemetry::KeyValue;

/// `rpc.system = grpc`, `rpc.service`, `rpc.method`.
pub fn grpc(service: &'static str, method: &'static str) -> [KeyValue; 3] {
    [KeyValue::new("rpc.system", "grpc"), KeyValue::new("rpc.service", service), KeyValue::new("rpc.method", method)]
}

/// `server.address` and `server.port` of a "host:port" (or "[v6]:port") address; the
/// address alone when it has no port.
pub fn server(address: &str) -> Vec<KeyValue> {
    let address = address.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/');
    match address.rsplit_once(':').and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?))) {
        Some((host, port)) => vec![
            KeyValue::new("server.address", host.trim_start_matches('[').trim_end_matches(']').to_string()),
            KeyValue::new("server.port", i64::from(port)),
        ],
        None => vec![KeyValue::new("server.address", address.to_string())],
    }
}

/// `rpc.grpc.status_code`: the numeric gRPC code (0 = OK).
pub fn grpc_status(code: i32) -> KeyValue {
    KeyValue::new("rpc.grpc.status_code", i64::from(code))
}

/// `gen_ai.operation.name = invoke_agent`, `gen_ai.agent.name`, `gen_ai.agent.id` (the
/// instance id).
pub fn invoke_agent(agent: &str, instance_id: &str) -> [KeyValue; 3] {
    [
        KeyValue::new("gen_ai.operation.name", "invoke_agent"),
        KeyValue::new("gen_ai.agent.name", agent.to_string()),
        KeyValue::new("gen_ai.agent.id", instance_id.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_address_and_port() {
        let kv = |v: Vec<KeyValue>| v.into_iter().map(|k| (k.key.to_string(), k.value.to_string())).collect::<Vec<_>>();
        assert_eq!(
            kv(server("10.0.0.5:7701")),
            [("server.address".into(), "10.0.0.5".into()), ("server.port".into(), "7701".into())]
        );
        assert_eq!(
            kv(server("[::1]:7701")),
            [("server.address".into(), "::1".into()), ("server.port".into(), "7701".into())]
        );
        assert_eq!(kv(server("host-b")), [("server.address".into(), "host-b".into())]);
    }
}
