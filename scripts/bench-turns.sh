#!/usr/bin/env bash
# Settings of the engine measured against each other in turns, in one sitting on one GPU:
# for each turn, each weights type and each setting, `rustle bench` on Llama 3 8B's shape
# at batch 1 (context 512), one line each: the setting's decode tok/s with graphs on and
# off, and the share of the copy bandwidth the process measured. A setting is environment
# assignments (`RUSTLE_PDL=0`, or several, comma-separated), or `-` for
# none; settings alternate within a turn so that a GPU's drift falls on all of them.
#
#   scripts/bench-turns.sh [--rustle BIN] [--turns N] [--weights "q4_k_m q8_0"]
#                          [--shape llama3-8b] [--logs DIR] SETTING...
#
#   scripts/bench-turns.sh --turns 3 - RUSTLE_PDL=0 RUSTLE_GEMV_STREAM=0,RUSTLE_PDL=0
#
# Every run's whole report goes to DIR (default: $OUT where the device tool sets it, else a
# new folder under /tmp), named turn-weights-setting.txt.
set -euo pipefail

rustle=target/release/rustle
turns=2
weights="q4_k_m q8_0 fp8 bf16"
shape=llama3-8b
logs=${OUT:-}
while [ $# -gt 0 ]; do
  case $1 in
    --rustle) rustle=$2; shift 2 ;;
    --turns) turns=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | cut -c3-; exit 0 ;;
    --) shift; break ;;
    -) break ;;
    -*) echo "bench-turns: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "bench-turns: name at least one setting (- for none); --help says how" >&2
  exit 2
fi
if [ ! -x "$rustle" ]; then
  echo "bench-turns: no rustle binary at $rustle (--rustle BIN)" >&2
  exit 2
fi
for setting in "$@"; do
  [ "$setting" = - ] && continue
  IFS=, read -ra pairs <<< "$setting"
  for pair in "${pairs[@]}"; do
    if [[ ! $pair =~ ^[A-Z_][A-Z0-9_]*=.*$ ]]; then
      echo "bench-turns: setting '$pair' is not NAME=VALUE (or -)" >&2
      exit 2
    fi
  done
done
logs=${logs:-$(mktemp -d /tmp/bench-turns.XXXXXX)}
mkdir -p "$logs"
echo "bench-turns: $shape, batch 1, context 512; reports in $logs"
printf '%-5s %-8s %-36s %9s %9s %8s\n' turn weights setting "graphs" "no graph" "of copy"
for turn in $(seq 1 "$turns"); do
  for w in $weights; do
    for setting in "$@"; do
      env_args=()
      if [ "$setting" != - ]; then IFS=, read -ra env_args <<< "$setting"; fi
      log="$logs/$turn-$w-${setting//[^A-Za-z0-9_-]/_}.txt"
      if ! env "${env_args[@]}" "$rustle" bench --shape "$shape" --weights "$w" --ctx 512 \
          --steps 64 --prompt-len 16 > "$log" 2>&1; then
        printf '%-5s %-8s %-36s failed: %s\n' "$turn" "$w" "$setting" "$(tail -1 "$log")"
        continue
      fi
      # The decode table's rows at context 512: "  512  yes  tok/s  GB/token  GB/s  of copy ..."
      on=$(awk '$1 == 512 && $2 == "yes" { print $3; exit }' "$log")
      off=$(awk '$1 == 512 && $2 == "no" { print $3; exit }' "$log")
      share=$(awk '$1 == 512 && $2 == "yes" { print $6; exit }' "$log")
      printf '%-5s %-8s %-36s %9s %9s %8s\n' "$turn" "$w" "$setting" "${on:--}" "${off:--}" "${share:--}"
    done
  done
done
