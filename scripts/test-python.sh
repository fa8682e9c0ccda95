#!/usr/bin/env bash
# The Python SDK's test run (sdk/python), as CI runs it after `cargo test`:
#   1. the generated stubs in the package are checked against proto/ (stale: fail);
#   2. mypy --strict on the package;
#   3. `python -m build` makes the wheel and the sdist;
#   4. a fresh venv gets the built wheel (with its extras) and pytest runs the tests against
#      that install, on a real etcd, control and two sidecars (cargo-built binaries).
# pytest finding no test (exit 5) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "==> installing python3-venv (Debian package)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv python3-pip >/dev/null
fi
echo "==> python: $("$PYTHON" --version)"

echo "==> cargo build (control, sidecar, test-agent)"
cargo build -q -p agent-reach-control -p agent-reach-sidecar -p agent-reach-e2e --bins
# Where cargo put them (a CARGO_TARGET_DIR of the caller included).
export AGENT_REACH_BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/debug"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agent-reach-python.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "==> tools venv"
"$PYTHON" -m venv "$WORK/tools"
TOOLS="$WORK/tools/bin/python"
"$TOOLS" -m pip install -q --disable-pip-version-check -r sdk/python/requirements-dev.txt
"$TOOLS" -m pip install -q --disable-pip-version-check -e sdk/python

echo "==> generated stubs up to date with proto/"
"$TOOLS" sdk/python/gen_protos.py --check

echo "==> mypy --strict (agent_reach)"
(cd sdk/python && "$TOOLS" -m mypy --strict src/agent_reach)

echo "==> python -m build (wheel + sdist)"
"$TOOLS" -m build --no-isolation --outdir "$WORK/dist" sdk/python >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/agent_reach-*.whl)
SDIST=$(ls "$WORK"/dist/agent_reach-*.tar.gz)
for f in agent_reach/py.typed agent_reach/_proto/agentreach/v1/sidecar_pb2.py agent_reach/_proto/agentreach/v1/sidecar_pb2.pyi; do
  "$TOOLS" -c "import sys, zipfile; sys.exit(0 if '$f' in zipfile.ZipFile('$WHEEL').namelist() else 1)" \
    || { echo "the wheel lacks $f"; exit 1; }
done
SDIST_FILES=$(tar -tzf "$SDIST")
grep -q "src/agent_reach/_proto/agentreach/v1/agent_pb2.py" <<<"$SDIST_FILES" || { echo "the sdist lacks the stubs"; exit 1; }
echo "    $(basename "$WHEEL"), $(basename "$SDIST")"

echo "==> test venv with the built wheel"
"$PYTHON" -m venv "$WORK/test"
TEST="$WORK/test/bin/python"
"$TEST" -m pip install -q --disable-pip-version-check "${WHEEL}[langchain,otel]" \
  "$(grep '^pytest==' sdk/python/requirements-dev.txt)" "$(grep '^grpcio-reflection==' sdk/python/requirements-dev.txt)"

echo "==> pytest (against the installed wheel)"
set +e
(cd "$WORK" && AGENT_REACH_EXPECT_INSTALLED=1 "$TEST" -m pytest -q -p no:cacheprovider \
  --rootdir "$ROOT/sdk/python" -c "$ROOT/sdk/python/pyproject.toml" "$ROOT/sdk/python/tests")
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest ran no test: failing"
  exit 1
fi
exit "$rc"
