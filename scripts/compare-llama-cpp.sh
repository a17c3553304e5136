#!/usr/bin/env bash
# rustle against llama.cpp on the CPU: the same GGUF file, the same number of threads, runs
# interleaved (rustle, llama.cpp, rustle, llama.cpp, ...) so that whatever else the machine
# does falls on both; min and median of each. The comparison anyone can repeat:
#
#   scripts/compare-llama-cpp.sh                       # the default model, all cores, 5 rounds
#   scripts/compare-llama-cpp.sh --model x.Q8_0.gguf --threads 4 --rounds 9 --json out.json
#
# llama.cpp comes from a released source package: the copy vendored in llama-cpp-python's
# source distribution on PyPI, fetched by pip, built by the cmake and ninja that pip installs
# into a virtual environment of its own (the first run takes minutes on two cores; later runs
# find the binary and skip it). Run with --help for the flags.
set -euo pipefail

# The pin. llama-cpp-python 0.3.36 vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG.md).
# Changing it builds afresh in a folder of its own.
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_COMMIT=0c1e57098

usage() {
  cat <<EOF
Usage: scripts/compare-llama-cpp.sh [--model PATH] [--threads N] [--rounds R] [--json FILE]

Decode and prefill speed of rustle (--device cpu) and llama.cpp's llama-bench on one GGUF
file with the same threads, measured in turns, R rounds of each; prints min and median of
each engine and the ratio of the medians (rustle / llama.cpp, above 1 means rustle is faster).

  decode   128 tokens generated one at a time at the start of a context
           (llama-bench -p 0 -n 128; rustle bench --serve --cpu --prompt-len 1
           --output-len 129: the 128 steps after the first token)
  prefill  one 128-token prompt in one forward pass
           (llama-bench -p 128 -n 0; rustle's time to first token on a 128-token prompt)

Both run random token ids, ignore end-of-sequence, and warm up before they time.

Options:
  --model PATH    a .gguf file (default: rustle's default model,
                  \$XDG_CACHE_HOME/rustle/SmolLM2-135M-Instruct.Q4_1.gguf, fetched if missing)
  --threads N     threads for both engines (default: every core, $(cores))
  --rounds R      measurements of each engine (default 5)
  --json FILE     also write every measured figure to FILE
  --cache DIR     where llama.cpp is built (default: \$XDG_CACHE_HOME/rustle/llama.cpp,
                  or \$RUSTLE_LLAMA_CPP_CACHE)
  -h, --help      this text

Environment:
  RUSTLE_BIN      a rustle binary to use instead of building one (cargo build --release)
  XDG_CACHE_HOME  the cache root (default ~/.cache)

llama.cpp: llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION from PyPI (its vendored llama.cpp,
ggml-org/llama.cpp@$LLAMA_CPP_COMMIT), built Release, CPU only, for this CPU (GGML_NATIVE).
Needs python3 with venv and pip, a C and C++ compiler, network access to PyPI on the first run,
and cargo unless RUSTLE_BIN is set.
EOF
}

say() { echo "compare-llama-cpp: $*" >&2; }
die() {
  echo "compare-llama-cpp: error: $*" >&2
  exit 1
}
cores() { nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }

# ---- flags ---------------------------------------------------------------------------------

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/rustle"
model=""
threads=$(cores)
rounds=5
json_out=""
cache="${RUSTLE_LLAMA_CPP_CACHE:-$cache_root/llama.cpp}"
# Token counts of the two measurements: llama-bench's defaults, and the issue's targets.
decode_tokens=128
prompt_tokens=128

value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a whole number above 0, got '$2'"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) value "$@"; model=$2; shift 2 ;;
    --threads) value "$@"; positive "$1" "$2"; threads=$2; shift 2 ;;
    --rounds) value "$@"; positive "$1" "$2"; rounds=$2; shift 2 ;;
    --json) value "$@"; json_out=$2; shift 2 ;;
    --cache) value "$@"; cache=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
need python3 "install Python 3 (with its venv module and pip); llama.cpp's build tools and the report need it"

# ---- llama.cpp, from llama-cpp-python's source distribution -------------------------------

# Runs a build step with its output appended to $build_log; shows only ninja's "[n/total]"
# progress lines, and on failure the log's last lines and one line saying what failed.
build_log=""
logged() {
  local what=$1
  shift
  if ! "$@" 2>&1 | tee -a "$build_log" | { grep --line-buffered -E '^\[[0-9]+/[0-9]+\]' >&2 || true; }; then
    tail -n 30 "$build_log" >&2
    die "$what (the whole log: $build_log)"
  fi
}

build_llama_cpp() {
  local dir=$1
  need "${CC:-cc}" "install a C compiler (gcc or clang) to build llama.cpp, or set CC"
  need "${CXX:-c++}" "install a C++ compiler (g++ or clang++) to build llama.cpp, or set CXX"
  mkdir -p "$dir"
  build_log="$dir/build.log"
  say "building llama.cpp in $dir (its log: $build_log)"
  local venv="$dir/venv"
  if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
    say "creating a virtual environment with cmake and ninja from PyPI"
    logged "python3 -m venv failed (on Debian and Ubuntu: apt install python3-venv)" \
      python3 -m venv "$venv"
    # scikit-build-core is llama-cpp-python's build backend: pip runs it to read the source
    # package's metadata even for `download`, and without --no-build-isolation it would build
    # the backend's own requirements (cmake among them) from source under --no-binary :all:.
    logged "pip could not install cmake, ninja and scikit-build-core (is PyPI reachable?)" \
      "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
      cmake ninja scikit-build-core
  fi
  local sdist="$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    say "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (source, 77 MB) from PyPI"
    logged "pip could not download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
      "$venv/bin/python" -m pip download --disable-pip-version-check --progress-bar off \
      --no-binary :all: --no-deps --no-build-isolation --dest "$dir" \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    [ -f "$sdist" ] || die "pip downloaded llama-cpp-python but $sdist is not there"
  fi
  local src="$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    say "unpacking $(basename "$sdist")"
    tar -xzf "$sdist" -C "$dir" || die "could not unpack $sdist"
    [ -f "$src/CMakeLists.txt" ] || die "$sdist holds no vendor/llama.cpp/CMakeLists.txt"
  fi
  local jobs
  jobs=$(cores)
  say "configuring llama.cpp: Release, CPU only, for this CPU (GGML_NATIVE: -march=native)"
  logged "cmake could not configure llama.cpp" \
    env PATH="$venv/bin:$PATH" cmake -S "$src" -B "$dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
  # llama-bench alone: it times both prompt processing and generation.
  say "building llama-bench with $jobs jobs: minutes on a few cores (about 5 on two)"
  logged "llama.cpp did not build" \
    env PATH="$venv/bin:$PATH" cmake --build "$dir/build" --target llama-bench -j "$jobs"
}

llama_dir="$cache/$LLAMA_CPP_PYTHON_VERSION"
llama_bench="$llama_dir/build/bin/llama-bench"
if [ -x "$llama_bench" ]; then
  say "llama.cpp: $llama_bench (built before; delete $llama_dir to rebuild)"
else
  build_llama_cpp "$llama_dir"
  [ -x "$llama_bench" ] || die "the build finished but $llama_bench is not there"
fi

# ---- rustle ---------------------------------------------------------------------------------

if [ -n "${RUSTLE_BIN:-}" ]; then
  [ -x "$RUSTLE_BIN" ] || die "RUSTLE_BIN=$RUSTLE_BIN is not an executable file"
  rustle=$RUSTLE_BIN
else
  need cargo "install Rust (https://rustup.rs), or set RUSTLE_BIN to a rustle binary"
  say "building rustle (cargo build --release)"
  (cd "$repo" && cargo build --release) || die "cargo build --release failed"
  rustle="$repo/target/release/rustle"
fi

# ---- the model ------------------------------------------------------------------------------

if [ -z "$model" ]; then
  model="$cache_root/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ ! -f "$model" ]; then
    say "fetching rustle's default model: $rustle -p hi -n 1 --device cpu"
    "$rustle" -p hi -n 1 --device cpu >/dev/null || die "rustle could not fetch its default model"
    [ -f "$model" ] || die "rustle ran but $model is not there"
  fi
fi
[ -f "$model" ] || die "$model: no such file"
case "$model" in *.gguf) ;; *) die "$model: not a .gguf file (llama.cpp reads GGUF only)" ;; esac

# ---- the measurements -----------------------------------------------------------------------

raw=$(mktemp)
log=$(mktemp)
trap 'rm -f "$raw" "$log"' EXIT

# One line of $raw per figure: "figure ENGINE MEASUREMENT MILLISECONDS TOKENS"; and one per
# round: "load ROUND LOADAVG" (the machine's 1-minute load average as the round began).

# rustle's serving benchmark on the CPU: one request of random token ids that ignores
# end-of-sequence, after a warm-up request. Its time to first token is the prompt's forward
# pass (and the first token's sampling); its time per output token is the mean of the steps
# after that. RAYON_NUM_THREADS sizes the pool the CPU backend's operations run on.
rustle_cmd() { # prompt output
  echo RAYON_NUM_THREADS="$threads" "$rustle" bench --serve --cpu --model "$model" --requests 1 \
    --prompt-len "$1" --output-len "$2" --no-prefix-cache --json
}
rustle_run() {
  local what=$1 prompt=$2 output=$3 out
  out=$(RAYON_NUM_THREADS=$threads "$rustle" bench --serve --cpu --model "$model" --requests 1 \
    --prompt-len "$prompt" --output-len "$output" --no-prefix-cache --json 2>"$log") || {
    cat "$log" >&2
    die "rustle bench --serve --cpu failed on $model"
  }
  python3 - "$what" "$prompt" "$output" "$out" >>"$raw" <<'EOF' || die "rustle's report: see above"
import json, sys
what, prompt, output, r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
if r["prompt_tokens"] != prompt or r["output_tokens"] != output:
    sys.exit(f"rustle ran {r['prompt_tokens']} prompt and {r['output_tokens']} generated tokens, "
             f"wanted {prompt} and {output}")
if what == "prefill":
    print("figure rustle", what, r["ttft_ms"]["p50"], prompt)
else:
    # The output - 1 steps after the first token, each one token.
    print("figure rustle", what, r["tpot_ms"]["p50"] * (output - 1), output - 1)
EOF
}

# llama-bench: one repetition (-r 1) after its own warm-up run.
llama_cmd() { # prompt gen
  echo "$llama_bench" -m "$model" -t "$threads" -p "$1" -n "$2" -r 1 -o json
}
llama_run() {
  local what=$1 prompt=$2 gen=$3 out
  out=$("$llama_bench" -m "$model" -t "$threads" -p "$prompt" -n "$gen" -r 1 -o json 2>"$log") || {
    cat "$log" >&2
    die "llama-bench failed on $model"
  }
  python3 - "$what" "$prompt" "$gen" "$out" >>"$raw" <<'EOF' || die "llama-bench's report: see above"
import json, sys
what, prompt, gen, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
if len(runs) != 1 or runs[0]["n_prompt"] != prompt or runs[0]["n_gen"] != gen:
    sys.exit(f"llama-bench ran {[(r['n_prompt'], r['n_gen']) for r in runs]}, wanted {(prompt, gen)}")
print("figure llama.cpp", what, runs[0]["avg_ns"] / 1e6, prompt + gen)
EOF
}

say "model $model, $threads threads, $rounds rounds; rustle $rustle, llama.cpp $llama_bench"
for ((round = 1; round <= rounds; round++)); do
  echo "load $round $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo -)" >>"$raw"
  say "round $round of $rounds: decode"
  rustle_run decode 1 $((decode_tokens + 1))
  llama_run decode 0 "$decode_tokens"
  say "round $round of $rounds: prefill"
  rustle_run prefill "$prompt_tokens" 1
  llama_run prefill "$prompt_tokens" 0
done

# ---- the report -----------------------------------------------------------------------------

python3 - "$raw" "$json_out" "$model" "$threads" "$rounds" "$(cores)" \
  "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (ggml-org/llama.cpp@$LLAMA_CPP_COMMIT)" \
  "$(rustle_cmd 1 $((decode_tokens + 1)))" "$(llama_cmd 0 "$decode_tokens")" \
  "$(rustle_cmd "$prompt_tokens" 1)" "$(llama_cmd "$prompt_tokens" 0)" <<'EOF'
import json, platform, statistics, sys, time
(raw, json_out, model, threads, rounds, cores, llama_version,
 rustle_decode, llama_decode, rustle_prefill, llama_prefill) = sys.argv[1:]
commands = {"decode": {"rustle": rustle_decode, "llama.cpp": llama_decode},
            "prefill": {"rustle": rustle_prefill, "llama.cpp": llama_prefill}}
figures, load = {}, []
for line in open(raw):
    kind, *rest = line.split()
    if kind == "figure":
        engine, what, ms, tokens = rest
        figures.setdefault((engine, what), []).append((float(ms), int(tokens)))
    else:
        load.append(rest[1])

def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "model": model, "cpu": cpu_name(),
          "cores": int(cores), "threads": int(threads), "rounds": int(rounds),
          "load_average_at_each_round": load, "llama_cpp": llama_version, "measurements": {}}
print(f"model      {model}")
print(f"cpu        {cpu_name()}: {cores} cores; {threads} threads each, {rounds} rounds, interleaved")
print(f"llama.cpp  {llama_version}, llama-bench")
print(f"load       1-minute load average as each round began: {' '.join(load)}")
print()
w = 31
print(f"{'':{w}}  {'rustle':^25}  {'llama.cpp':^25}  rustle/llama.cpp")
print(f"{'':{w}}  {'min':>8} {'median':>8} {'tok/s':>7}  {'min':>8} {'median':>8} {'tok/s':>7}  (median tok/s)")
rows = [("decode", "decode, 128 tokens", "ms/token"), ("prefill", "prefill, 128-token prompt", "ms")]
for what, label, unit in rows:
    cells, speeds, entry = [], [], {}
    for engine in ("rustle", "llama.cpp"):
        runs = figures[(engine, what)]
        tokens = runs[0][1]
        # Decode per token; prefill the whole prompt.
        per = [ms / tokens if what == "decode" else ms for ms, _ in runs]
        med = statistics.median(per)
        speed = tokens * 1e3 / (med * (tokens if what == "decode" else 1))
        speeds.append(speed)
        cells.append(f"{min(per):8.2f} {med:8.2f} {speed:7.1f}")
        key = unit.replace("/", "_per_")
        entry[engine] = {"command": commands[what][engine], "tokens": tokens,
                         "ms_each_round": [ms for ms, _ in runs], f"min_{key}": min(per),
                         f"median_{key}": med, "median_tok_per_s": speed}
    entry["ratio_of_medians"] = speeds[0] / speeds[1]
    report["measurements"][what] = entry
    print(f"{label + ' (' + unit + ')':{w}}  {cells[0]}  {cells[1]}  {speeds[0] / speeds[1]:.2f}x")
print()
print("min and median of the times; tok/s from the median; the ratio is rustle's speed over llama.cpp's")
print(f"(above 1: rustle is faster). The runs themselves add about {threads} to the load average;")
print("more than that means other work shared the CPU and the figures are not the engines' own.")
if json_out:
    with open(json_out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"compare-llama-cpp: every figure written to {json_out}", file=sys.stderr)
EOF
