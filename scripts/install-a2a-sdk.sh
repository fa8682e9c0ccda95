#!/usr/bin/env bash
# Prints the path of a Python interpreter with the official A2A SDK (PyPI a2a-sdk, with its
# gRPC extra) on stdout; everything else goes to stderr. The A2A end-to-end tests
# (tests/tests/e2e/a2a.rs) run tests/python/a2a_sdk_client.py with it.
#
# The venv is cached at target/tools/a2a-sdk-venv (relative to the repository) and made
# again when its pinned versions change. Needs python3 with venv (Debian: python3-venv,
# installed when missing) and PyPI. A2A_SDK_PYTHON overrides the base interpreter.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="$repo/target/tools/a2a-sdk-venv"
python="${A2A_SDK_PYTHON:-python3}"
pins="a2a-sdk[grpc]==1.3.0 httpx==0.28.1"

if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.pins" 2>/dev/null)" = "$pins" ]; then
  echo "$venv/bin/python"
  exit 0
fi

if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "install-a2a-sdk.sh: installing python3-venv (Debian package)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv python3-pip >&2
fi

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv" >&2
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $pins >&2
echo "$pins" >"$venv/.pins"
echo "$venv/bin/python"
