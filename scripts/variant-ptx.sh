#!/usr/bin/env bash
# Builds the kernels' PTX for one GPU target with `--cfg NAME` for each --cfg given: a
# variant of the kernels that a binary built from the same tree loads with RUSTLE_PTX=FILE,
# so that variants are measured side by side without rebuilding the engine
# (scripts/bench-turns.sh). The build is build.rs's own (compiled here with rustc and run
# with these arguments), register caps and all; with no --cfg, the PTX is the one the
# engine embeds, byte for byte. --probes builds it as `--features probes` does (for a
# binary built so: its kernel table wants the probes' kernels).
#
#   scripts/variant-ptx.sh [--cpu sm_90a] [--cfg NAME]... [--probes] OUT.ptx
#
#   scripts/variant-ptx.sh --cfg my_experiment .device/variant.ptx
#   scripts/bench-turns.sh - RUSTLE_PTX=.device/variant.ptx      # there
#
# (`--cfg prefetch_waves`, L2 requests for a GEMV's later waves, was measured this way on the
# H200 and removed: docs/lessons.md#tried-and-dropped.)
set -euo pipefail
cd "$(dirname "$0")/.."

cpu=sm_90a
args=()
probes=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=$2; shift 2 ;;
    --cfg) args+=("--cfg" "$2"); shift 2 ;;
    --probes) probes=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "variant-ptx: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 1 ]; then
  echo "variant-ptx: name the PTX file to write; --help says how" >&2
  exit 2
fi
out=$1
dir=$PWD/target/variant-ptx
mkdir -p "$dir"
rustc --edition 2024 --crate-name build_ptx -o "$dir/build-ptx" build.rs
# build.rs speaks to cargo on stdout: its warnings (a kernel's compile errors) go to stderr
# here, the rest nowhere.
env CARGO_MANIFEST_DIR="$PWD" OUT_DIR="$dir" ${probes:+CARGO_FEATURE_PROBES=1} \
  "$dir/build-ptx" --cpu "$cpu" ${args[@]+"${args[@]}"} | { sed -n 's/^cargo:warning=//p' >&2; }
cp "$dir/kernels_$cpu.ptx" "$out"
echo "variant-ptx: $out ($cpu${args[*]:+, ${args[*]}}${probes:+, probes})"
