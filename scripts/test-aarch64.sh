#!/usr/bin/env bash
# Runs the fast CPU backend's tests for aarch64 under qemu's user-mode emulation, once per
# emulated CPU, so that each NEON form of the integer dot product runs somewhere:
#
#   max          every extension qemu has, i8mm and dotprod among them: `usdot`, and (the
#                unit tests call each form the CPU allows) `sdot` and plain NEON beside it
#   cortex-a76   Armv8.2 with dotprod, no i8mm: the decode takes `sdot`
#   cortex-a72   Armv8.0, NEON only: the decode takes the widening form
#
# Installs nothing: it says what is missing and how to get it.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: scripts/test-aarch64.sh [--cpus "max cortex-a76 cortex-a72"] [--integration] [--help]

  --cpus LIST     qemu CPUs to run the unit tests on (default: max cortex-a76 cortex-a72;
                  `qemu-aarch64 -cpu help` lists them)
  --integration   also run tests/cpu_fast.rs (the default model end to end) on the first
                  CPU; it needs the model in ~/.cache/rustle and takes long under emulation
  --help          this text

Builds with `cargo test --release --target aarch64-unknown-linux-gnu`; set CARGO_TARGET_DIR
and CARGO_BUILD_JOBS as for any cargo run (CARGO_BUILD_JOBS=1 on a small machine).
Needs: the rustup target aarch64-unknown-linux-gnu, the cross linker aarch64-linux-gnu-gcc
(its libraries in /usr/aarch64-linux-gnu), and qemu-aarch64.
USAGE
}

cpus="max cortex-a76 cortex-a72"
integration=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpus) cpus=${2:?--cpus needs a list}; shift 2 ;;
    --integration) integration=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
missing=0
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "missing: the Rust target $target; get it with: rustup target add $target" >&2
  missing=1
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -d "$sysroot" ]; then
  echo "missing: the cross linker aarch64-linux-gnu-gcc and $sysroot;" \
    "on Debian or Ubuntu: apt-get install gcc-aarch64-linux-gnu" >&2
  missing=1
fi
if ! command -v qemu-aarch64 >/dev/null; then
  echo "missing: qemu-aarch64; on Debian or Ubuntu: apt-get install qemu-user" >&2
  missing=1
fi
[ "$missing" -eq 0 ] || exit 1

cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc

# One build; only the runner changes from CPU to CPU.
run() {
  local cpu=$1
  shift
  echo "== qemu-aarch64 -cpu $cpu: cargo test $*"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L $sysroot" \
    cargo test --release --target "$target" "$@"
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for cpu in $cpus; do
  # --nocapture: each test says which forms it ran (a CPU without a feature skips its form).
  status=0
  run "$cpu" --lib cpu::fast -- --nocapture >"$log" 2>&1 || status=$?
  grep -E "^(== |test |kernel paths|[0-9] of|test result)" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "FAILED on qemu's $cpu (exit $status)" >&2
    exit 1
  fi
done

if [ "$integration" -eq 1 ]; then
  first=${cpus%% *}
  run "$first" --test cpu_fast
fi
echo "aarch64 tests passed on: $cpus"
