#!/usr/bin/env bash
# What each weight format and fast path costs in quality, as a table: one model's weights
# in float32 (the reference, `rustle perplexity --reference`), requantized by llama.cpp's
# llama-quantize to Q8_0 and Q4_K_M, each run on every device asked for, and fp8 weights made
# at load on the GPU; for each, the perplexity of a text and, against the reference, the mean
# and 99th-percentile KL divergence a token and how often the most likely token agrees.
#
#   scripts/quality-table.sh --llama-quantize PATH [--model GGUF] [--text FILE] [--ctx N]
#                            [--devices "cpu gpu"] [--python PY] [--work DIR]
#
# --model     a GGUF file (default: the default model, fetched by rustle if missing); its
#             tensors are dequantized to float32 (scripts/dequantize_gguf.py), so every row
#             differs from the reference by its own rounding only, the original format
#             included as a row of its own
# --llama-quantize  llama.cpp's quantizer (build target llama-quantize of the llama.cpp that
#             scripts/compare-llama-cpp.sh pins)
# --python    a python3 with the `gguf` and `numpy` packages (default python3)
# Prints a Markdown table on stdout; the runs' JSON reports stay in --work (default a
# temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
model="" quantize="" text=tests/data/declaration.txt ctx=64 devices="cpu gpu" python=python3 work=""
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --llama-quantize) quantize=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quality-table: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
rustle=${RUSTLE_BIN:-target/release/rustle}
[ -x "$quantize" ] || { echo "quality-table: --llama-quantize PATH is needed (an executable)" >&2; exit 2; }
[ -x "$rustle" ] || { echo "quality-table: no rustle at $rustle (cargo build --release, or set RUSTLE_BIN)" >&2; exit 2; }
if [ -z "$model" ]; then
  model=${XDG_CACHE_HOME:-$HOME/.cache}/rustle/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$model" ] || "$rustle" -p "hi" -n 1 --device cpu >/dev/null 2>&1
fi
work=${work:-$(mktemp -d)}
mkdir -p "$work"
say() { echo "quality-table: $*" >&2; }

stem=$(basename "$model" .gguf)
original=${stem##*.}
say "dequantizing $model to float32"
"$python" scripts/dequantize_gguf.py "$model" "$work/f32.gguf"
for q in Q8_0 Q4_K_M; do
  say "quantizing to $q"
  "$quantize" "$work/f32.gguf" "$work/$q.gguf" "$q" >"$work/$q.log" 2>&1 \
    || { cat "$work/$q.log" >&2; exit 1; }
done

ppl() { "$rustle" perplexity -f "$text" --ctx "$ctx" --json "$@"; }
say "the float32 reference"
ppl -m "$work/f32.gguf" --reference --save-logits "$work/ref.bin" >"$work/reference.json"

# Rows: label, file, device, extra flags.
rows=()
for d in $devices; do
  rows+=("$original (the file as given)|$model|$d|")
  rows+=("Q8_0|$work/Q8_0.gguf|$d|")
  rows+=("Q4_K_M|$work/Q4_K_M.gguf|$d|")
  [ "$d" = cpu ] && rows+=("float32|$work/f32.gguf|cpu|")
  [ "$d" = gpu ] && rows+=("fp8 (--weights fp8)|$work/f32.gguf|gpu|--weights fp8")
  [ "$d" = gpu ] && rows+=("$original, the fp8 KV cache (--kv-dtype fp8)|$model|gpu|--kv-dtype fp8")
done
echo "| weights | device | perplexity | KL divergence, mean | KL, 99th percentile | same top token |"
echo "|---|---|---|---|---|---|"
"$python" - "$work/reference.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"| float32 (the reference backend) | cpu | {r['perplexity']:.4f} | 0 | 0 | 100% |")
PY
i=0
for row in "${rows[@]}"; do
  IFS='|' read -r label file device extra <<<"$row"
  say "$label on $device"
  # shellcheck disable=SC2086
  ppl -m "$file" --device "$device" $extra --kl-divergence "$work/ref.bin" >"$work/run$i.json"
  "$python" - "$work/run$i.json" "$label" "$device" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['perplexity']:.4f} | {r['kl_divergence']:.6f} | "
      f"{r['kl_divergence_p99']:.6f} | {100 * r['top_token_agreement']:.2f}% |")
PY
  i=$((i + 1))
done
say "reports in $work"
