#!/usr/bin/env bash
# Builds agent-reach-sidecar with profile-guided optimization (PGO): an instrumented sidecar
# is built and run on the benchmark's mesh path (unary 12 B and 1 KiB calls closed-loop and
# at 1,000 and 5,000 calls/s, 64 KiB streaming, plaintext and mutual TLS between the
# sidecars), its profile is merged with the toolchain's llvm-profdata, and the sidecar is
# built again from that profile. The result goes to target/pgo/bin/ beside the standard
# release builds of agent-reach-control and agent-reach-bench, so
# `target/pgo/bin/agent-reach-bench run ...` (or `bench/run.sh --pgo`) measures it.
# `agent-reach-sidecar --version` names the build ("profile-guided build").
#
# Needs: the rustup component llvm-tools (added when missing) and the benchmark's tools
# (scripts/install-bench-tools.sh: h2load for the closed-loop part). Three release builds of
# the sidecar's dependency tree: about 20 minutes on 2 cores.
#
# Code the training does not run (A2A, tasks, sessions, error paths) is still built, but
# LLVM lays it out as cold code. The image of the Dockerfile is a standard build.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "build-pgo: $*" >&2; exit 1; }

host="$(rustc -vV | sed -n 's/^host: //p')"
profdata="$(rustc --print sysroot)/lib/rustlib/${host}/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  echo "==> rustup component add llvm-tools (for llvm-profdata)"
  rustup component add llvm-tools >/dev/null 2>&1 || fail "cannot add the rustup component llvm-tools"
  [ -x "$profdata" ] || fail "llvm-profdata not found at $profdata after adding llvm-tools"
fi
scripts/install-bench-tools.sh

target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
target_dir="${target_dir:-target}"
pgo="$target_dir/pgo"
raw="$pgo/profraw"
train="$pgo/train"
bin="$pgo/bin"
mkdir -p "$pgo"

echo "==> cargo build --release (control, bench: the trainer, standard builds)"
cargo build --release --quiet -p agent-reach-control -p agent-reach-bench

echo "==> cargo build --release -p agent-reach-sidecar, instrumented"
RUSTFLAGS="-Cprofile-generate=$(realpath "$pgo")/profraw" \
  cargo build --release --quiet -p agent-reach-sidecar --target-dir "$pgo/generate"
# Build scripts ran instrumented too: only the sidecar's training counts.
rm -rf "$raw" "$train"
mkdir -p "$raw" "$train"
cp "$target_dir/release/agent-reach-bench" "$target_dir/release/agent-reach-control" "$train/"
cp "$pgo/generate/release/agent-reach-sidecar" "$train/"

echo "==> training: the mesh path of the benchmark, plaintext, then mutual TLS"
for mode in "" "--tls"; do
  # shellcheck disable=SC2086
  "$train/agent-reach-bench" run --paths mesh --reps 1 --table-sizes --payloads 12,1024 \
    --duration 5s --open-duration 5s --warmup 1s --stream-duration 3s \
    --out "$train/results" $mode >"$train/run${mode:+-tls}.log" 2>&1 \
    || { tail -20 "$train/run${mode:+-tls}.log" >&2; fail "the training run ${mode:-(plaintext)} failed"; }
done
shopt -s nullglob
profiles=("$raw"/*.profraw)
[ "${#profiles[@]}" -gt 0 ] || fail "the training wrote no profile to $raw"
"$profdata" merge -o "$pgo/merged.profdata" "${profiles[@]}"
# Named by its content: cargo rebuilds when RUSTFLAGS change, not when a file they name does.
profile="$pgo/sidecar-$(sha256sum "$pgo/merged.profdata" | cut -c1-16).profdata"
rm -f "$pgo"/sidecar-*.profdata
mv "$pgo/merged.profdata" "$profile"

echo "==> cargo build --release -p agent-reach-sidecar, from the profile"
RUSTFLAGS="-Cprofile-use=$(realpath "$profile")" \
  cargo build --release --quiet -p agent-reach-sidecar --target-dir "$pgo/use"

rm -rf "$bin"
mkdir -p "$bin"
cp "$target_dir/release/agent-reach-bench" "$target_dir/release/agent-reach-control" "$bin/"
cp "$pgo/use/release/agent-reach-sidecar" "$bin/"
echo "==> $("$bin/agent-reach-sidecar" --version) in $bin"
