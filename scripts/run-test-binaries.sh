#!/usr/bin/env bash
# Runs the test executables that `cargo test --release --no-run` built, from a folder, the
# way cargo would: each from the repository root (tests find tests/golden/ from there), with
# RUSTLE_BIN pointing at a copy of the rustle binary. For the GPU machine, which has no cargo:
#
#   here:  cargo test --release --no-run   # copy the executables it lists, and
#          target/release/rustle as rustle-cli, into one folder
#   there: scripts/run-test-binaries.sh FOLDER
#
# Prints each executable's own summary line, then one line for the whole suite.
set -u
dir=$1
export RUSTLE_BIN="$dir/rustle-cli"
failed=0
for t in "$dir"/*; do
  [ "$t" = "$RUSTLE_BIN" ] && continue
  echo "== $(basename "$t")"
  "$t" || failed=$((failed + 1))
done
if [ "$failed" -eq 0 ]; then echo "suite: every test executable passed"; else echo "suite: $failed test executables failed"; fi
exit "$failed"
