#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver (Debian packages `chromium` and
# `chromium-driver`) for the dashboard's browser tests (tests/tests/e2e/dashboard.rs),
# unless both are already on PATH. Prints the versions.
set -euo pipefail

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "==> installing chromium and chromium-driver (Debian packages) for the dashboard tests" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
echo "$(chromium --version 2>/dev/null | head -1); $(chromedriver --version | head -1)"
