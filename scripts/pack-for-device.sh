#!/usr/bin/env bash
# For a GPU machine without cargo: builds the release test executables and `rustle`, and
# copies them, stripped, into one folder (default `.device/bins`, which git ignores), each
# test executable under its target's name and `rustle` as `rustle-cli`, then packs the
# folder into DIR.tar.xz (about a fifth of its size: a device call carries 64 MiB at most).
# There, from the repository root:
#
#   tar -xJf .device/bins.tar.xz -C .device
#   scripts/run-test-binaries.sh .device/bins     # the whole suite, as cargo test would
#   scripts/bench-turns.sh --rustle .device/bins/rustle-cli SETTING...
#
# That machine reaches no network: the tests that fetch the default model (96.6 MB, two
# carried parts) or `pip install openai` fail there unless those come with the call.
#
#   scripts/pack-for-device.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.device/bins}

# The test executables, as cargo reports them: one JSON line per artifact. Building them
# builds target/release/rustle too (the integration tests run it).
executables=$(cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        # The unit tests of the library and of the binary are both target "rustle": the
        # kind of target keeps them apart (rustle-lib, rustle-bin).
        name = t["name"] + ("-" + t["kind"][0] if t["name"] == "rustle" else "")
        print(name, m["executable"])
') || {
  echo "pack-for-device: the test executables did not build; cargo test --release --no-run says why" >&2
  exit 1
}
if [ -z "$executables" ]; then
  echo "pack-for-device: cargo listed no test executables" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
while read -r name path; do
  cp "$path" "$dir/$name"
done <<< "$executables"
cp target/release/rustle "$dir/rustle-cli"
strip "$dir"/*
tar -cf - -C "$(dirname "$dir")" "$(basename "$dir")" | xz -T0 -6 > "$dir.tar.xz"
echo "pack-for-device: $(ls "$dir" | wc -l) executables in $dir ($(du -sh "$dir" | cut -f1));" \
  "$dir.tar.xz $(du -h "$dir.tar.xz" | cut -f1)"
