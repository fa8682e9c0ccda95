#!/usr/bin/env bash
# Prints the path of a usable `kubernetes-validate` (PyPI package, which ships the
# Kubernetes API schemas and validates manifests offline) on stdout; everything else goes
# to stderr.
#
# Order: `kubernetes-validate` on PATH; else the copy in the virtual environment
# target/tools/kubernetes-validate (relative to the repository); else create that virtual
# environment with python3 and pip-install the pinned version into it. Needs python3 with
# venv (Debian: python3-venv, installed here when missing and running as root or with sudo).
# INSTALL_KUBERNETES_VALIDATE_VERSION overrides the version.
#
# Used by tests/tests/helm.rs and scripts/test.sh. Exits non-zero with a reason on stderr.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="$repo/target/tools/kubernetes-validate"
bin="$venv/bin/kubernetes-validate"
version="${INSTALL_KUBERNETES_VALIDATE_VERSION:-1.37.0}"

if command -v kubernetes-validate >/dev/null 2>&1; then
  command -v kubernetes-validate
  exit 0
fi
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "install-kubernetes-validate.sh: installing python3-venv (Debian package)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv python3-pip >&2
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==$version" >&2
if ! "$bin" --version >/dev/null 2>&1; then
  echo "install-kubernetes-validate.sh: $bin does not run after installing kubernetes-validate==$version" >&2
  exit 1
fi
echo "$bin"
