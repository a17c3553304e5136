#!/usr/bin/env bash
# The book's (docs/) GPU figures in one go, on the GPU machine: every lesson step that
# `rustle bench --lesson` times, and the `rustle profile` runs whose saved copies are
# docs/profile-*.json and docs/roofline-*.svg/png. Needs only the rustle binary (no cargo):
#
#   here:   cargo build --release            # then copy target/release/rustle over
#   there:  scripts/lesson-figures.sh RUSTLE_BIN OUT_DIR [GPU_TEST_BIN]
#
# GPU_TEST_BIN, optional: the `gpu` test executable that `cargo test --release --no-run`
# lists (tests/gpu.rs); given, its kernel tests run first (`kernel::`: every kernel against
# its CPU twin, the lesson's steps among them; no model needed), into kernel-tests.txt.
#
# Writes under OUT_DIR (created; must be empty or new):
#
#   RUN.txt                      date (UTC), machine, GPU (nvidia-smi), binary, and each
#                                command with its exit status and seconds
#   kernel-tests.txt             the kernel tests (with GPU_TEST_BIN only)
#   lesson-llama3-8b.txt         rustle bench --lesson --shape llama3-8b (prompts of 512)
#   lesson-llama3-8b.json        the same figures as JSON (a second run, --json; its stderr in
#                                lesson-llama3-8b.json.stderr)
#   lesson-llama3-8b-2048.txt    rustle bench --lesson --shape llama3-8b --prompt-len 2048
#   lesson-llama3.2-1b.txt       rustle bench --lesson --shape llama3.2-1b
#   profile-512/                 rustle profile --shape llama3-8b --prompt-len 512 --steps 16
#                                (profile.json, roofline.svg, roofline.png; table in
#                                profile-512.txt)
#   profile-2048/                the same with --prompt-len 2048 (table in profile-2048.txt)
#   docs/                        the files to copy over docs/ as they are named there:
#                                profile-llama3-8b-h200.json, roofline-llama3-8b-h200.svg,
#                                roofline-llama3-8b-h200.png, profile-llama3-8b-2048-h200.json
#   FILL.txt                     which output line fills which figure of the book
#
# Each command's stderr goes to its .txt too. A command that fails is recorded in RUN.txt
# and the script goes on; it exits with the number of failed commands.
set -u

usage() {
  echo "usage: scripts/lesson-figures.sh RUSTLE_BIN OUT_DIR [GPU_TEST_BIN]" >&2
  exit 2
}
[ $# -eq 2 ] || [ $# -eq 3 ] || usage
bin=$1
out=$2
gpu_tests=${3:-}
[ -x "$bin" ] || { echo "lesson-figures: $bin is not an executable" >&2; exit 2; }
if [ -n "$gpu_tests" ] && [ ! -x "$gpu_tests" ]; then
  echo "lesson-figures: $gpu_tests is not an executable" >&2
  exit 2
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "lesson-figures: $out is not empty" >&2
  exit 2
fi
mkdir -p "$out/docs"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
run_txt="$out/RUN.txt"
failed=0

{
  echo "lesson-figures.sh, started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "machine: $(uname -n), $(nproc) CPUs, $(uname -sr)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  else
    echo "GPU: nvidia-smi not found (rustle prints the GPU it found in each output)"
  fi
  echo "binary: $bin ($(stat -c '%s bytes, modified %y' "$bin"))"
  echo "binary sha256: $(sha256sum "$bin" | cut -d' ' -f1)"
  echo
} >"$run_txt"

# `step FILE CMD...`: runs CMD with stdout and stderr into FILE (stderr into FILE.stderr for
# a .json FILE, which stays pure JSON), and records it in RUN.txt.
step() {
  local file=$1
  shift
  local start end status err=$file
  case $file in *.json) err=$file.stderr ;; esac
  echo "== $* > $(basename "$file")" | tee -a "$run_txt"
  start=$(date +%s)
  "$@" >"$file" 2>>"$err"
  status=$?
  end=$(date +%s)
  echo "   exit $status, $((end - start)) s, $(date -u '+%Y-%m-%d %H:%M UTC')" | tee -a "$run_txt"
  if [ "$status" -ne 0 ]; then
    failed=$((failed + 1))
    tail -5 "$err" | sed 's/^/   | /' | tee -a "$run_txt"
  fi
}

# The kernels against their twins first, where the test executable is given: a figure of a
# kernel that fails its test is worth nothing.
if [ -n "$gpu_tests" ]; then
  step "$out/kernel-tests.txt" "$gpu_tests" kernel::
fi

# The lesson's steps: the 8B shape (the book's figures), its JSON, a 2048-token prompt, and
# the 1B shape (as the notebook's first run of the GEMV steps did both).
step "$out/lesson-llama3-8b.txt" "$bin" bench --lesson --shape llama3-8b
step "$out/lesson-llama3-8b.json" "$bin" bench --lesson --shape llama3-8b --json
step "$out/lesson-llama3-8b-2048.txt" "$bin" bench --lesson --shape llama3-8b --prompt-len 2048
step "$out/lesson-llama3.2-1b.txt" "$bin" bench --lesson --shape llama3.2-1b

# The saved profiles of docs/ (chapter 8; the notebook's "Prefill against the compute roof"):
# the commands that made them.
step "$out/profile-512.txt" "$bin" profile --shape llama3-8b --prompt-len 512 --steps 16 --out "$out/profile-512"
step "$out/profile-2048.txt" "$bin" profile --shape llama3-8b --prompt-len 2048 --steps 16 --out "$out/profile-2048"
cp_doc() {
  if [ -f "$1" ]; then cp "$1" "$out/docs/$2"; else echo "   missing: $1" | tee -a "$run_txt"; fi
}
cp_doc "$out/profile-512/profile.json" profile-llama3-8b-h200.json
cp_doc "$out/profile-512/roofline.svg" roofline-llama3-8b-h200.svg
cp_doc "$out/profile-512/roofline.png" roofline-llama3-8b-h200.png
cp_doc "$out/profile-2048/profile.json" profile-llama3-8b-2048-h200.json

echo "finished $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $failed commands failed" >>"$run_txt"

cat >"$out/FILL.txt" <<'EOF'
Where each figure of this run goes. The book quotes the benchmark notebook only
(bench/history/rounds.md; tests/docs.rs checks every quoted figure, command, round and date
against it), so: first the figures into a new round at the end of the notebook, headed
"### N. The lesson's steps measured again (DATE)" (date and GPU from RUN.txt, the command
from the first line of each file), then into docs/figures.md (each row: the figure in double
quotes, the date, the GPU, the command, "round N"; the heading's date must be the figure's
date) and the chapters' "## Measured on the H200" sections, as blockquotes naming round,
date, GPU and command. What the run changes in a lasting way goes to docs/lessons.md.

1. lesson-llama3-8b.txt  (rustle bench --lesson --shape llama3-8b)
   "ceilings measured in this run: ..."  -> the new round: the ceilings every share is of
   [gemv]       -> nothing to fill (the GEMV steps' earlier figures; a check that they hold)
   [residual]   the 2 lines residual_add_f32, "decode: 1 x 4096" and "prompt: 512 x 4096"
                -> docs/figures.md, chapter 2 row "the residual add, `residual_add_f32`, alone"
                -> docs/02-first-kernel.md, "## Measured on the H200" (replace "Not measured
                   yet" by a blockquote: "> Round N, DATE, NVIDIA H200 ..., `rustle bench
                   --lesson --shape llama3-8b`: "...""
   [reduction]  the 6 lines sum_step1_warp_f32, sum_step2_block_f32, rmsnorm_f32 on both
                cases
                -> docs/figures.md, chapter 4 row "`warp_sum`, `block_sum` alone: ..."
                -> docs/04-rmsnorm-and-reductions.md, "## Measured on the H200", the
                   paragraph "The warp and block reductions alone ... are not measured yet"
   [gemm]       4 matrices x (gemm_step1_simt_bf16, gemm_mma_bf16, gemm_wgmma_bf16 with the
                forward's plan, cuBLAS)
                -> docs/figures.md, chapter 5 row "`gemm_step1_simt_bf16` beside ..."
                -> docs/05-gemm.md, "## Measured on the H200", first paragraph ("Step 1
                   beside the kernels the forward pass launches ... is not measured yet")
   [attention]  attention_f32, attention_bf16, attention_mma_bf16 on the 512-token prompt
                -> docs/figures.md, chapter 6 row "`attention_f32` beside ..."
                -> docs/06-attention.md, "## Measured on the H200", first paragraph
2. lesson-llama3-8b-2048.txt, lesson-llama3.2-1b.txt: the same tables for a 2048-token
   prompt and for the 1B shape; for the new round (optional in the chapters)
3. lesson-llama3-8b.json: the 8B run again, unrounded (us, bytes, flops per kernel)
4. docs/*: copy over the repository's docs/ (same names). They replace the profiles saved
   there (commit c3180ee's code), so these become stale and need the new run's figures
   from profile-512.txt / profile-2048.txt (the table rustle profile prints):
   -> docs/08-roofline.md: "## rustle's own chart" (the prefill GEMM's and the decode
      GEMVs' places) and the blockquotes of "## Measured on the H200" that name the run
      saved as `docs/profile-llama3-8b-h200.json`
   -> the new round of the notebook: the profiles' commit, and that docs/ now holds them
   -> README.md, the paragraph under the roofline image ("`docs/` holds that run
      (2026-11-30, H200, the first command): ..."): ceilings (copy TB/s, cuBLAS, rustle's
      GEMM, mma.sync peak), decode GEMVs' TB/s, the prefill GEMM's FLOP/byte, TFLOP/s and
      share of the roof at 512 and 2048, the attention's ms
EOF

echo "lesson-figures: wrote $out ($failed commands failed); see $out/RUN.txt and $out/FILL.txt"
exit "$failed"
