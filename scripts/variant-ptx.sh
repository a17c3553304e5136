#!/usr/bin/env bash
# Builds the kernels' PTX for one GPU target as build.rs does (`cargo rustc --emit=asm`
# with the pinned nightly, then `.maxnreg` for each kernel `REGISTER_CAPS` in tiles.rs
# names), with `--cfg NAME` for each --cfg given: a variant of the kernels that a binary
# built from the same tree loads with RUSTLE_PTX=FILE, so that variants are measured side
# by side without rebuilding the engine (scripts/bench-turns.sh). With no --cfg, the PTX is
# the one the engine embeds, byte for byte.
#
#   scripts/variant-ptx.sh [--cpu sm_90a] [--cfg NAME]... OUT.ptx
#
#   scripts/variant-ptx.sh --cfg my_experiment .device/variant.ptx
#   scripts/bench-turns.sh - RUSTLE_PTX=.device/variant.ptx      # there
#
# (`--cfg prefetch_waves`, L2 requests for a GEMV's later waves, was measured this way on the
# H200 and removed: docs/lessons.md#tried-and-dropped.)
set -euo pipefail
cd "$(dirname "$0")/.."

cpu=sm_90a
cfgs=()
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=$2; shift 2 ;;
    --cfg) cfgs+=("--cfg" "$2"); shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "variant-ptx: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 1 ]; then
  echo "variant-ptx: name the PTX file to write; --help says how" >&2
  exit 2
fi
out=$1
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' gpu-kernels/rust-toolchain.toml)
target_dir=target/gpu-kernels-variant-$cpu
(
  cd gpu-kernels
  env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS RUSTFLAGS="-C target-cpu=$cpu ${cfgs[*]:-}" \
    CARGO_TARGET_DIR="../$target_dir" \
    rustup run "$toolchain" cargo rustc --release --target nvptx64-nvidia-cuda -Zbuild-std=core \
    -- --emit=asm -Zno-link
)
# The register caps, written as build.rs writes them (Hopper's targets only).
python3 - "$target_dir/nvptx64-nvidia-cuda/release/deps/gpu_kernels.s" "$out" "$cpu" <<'EOF'
import re, sys
src, out, cpu = sys.argv[1:]
ptx = open(src).read()
if cpu.startswith("sm_90"):
    tiles = open("gpu-kernels/src/tiles.rs").read()
    table = re.search(r"REGISTER_CAPS[^=]*=\s*\[(.*?)\];", tiles, re.S).group(1)
    for kernel, regs in re.findall(r'\("(\w+)",\s*(\d+)\)', table):
        start = ptx.find(f".visible .entry {kernel}(")
        end = ptx.find("\n)\n", start) + 3
        if start < 0 or end < 3:
            sys.exit(f"variant-ptx: REGISTER_CAPS names {kernel}, which the PTX has no entry for")
        ptx = f"{ptx[:end]}.maxnreg {regs}\n{ptx[end:]}"
open(out, "w").write(ptx)
EOF
echo "variant-ptx: $out ($cpu${cfgs[*]:+, ${cfgs[*]}})"
