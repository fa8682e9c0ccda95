#!/usr/bin/env bash
# The benchmark of BENCHMARKS.md from one command: installs nginx, h2load and Envoy when
# missing (scripts/install-bench-tools.sh), builds the release binaries, and runs
# `agent-reach-bench run`, which measures every path side by side and writes
# bench/results/latest.json and latest.md. Extra arguments go to `agent-reach-bench run`
# (e.g. --reps 5, --smoke, --pin none, --tls for TLS between the proxies of every path,
# --no-stream to skip the 64 KiB streaming measurement); `--help` lists them. Where
# `perf stat` counts instructions and cycles, the run records them per call for every
# proxy; elsewhere the report says why not (then use `agent-reach-bench instructions`).
set -euo pipefail
cd "$(dirname "$0")/.."

# `--pgo` (first argument) measures a sidecar built with profile-guided optimization
# (scripts/build-pgo.sh; the report's "Source:" line names the build).
pgo=""
if [ "${1:-}" = "--pgo" ]; then
  pgo=1
  shift
fi

scripts/install-bench-tools.sh
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
if [ -n "$pgo" ]; then
  scripts/build-pgo.sh
  bin="${target_dir:-target}/pgo/bin"
else
  echo "==> cargo build --release (sidecar, control, bench)"
  cargo build --release --quiet -p agent-reach-sidecar -p agent-reach-control -p agent-reach-bench
  bin="${target_dir:-target}/release"
fi
echo "==> load average now: $(cut -d' ' -f1-3 /proc/loadavg) (the run records it; other work on the machine skews results)"
exec "$bin/agent-reach-bench" run --out bench/results "$@"
