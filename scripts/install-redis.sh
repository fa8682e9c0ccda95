#!/usr/bin/env bash
# Installs redis-server (Debian package) when missing, for the session-context tests
# (agent-reach-session's conformance suite runs a real redis-server on a free port).
# Honours $AGENT_REACH_REDIS_BIN. Prints the version it found or installed.
set -euo pipefail
bin="${AGENT_REACH_REDIS_BIN:-redis-server}"
if ! command -v "$bin" >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  # The package starts a system service; the tests run their own servers.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
fi
"$bin" --version | head -1
