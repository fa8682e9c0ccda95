#!/usr/bin/env bash
# The full test run, as CI runs it: installs etcd (Debian's etcd-server) when it is missing,
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

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "==> cargo test"
cargo test --workspace --all-features
