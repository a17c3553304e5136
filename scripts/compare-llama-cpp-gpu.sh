#!/usr/bin/env bash
# rustle against llama.cpp on the GPU: the same GGUF file of a named shape (random weights,
# scripts/make-shape-gguf.py, quantized by llama.cpp's own llama-quantize), batched decode
# measured in turns (rustle, llama.cpp, rustle, llama.cpp, ...) as llama-batched-bench measures
# it: each sequence prefilled with 512 tokens, then 128 new tokens each.
#
#   scripts/compare-llama-cpp-gpu.sh --shape qwen3-30b-a3b --layers 12 --type Q4_K_M --batch 1,64
#
# For a GPU machine with CUDA's compiler, cmake, ninja and python3 with numpy (torch, where
# installed, draws the weights on the GPU). The machine needs no network when --llama-src
# names llama.cpp's source (an unpacked tree, or a .tar.gz / .tar.xz holding `llama.cpp/`);
# otherwise it takes the pinned source scripts/compare-llama-cpp.sh fetched into the cache.
# Run with --help for the flags.
#
# Round 76 of bench/history/rounds.md ran these steps by hand on an H100; the script's own flow
# has been checked against llama.cpp's CPU build and a stand-in for rustle, not yet on a GPU.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36 # compare-llama-cpp.sh's pin (ggml-org/llama.cpp@0c1e57098)

usage() {
  cat <<EOF
Usage: scripts/compare-llama-cpp-gpu.sh --shape NAME [--layers N] [--type TYPE] [--batch N,N]
                                        [--rounds R] [--work DIR] [--llama-src PATH] [--json FILE]

Builds llama.cpp with CUDA (llama-quantize, llama-bench, llama-batched-bench), writes a GGUF
file of the shape with random bf16 weights, quantizes it to TYPE, then times batched decode of
both engines on that one file in turns, R rounds: rustle bench -m FILE --batch B --prompt-len
512 --steps 128, and llama-batched-bench -npp 512 -ntg 128 -npl B with flash attention. Prints
each engine's min and median tok/s and the ratio of the medians for each number of sequences
(above 1: rustle is faster), and llama-bench's tg128 and pp512 on the file once.

  --shape NAME      llama3-8b, qwen3-8b or qwen3-30b-a3b (scripts/make-shape-gguf.py)
  --layers N        keep the first N layers (default: all; the disk holds the bf16 file
                    and the quantized one at once)
  --type TYPE       llama-quantize's type: Q4_K_M (default), Q8_0, Q6_K, BF16, ...
  --batch N,N       numbers of sequences (default 1,64)
  --rounds R        turns of each engine (default 2)
  --work DIR        where llama.cpp is built and the files are written (default
                    \$XDG_CACHE_HOME/rustle/llama.cpp-gpu); a file already there is reused
  --llama-src PATH  llama.cpp's source (a folder, or an archive holding llama.cpp/; default:
                    the pinned copy scripts/compare-llama-cpp.sh unpacks in the cache)
  --json FILE       also write every figure to FILE
  -h, --help        this text

Environment: RUSTLE_BIN (default target/release/rustle), CUDA_ARCH (default 90).
EOF
}

say() { echo "compare-llama-cpp-gpu: $*" >&2; }
die() {
  echo "compare-llama-cpp-gpu: error: $*" >&2
  exit 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }
value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shape="" layers="" type=Q4_K_M batch=1,64 rounds=2 src="" json_out=""
work="${XDG_CACHE_HOME:-$HOME/.cache}/rustle/llama.cpp-gpu"
while [ $# -gt 0 ]; do
  case "$1" in
    --shape) value "$@"; shape=$2; shift 2 ;;
    --layers) value "$@"; layers=$2; shift 2 ;;
    --type) value "$@"; type=$2; shift 2 ;;
    --batch) value "$@"; batch=$2; shift 2 ;;
    --rounds) value "$@"; rounds=$2; shift 2 ;;
    --work) value "$@"; work=$2; shift 2 ;;
    --llama-src) value "$@"; src=$2; shift 2 ;;
    --json) value "$@"; json_out=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$shape" ] || die "--shape is required (see --help)"
[[ "$batch" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--batch takes numbers like 1,64, got '$batch'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a whole number above 0, got '$rounds'"
[ -z "$layers" ] || [[ "$layers" =~ ^[1-9][0-9]*$ ]] || die "--layers must be a whole number, got '$layers'"
rustle=${RUSTLE_BIN:-$repo/target/release/rustle}
[ -x "$rustle" ] || die "no rustle at $rustle (cargo build --release, or set RUSTLE_BIN)"
need nvcc "this script builds llama.cpp with CUDA"
need cmake "install cmake (pip install cmake)"
need ninja "install ninja (pip install ninja)"
need python3 "the GGUF writer and the report need it"
mkdir -p "$work"

# ---- llama.cpp's source and its CUDA build ---------------------------------------------------

tree="$work/src/llama.cpp"
if [ ! -f "$tree/CMakeLists.txt" ]; then
  mkdir -p "$work/src"
  if [ -z "$src" ]; then
    # The pinned source as scripts/compare-llama-cpp.sh fetches and unpacks it.
    src="${XDG_CACHE_HOME:-$HOME/.cache}/rustle/llama.cpp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp source at $src: run scripts/compare-llama-cpp.sh once (it fetches llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION's source), or pass --llama-src"
  fi
  if [ -d "$src" ]; then
    ln -sfn "$(cd "$src" && pwd)" "$tree"
  else
    tar -xf "$src" -C "$work/src" || die "could not unpack $src"
  fi
  [ -f "$tree/CMakeLists.txt" ] || die "no llama.cpp/CMakeLists.txt in what --llama-src gave"
fi
bin="$work/build/bin"
if [ ! -x "$bin/llama-batched-bench" ] || [ ! -x "$bin/llama-quantize" ] || [ ! -x "$bin/llama-bench" ]; then
  say "building llama.cpp with CUDA for sm_${CUDA_ARCH:-90} (minutes; its log: $work/build.log)"
  cmake -S "$tree" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log" >&2; die "cmake could not configure llama.cpp"; }
  cmake --build "$work/build" -j "$(nproc)" --target llama-quantize llama-bench \
    llama-batched-bench >>"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log" >&2; die "llama.cpp did not build"; }
fi

# ---- the file ------------------------------------------------------------------------------

name="$shape${layers:+-${layers}l}"
model="$work/$name.$(echo "$type" | tr 'A-Z' 'a-z').gguf"
if [ ! -f "$model" ]; then
  bf16="$work/$name.bf16.gguf"
  if [ ! -f "$bf16" ]; then
    say "writing $bf16"
    GGUF_PY="$tree/gguf-py" python3 "$repo/scripts/make-shape-gguf.py" --shape "$shape" \
      ${layers:+--layers "$layers"} --out "$bf16.part" || die "the GGUF writer failed"
    mv "$bf16.part" "$bf16"
  fi
  if [ "$type" = BF16 ]; then
    model=$bf16
  else
    say "quantizing to $type"
    "$bin/llama-quantize" "$bf16" "$model.part" "$type" "$(nproc)" >"$work/quantize.log" 2>&1 ||
      { tail -5 "$work/quantize.log" >&2; die "llama-quantize failed"; }
    mv "$model.part" "$model"
    rm -f "$bf16" # the disk may not hold many of these
  fi
fi
ls -l "$model" >&2

# ---- the turns -----------------------------------------------------------------------------

out="$work/runs"
rm -rf "$out" && mkdir -p "$out"
most=$(echo "$batch" | tr ',' '\n' | sort -n | tail -1)
for r in $(seq "$rounds"); do
  say "round $r of $rounds: rustle"
  "$rustle" bench -m "$model" --batch "$batch" --prompt-len 512 --steps 128 --json \
    >"$out/rustle-$r.json" 2>"$out/rustle-$r.err" || { tail -5 "$out/rustle-$r.err" >&2; die "rustle bench failed"; }
  say "round $r of $rounds: llama-batched-bench"
  "$bin/llama-batched-bench" -m "$model" -ngl 99 -fa on -c $((most * 640)) -b 2048 -ub 512 \
    -npp 512 -ntg 128 -npl "$batch" --output-format jsonl >"$out/llama-$r.jsonl" 2>"$out/llama-$r.err" ||
    { tail -5 "$out/llama-$r.err" >&2; die "llama-batched-bench failed"; }
done
say "llama-bench once: tg128 and pp512"
"$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json >"$out/llama-bench.json" \
  2>"$out/llama-bench.err" || say "llama-bench failed (its log: $out/llama-bench.err)"

python3 - "$out" "$rounds" "$model" "$json_out" <<'PY'
import json, statistics, sys
out, rounds, model, json_out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ours, theirs = {}, {}
for r in range(1, rounds + 1):
    for row in json.load(open(f"{out}/rustle-{r}.json")):
        ours.setdefault(row["sequences"], []).append(row)
    for line in open(f"{out}/llama-{r}.jsonl"):
        if line.strip():
            row = json.loads(line)
            theirs.setdefault(row["pl"], []).append(row["speed_tg"])
print(f"{model}: decode tok/s, {rounds} rounds in turns (min / median)")
print("| sequences | rustle | of its ceiling | llama.cpp | rustle / llama.cpp |")
print("|---|---|---|---|---|")
figures = []
for n in sorted(ours):
    a = [x["decode_tok_per_s"] for x in ours[n]]
    share = statistics.median(x["decode_tok_per_s"] / x["ceiling_tok_per_s"] for x in ours[n])
    b = theirs.get(n, [])
    ratio = statistics.median(a) / statistics.median(b) if b else float("nan")
    print(f"| {n} | {min(a):,.1f} / {statistics.median(a):,.1f} | {share:.1%} | "
          f"{min(b):,.1f} / {statistics.median(b):,.1f} | {ratio:.2f}x |" if b else f"| {n} | ... | no llama.cpp figure |")
    figures.append({"sequences": n, "rustle": a, "share_of_ceiling": share, "llama.cpp": b, "ratio": ratio})
try:
    for row in json.load(open(f"{out}/llama-bench.json")):
        what = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        print(f"llama-bench {what}: {row['avg_ts']:,.1f} tok/s (+- {row['stddev_ts']:,.1f})")
        figures.append({"llama-bench": what, "tok/s": row["avg_ts"]})
except (OSError, ValueError):
    print("llama-bench: no figure")
if json_out:
    json.dump({"model": model, "figures": figures}, open(json_out, "w"), indent=1)
PY
