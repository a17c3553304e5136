#!/usr/bin/env bash
# Two or more builds of rustle measured against each other in turns, in one sitting on one
# GPU (a change against the code before it): for each turn, each weights type and each
# build, `rustle bench --json` on Llama 3 8B's shape at batch 1 (context 512, graphs on),
# and with --batch, `rustle bench --batch` at those sizes (prompt 512, --steps decode
# steps). Builds alternate within a turn, so that a GPU's drift falls on all of them. A
# build is NAME=BINARY.
#
#   scripts/bench-builds.sh [--turns N] [--weights "bf16 q4_k_m"] [--batch 8,64]
#                           [--steps 64] [--logs DIR] NAME=BIN NAME=BIN...
#
#   scripts/bench-builds.sh --turns 2 --batch 8,64 main=old/rustle-cli new=new/rustle-cli
#
# Prints one line a run (decode tok/s, and the share of the copy bandwidth the process
# measured), then each build's tok/s over the first build's, the mean over the turns.
# Every run's JSON goes to DIR (default: $OUT where the device tool sets it, else a new
# folder under /tmp), named turn-weights-what-build.json.
set -euo pipefail

turns=2
weights="bf16 q4_k_m"
batch=
steps=64
shape=llama3-8b
logs=${OUT:-}
while [ $# -gt 0 ]; do
  case $1 in
    --turns) turns=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "bench-builds: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "bench-builds: name at least two builds as NAME=BINARY; --help says how" >&2
  exit 2
fi
for build in "$@"; do
  name=${build%%=*} bin=${build#*=}
  if [[ ! $name =~ ^[A-Za-z0-9_-]+$ ]] || [ "$name" = "$build" ]; then
    echo "bench-builds: '$build' is not NAME=BINARY" >&2
    exit 2
  fi
  if [ ! -x "$bin" ]; then
    echo "bench-builds: no rustle binary at $bin" >&2
    exit 2
  fi
done
logs=${logs:-$(mktemp -d /tmp/bench-builds.XXXXXX)}
mkdir -p "$logs"
table="$logs/runs.tsv"
: > "$table"
echo "bench-builds: $shape; reports in $logs"
printf '%-5s %-8s %-10s %-12s %10s %8s\n' turn weights what build "tok/s" "of copy"

# `run TURN WEIGHTS WHAT BUILD ARGS...`: one bench, its figures appended to the table.
run() {
  local turn=$1 w=$2 what=$3 build=$4
  shift 4
  local name=${build%%=*} bin=${build#*=}
  local json="$logs/$turn-$w-$what-$name.json"
  if ! "$bin" bench --shape "$shape" --weights "$w" --json "$@" > "$json" 2> "$json.log"; then
    printf '%-5s %-8s %-10s %-12s failed: %s\n' "$turn" "$w" "$what" "$name" "$(tail -1 "$json.log")"
    return
  fi
  # batch 1: the decode row at context 512 with graphs; --batch: every size's decode.
  python3 - "$json" "$table" "$turn" "$w" "$name" <<'PY'
import json, sys
path, table, turn, w, name = sys.argv[1:]
r = json.load(open(path))
if isinstance(r, dict):
    rows = [("batch1", d["tok_per_s"], d["share_of_copy"])
            for d in r["decode"] if d["ctx"] == 512 and d["graph"]]
else:
    rows = [("batch" + str(b["sequences"]), b["decode_tok_per_s"],
             b["decode_tok_per_s"] / b["ceiling_tok_per_s"]) for b in r]
with open(table, "a") as t:
    for case, tok, share in rows:
        print(turn, w, case, name, tok, share, sep="\t", file=t)
        print(f"{turn:<5} {w:<8} {case:<10} {name:<12} {tok:>10.1f} {100 * share:>7.1f}%")
PY
}

for turn in $(seq 1 "$turns"); do
  for w in $weights; do
    for build in "$@"; do
      run "$turn" "$w" batch1 "$build" --ctx 512 --steps 64 --prompt-len 16
    done
    if [ -n "$batch" ]; then
      for build in "$@"; do
        run "$turn" "$w" batched "$build" --batch "$batch" --prompt-len 512 --steps "$steps"
      done
    fi
  done
done

# Each build against the first, case by case: the mean tok/s over the turns.
echo
python3 - "$table" "${1%%=*}" <<'PY'
import sys
from collections import defaultdict
path, first = sys.argv[1:]
runs = defaultdict(list)
builds = []
for line in open(path):
    turn, w, case, name, tok, share = line.rstrip("\n").split("\t")
    runs[(w, case, name)].append(float(tok))
    if name not in builds:
        builds.append(name)
cases = sorted({(w, c) for (w, c, _) in runs}, key=lambda k: (k[0], int(k[1][5:])))
print(f"{'weights':<8} {'case':<10} " + " ".join(f"{b:>14}" for b in builds))
for w, c in cases:
    base = runs.get((w, c, first))
    cells = []
    for b in builds:
        v = runs.get((w, c, b))
        if not v or not base:
            cells.append(f"{'-':>14}")
            continue
        mean, base_mean = sum(v) / len(v), sum(base) / len(base)
        cells.append(f"{mean:>8.1f} {mean / base_mean:>5.3f}")
    print(f"{w:<8} {c:<10} " + " ".join(cells))
PY
