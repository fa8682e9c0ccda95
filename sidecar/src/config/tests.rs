//! Unit tests of the sidecar's flags and the configuration built from them.

use super::*;

#[test]
fn bad_flags_are_named() {
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--tenant", "Bad/Tenant"]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--tenant"));
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--max-payload-bytes", "0"]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--max-payload-bytes"));
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--dead-after", "5s"]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--dead-after"));
    // Secure by default: no certificate settings and no explicit opt-out refuses to start.
    let args = SidecarArgs::parse_from(["sidecar"]);
    let error = SidecarConfig::try_from(&args).unwrap_err();
    assert!(error.contains("--join-token-file") && error.contains("--insecure-plaintext-control"), "{error}");
    assert!(
        SidecarArgs::try_parse_from(["sidecar", "--insecure-plaintext-control", "--trust-bundle-file", "/b"]).is_err(),
        "plaintext and a trust bundle contradict each other"
    );
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--mesh-mtls", "permissive"]);
    let error = SidecarConfig::try_from(&args).unwrap_err();
    assert!(error.contains("--mesh-mtls permissive needs a certificate"), "{error}");
    assert!(SidecarArgs::try_parse_from(["sidecar", "--mesh-mtls", "off"]).is_err(), "only required or permissive");
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control"]);
    let cfg = SidecarConfig::try_from(&args).unwrap();
    assert!(cfg.identity.is_none());
    assert!(!cfg.mesh_permissive, "mutual TLS on the mesh port is required by default");
    assert_eq!(cfg.dead_after, Duration::from_secs(30));
    assert_eq!(cfg.control, vec!["http://127.0.0.1:7800".to_string()]);
    assert_eq!(cfg.max_payload_bytes, 4 * 1024 * 1024);
    let identity_file = cfg.identity_file.clone().unwrap();
    assert!(identity_file.ends_with("agent-reach/default-7700.table.identity.json"), "{identity_file:?}");
    let default = cfg.table_file.unwrap();
    assert!(default.ends_with("agent-reach/default-7700.table.json"));
    assert!(!default.starts_with(std::env::temp_dir()), "not in the shared temporary directory: {default:?}");
    assert_eq!(cfg.limits, crate::limits::PortLimits::default());
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--max-connections", "0"]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--max-connections"));
    let args = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--table-file", "off"]);
    let cfg = SidecarConfig::try_from(&args).unwrap();
    assert_eq!((cfg.table_file, cfg.identity_file), (None, None));
    let args = SidecarArgs::parse_from([
        "sidecar",
        "--insecure-plaintext-control",
        "--local-uds",
        "/tmp/x.sock",
        "--local-uds-mode",
        "999",
    ]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--local-uds-mode"));
    let args = SidecarArgs::parse_from([
        "sidecar",
        "--insecure-plaintext-control",
        "--local-uds",
        "/tmp/x.sock",
        "--local-uds-mode",
        "660",
    ]);
    assert_eq!(SidecarConfig::try_from(&args).unwrap().local_uds, Some((PathBuf::from("/tmp/x.sock"), 0o660)));
    let args = SidecarArgs::parse_from([
        "sidecar",
        "--insecure-plaintext-control",
        "--local-token-file",
        "/nonexistent/token",
    ]);
    assert!(SidecarConfig::try_from(&args).unwrap_err().contains("--local-token-file"));
}

#[test]
fn the_a2a_json_rpc_port_defaults_to_loopback_and_can_be_turned_off() {
    let cfg = SidecarConfig::try_from(&SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control"])).unwrap();
    assert_eq!(cfg.a2a_listen, Some("127.0.0.1:7703".parse().unwrap()));
    assert_eq!(cfg.a2a_max_tasks, 10_000);
    let off = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--a2a-listen", "off"]);
    assert_eq!(SidecarConfig::try_from(&off).unwrap().a2a_listen, None);
    let bad = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--a2a-listen", "nowhere"]);
    assert!(SidecarConfig::try_from(&bad).unwrap_err().contains("--a2a-listen"));
    let zero = SidecarArgs::parse_from(["sidecar", "--insecure-plaintext-control", "--a2a-max-tasks", "0"]);
    assert!(SidecarConfig::try_from(&zero).unwrap_err().contains("--a2a-max-tasks"));
}

mod build_kind {
    include!("../../build_kind.rs");

    #[test]
    fn the_build_kind_reads_every_spelling_of_the_profile_options() {
        let kinds = [
            ("", "standard build"),
            ("-Copt-level=3", "standard build"),
            ("-Cprofile-use=/p/s.profdata", "profile-guided build"),
            ("-C\x1fprofile-use=/p/s.profdata", "profile-guided build"),
            ("--codegen=profile-use=/p", "profile-guided build"),
            ("--codegen\x1fprofile-use=/p", "profile-guided build"),
            ("-Ctarget-cpu=native\x1f-Cprofile-generate=/raw", "instrumented for PGO"),
            // Not codegen options: a path that merely names a profile, a lint flag.
            ("-L\x1f/profile-use=x\x1f-Wunused", "standard build"),
            ("-C\x1fopt-level=3\x1fprofile-use=/p", "standard build"),
        ];
        for (flags, kind) in kinds {
            assert_eq!(build_kind(flags), kind, "{flags:?}");
        }
    }

    #[test]
    fn the_version_names_how_this_binary_was_built() {
        // The tests are built without profile options.
        assert_eq!(super::super::VERSION, concat!(env!("CARGO_PKG_VERSION"), " (standard build)"));
    }
}
