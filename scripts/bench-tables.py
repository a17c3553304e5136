#!/usr/bin/env python3
"""Make BENCHMARKS.md from the result records in bench/results/ (python3, stdlib only).

    scripts/bench-tables.py            # write BENCHMARKS.md
    scripts/bench-tables.py --check    # exit 1 (with a diff) if BENCHMARKS.md is not what
                                       # the records make; tests/docs.rs runs this
    scripts/bench-tables.py --records DIR --print   # the tables of other records, to stdout

A record is one JSON file in bench/results/, named DATE-GPU-WHAT.json, one sitting's figure:

    {
      "kind": "rustle-bench",
      "commit": "b998b09",          the code that ran (git rev-parse --short HEAD)
      "date": "2026-12-06",         the day of the sitting (UTC)
      "time": "09:52",              optional: the hour of the run (UTC), to order the records
                                    of one day (one without a time counts as the day's first)
      "gpu": "H100",                the GPU, short: H100, H200 (the report's own name must
                                    contain it)
      "command": "rustle bench --shape llama3-8b --weights q4_k_m --ctx 512,8192 --json",
      "report": ...,                what that command printed, pasted unchanged
      "anchor": {                   optional: another engine measured in the same sitting
        "engine": "llama.cpp (build N) llama-bench, CUDA sm_90, flash attention",
        "command": "llama-bench -m llama3-8b-bf16.gguf -fa 1 -p 0 -n 128",
        "figures": [{"ctx": 512, "tok/s": "174.0-174.1"}]
      },
      "note": "optional: one line shown under the table"
    }

The report is whichever `rustle bench --json` wrote: `--verify` (a list,
engine/tools/speculate_bench.rs's VerifyCost: a row a pass size), `--speculate` (an object with
"runs", its SpeculateReport), batch 1 (an object with "decode",
engine/tools/bench.rs's BenchReport: a row a context with graphs on, and the prefill), `--batch`
(a list, engine/tools/batch_bench.rs's BatchResult: a row a number of sequences) or `--serve`
(an object with "workload", engine/tools/serve_bench.rs's ServeReport). The shape and weights
come from the command's --shape and --weights (defaults llama3-8b, bf16). An anchor figure
goes beside the rows whose keys it names (ctx, sequences, tokens, weights); "date" in the
anchor says it was measured in another sitting.

A "transcribed" record holds figures copied by hand from a round of the notebook
(bench/history/rounds.md) or from the design notes, until a machine record replaces them:
"source" says where ({"history": ["54", "Quantized weights against their targets"]}: rounds
by number, other sections by the start of their heading; or {"design_notes": "..."}), "rows"
hold the cells as the source writes them, and every number of a row's figures must occur in
the history sections named, which this script checks. A "{weights}" in its command is the
row's weights.

Each table keeps the newest row of each key (GPU, shape, weights, batch, context; by date, then
time, a machine record before a transcribed one of the same day); an older row stays in its record.
"""

import argparse
import difflib
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HISTORY = "bench/history/rounds.md"
WEIGHTS_ORDER = ["bf16", "fp8", "q8_0", "q6_k", "q5_k_m", "q5_k", "q5_1", "q5_0", "q4_k_m",
                 "q4_k", "q4_1", "q4_0", "stored"]

# Each table: its heading, the cells of its key (after GPU, shape, weights), its figures.
TABLES = {
    "decode": ("Batch 1 decode", ["context"],
               ["tok/s", "share of copy bandwidth (ceiling tok/s)", "anchor"]),
    "prefill": ("Prefill", ["prompt tokens"],
                ["ms", "tok/s", "prompt matmuls, cuBLAS time / ours", "anchor"]),
    "batched": ("Batched decode", ["sequences", "prompt + steps"],
                ["decode tok/s", "of ceiling (ceiling tok/s)", "ms a step",
                 "anchor"]),
    "serve": ("Serving (the engine alone)", ["workload", "requests", "rate (req/s)",
                                              "token budget"],
              ["output tok/s", "TTFT p50 / p99 (ms)", "TPOT p50 (ms)", "of roofline",
               "GPU passes of roofline", "host gaps (share of run)"]),
    "verify": ("Checking guessed tokens (speculative decoding)", ["context", "tokens a pass"],
               ["ms a pass", "of one decode step"]),
    "speculate": ("Speculative decoding on the grounded prompts",
                  ["guesses from", "most guessed", "tokens a prompt"],
                  ["tok/s without", "tok/s with", "speed-up", "guesses kept",
                   "tokens per pass", "same tokens"]),
}
TAIL = ["commit", "date", "command", "source"]
# The key cells of a row as a record's rows and anchors name them.
KEY_NAMES = {"context": "ctx", "prompt tokens": "tokens", "sequences": "sequences",
             "prompt + steps": "prompt + steps", "workload": "workload",
             "requests": "requests", "rate (req/s)": "rate", "token budget": "token budget",
             "tokens a pass": "tokens", "most guessed": "most guessed",
             "guesses from": "guesser",
             "tokens a prompt": "output"}


class RecordError(Exception):
    pass


# ---- reading records -------------------------------------------------------------------------

def flag(args, name, default=None):
    """The value of --name in an argument list (`--name V` or `--name=V`)."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return default


def bench_args(command):
    """The arguments after `rustle bench` (or `cargo run --release -- bench`)."""
    args = shlex.split(command)
    if args[:2] == ["rustle", "bench"]:
        return args[2:]
    if "--" in args and args[:2] == ["cargo", "run"]:
        rest = args[args.index("--") + 1:]
        if rest[:1] == ["bench"]:
            return rest[1:]
    raise RecordError(f"the command is not `rustle bench ...`: {command}")


DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def shape_and_weights(args):
    model = flag(args, "--model") or flag(args, "-m")
    if model is None and "--cpu" in args:
        model = DEFAULT_MODEL  # the CPU's benches run the default model without --model
    shape = Path(model).name if model else flag(args, "--shape", "llama3-8b")
    weights = flag(args, "--weights", "stored" if model else "bf16")
    if flag(args, "--kv-dtype", "bf16") != "bf16":
        weights += f", {flag(args, '--kv-dtype')} KV"  # the cache's form is part of the row's key
    return shape, weights


def num(x, digits):
    return f"{x:,.{digits}f}"


def rows_of_bench_report(report):
    """Batch 1: a row a context decoded with graphs on, and the prefill."""
    rows = []
    for d in report["decode"]:
        if not d["graph"]:
            continue
        rows.append({
            "table": "decode", "ctx": d["ctx"],
            "tok/s": num(d["tok_per_s"], 1),
            "share of copy bandwidth (ceiling tok/s)":
                f"{100 * d['share_of_copy']:.1f}% ({num(d['ceiling_tok_per_s'], 1)})",
        })
    p = report["prefill"]
    ours = [g.get("wgmma_us") or g["mma_us"] for g in report["gemm"]]
    cublas = [g.get("cublas_us") for g in report["gemm"]]
    ratio = "-"
    if ours and all(c is not None for c in cublas):
        ratio = f"{sum(cublas) / sum(ours):.2f}"
    rows.append({
        "table": "prefill", "tokens": p["tokens"],
        "ms": f"{1e3 * p['seconds']:.1f}", "tok/s": num(p["tok_per_s"], 0),
        "prompt matmuls, cuBLAS time / ours": ratio,
    })
    return rows


def rows_of_batch_report(results):
    """`--batch`: a row a number of sequences."""
    return [{
        "table": "batched", "sequences": r["sequences"],
        "prompt + steps": f"{r['prompt_len']} + {r['steps']}",
        "decode tok/s": num(r["decode_tok_per_s"], 1),
        "of ceiling (ceiling tok/s)":
            f"{100 * r['decode_tok_per_s'] / r['ceiling_tok_per_s']:.1f}% "
            f"({num(r['ceiling_tok_per_s'], 0)})",
        "ms a step": f"{r['ms_per_step']:.2f}",
    } for r in results]


def rows_of_serve_report(r, args):
    """`--serve`: one row."""
    roof, gaps = r.get("roofline"), r.get("gaps")
    return [{
        "table": "serve", "workload": r["workload"], "requests": r["requests"],
        "rate": flag(args, "--rate", "all at once"),
        "token budget": flag(args, "--token-budget", "512"),
        "output tok/s": num(r["output_tok_per_s"], 1),
        "TTFT p50 / p99 (ms)": f"{num(r['ttft_ms']['p50'], 1)} / {num(r['ttft_ms']['p99'], 1)}",
        "TPOT p50 (ms)": f"{r['tpot_ms']['p50']:.1f}",
        "of roofline": f"{100 / roof['of_bound']:.1f}%" if roof and roof["of_bound"] else "-",
        # Runs before the step clock (issue 54) have no "gaps".
        "GPU passes of roofline": (f"{100 / gaps['gpu_of_bound']:.1f}%"
                                   if gaps and gaps.get("gpu_of_bound") else "-"),
        "host gaps (share of run)": (f"{gaps['gap_seconds']:.2f} s ({100 * gaps['gap_seconds'] / r['seconds']:.0f}%)"
                                     if gaps else "-"),
    }]


def rows_of_verify_report(costs, args):
    """`--verify`: a row a number of tokens in the pass (1: the decode step itself)."""
    return [{
        "table": "verify", "ctx": int(flag(args, "--prompt-len", "512")),
        "tokens": c["tokens"], "ms a pass": f"{c['ms']:.3f}",
        "of one decode step": f"{c['of_decode']:.2f}x",
    } for c in costs]


def rows_of_speculate_report(r, args):
    """`--speculate`: one row, over all the prompts."""
    return [{
        "table": "speculate", "most guessed": r["speculate"], "guesser": r["guesser"],
        # --model or the default model: the report names it.
        "shape": r["model"].split(" ")[0], "weights": flag(args, "--weights", "stored"),
        "output": flag(args, "--output-len", "128"),
        "tok/s without": num(r["plain_tok_per_s"], 1),
        "tok/s with": num(r["speculative_tok_per_s"], 1),
        "speed-up": f"{r['speedup']:.2f}x",
        "guesses kept": f"{100 * r['acceptance']:.0f}%",
        "tokens per pass": f"{r['tokens_per_pass']:.2f}",
        "same tokens": f"{sum(x['same_tokens'] for x in r['runs'])} of {len(r['runs'])}",
    }]


def rows_of_report(report, command):
    """The rows of a `rustle bench --json` report, each with its shape and weights."""
    args = bench_args(command)
    if isinstance(report, list) and report and "of_decode" in report[0]:
        rows = rows_of_verify_report(report, args)
    elif isinstance(report, list):
        rows = rows_of_batch_report(report)
    elif "runs" in report and "speculate" in report:
        rows = rows_of_speculate_report(report, args)
    elif "decode" in report:
        rows = rows_of_bench_report(report)
    elif "workload" in report:
        rows = rows_of_serve_report(report, args)
    else:
        raise RecordError(
            "the report is none of bench's: batch 1, --batch, --serve, --verify or --speculate")
    shape, weights = shape_and_weights(args)
    for row in rows:
        row.setdefault("shape", shape)
        row.setdefault("weights", weights)
        row["command"] = command
    return rows


# ---- checking transcribed figures against the notebook ---------------------------------------

NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def numbers(text):
    """The numbers of a text as written (`1,474.5`, `0.765`, `214`)."""
    return NUMBER.findall(text)


def history_sections(history_text):
    """The notebook's sections: round number (as text) or heading text -> its text."""
    sections, name, lines = {}, None, []
    for line in history_text.splitlines():
        if line.startswith("## ") or line.startswith("### "):
            if name is not None:
                sections[name] = "\n".join(lines)
            title = line.lstrip("#").strip()
            m = re.match(r"(\d+)\. ", title)
            name, lines = (m.group(1) if m else title), [line]
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = "\n".join(lines)
    return sections


def section(sections, name):
    if name in sections:
        return sections[name]
    found = [t for k, t in sections.items() if k.startswith(name)]
    if len(found) != 1:
        raise RecordError(f"{HISTORY} has no one section named {name!r}")
    return found[0]


def occurs(number, text):
    """`number` stands alone in `text` (not inside a longer number)."""
    pattern = r"(?<![\d.,])" + re.escape(number) + r"(?![\d]|[.,]\d)"
    return re.search(pattern, text) is not None


FIGURE_CELLS = {c for _, _, figures in TABLES.values() for c in figures} - {
    "anchor"}


def check_transcribed(record, sections):
    """Every number of a transcribed row's figures is in the history sections it names."""
    names = record["source"].get("history")
    if names is None:
        return
    text = "\n".join(section(sections, str(n)) for n in names)
    for row in record["rows"]:
        for cell, value in row.items():
            if cell not in FIGURE_CELLS:
                continue
            for n in numbers(str(value)):
                if not occurs(n, text):
                    raise RecordError(
                        f"{cell} {value!r}: {n} is not in {HISTORY}'s {', '.join(map(str, names))}")


def source_cell(record):
    if record["kind"] == "rustle-bench":
        return "record"
    src = record["source"]
    if "history" in src:
        rounds = [str(n) for n in src["history"] if str(n).isdigit()]
        what = "round " + ", ".join(rounds) if rounds else "notebook"
        return f"[{what}]({HISTORY}), transcribed"
    return "design notes, transcribed"


# ---- the tables ------------------------------------------------------------------------------

def load(records_dir, sections):
    """Every row of every record, with its record's metadata."""
    rows = []
    paths = sorted(Path(records_dir).glob("*.json"))
    for path in paths:
        try:
            record = json.loads(path.read_text())
            for key in ("kind", "commit", "date", "gpu", "command"):
                if key not in record:
                    raise RecordError(f"no {key!r}")
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]):
                raise RecordError(f"date {record['date']!r} is not YYYY-MM-DD")
            if not re.fullmatch(r"(\d{2}:\d{2})?", record.get("time", "")):
                raise RecordError(f"time {record['time']!r} is not HH:MM")
            if record["kind"] == "rustle-bench":
                report = record["report"]
                name = (report.get("gpu") or report.get("device")) if isinstance(report, dict) else None
                if name and record["gpu"] not in name:
                    raise RecordError(f"gpu {record['gpu']!r}, but the report ran on {name!r}")
                record_rows = rows_of_report(report, record["command"])
            elif record["kind"] == "transcribed":
                check_transcribed(record, sections)
                record_rows = []
                for r in record["rows"]:
                    row = dict(r)
                    command = row.get("command", record["command"])
                    if command is not None:
                        row["command"] = command.replace("{weights}", row["weights"])
                    record_rows.append(row)
            else:
                raise RecordError(f"kind {record['kind']!r} is neither rustle-bench nor transcribed")
        except (RecordError, KeyError, TypeError, ValueError) as e:
            raise RecordError(f"{path.name}: {e}") from None
        for row in record_rows:
            if row["table"] not in TABLES:
                raise RecordError(f"{path.name}: no table {row['table']!r}")
            row.update(gpu=record["gpu"], commit=row.get("commit", record["commit"]),
                       date=record["date"], time=record.get("time", ""),
                       source=source_cell(record), record=path.name,
                       machine=record["kind"] == "rustle-bench", note=record.get("note"))
            add_anchor(row, record.get("anchor"))
            rows.append(row)
    return rows


def add_anchor(row, anchor):
    """The anchor's figure for this row, where it names the row's keys."""
    row["anchor"] = "-"
    for fig in (anchor or {}).get("figures", []):
        keys = {k: v for k, v in fig.items() if k not in ("tok/s", "ms")}
        if all(row.get(k) == v for k, v in keys.items()):
            value = fig.get("tok/s") or fig.get("ms")
            engine = anchor["engine"].split(" ")[0]
            row["anchor"] = f"{engine} {value}" + (
                f" ({anchor['date']})" if "date" in anchor else "")
            row["anchor_record"] = anchor
            return


def key_of(row):
    _, key_cells, _ = TABLES[row["table"]]
    return (row["table"], row["gpu"], row["shape"], row["weights"]) + tuple(
        str(row.get(KEY_NAMES[c])) for c in key_cells)


def sort_key(row):
    def order(v):
        return (0, float(v), "") if re.fullmatch(r"[\d.]+", str(v)) else (1, 0.0, str(v))
    w = row["weights"]
    _, key_cells, _ = TABLES[row["table"]]
    return (row["gpu"], row["shape"], WEIGHTS_ORDER.index(w) if w in WEIGHTS_ORDER else 99, w,
            tuple(order(row.get(KEY_NAMES[c])) for c in key_cells))


def newest(rows):
    """Of rows with one key, the newest (by date and time, a machine record before a
    transcribed one, then the record file that sorts last)."""
    best = {}
    for row in rows:
        k = key_of(row)
        rank = (row["date"], row["time"], row["machine"], row["record"])
        if k not in best or rank > best[k][0]:
            best[k] = (rank, row)
    return [r for _, r in best.values()], len(rows) - len(best)


def cell(row, name):
    value = row.get(KEY_NAMES.get(name, name))
    if value is None:
        value = "not recorded"
    text = str(value).replace("|", "\\|")
    return f"`{text}`" if name == "command" and value != "not recorded" else text


HEADER = """\
# Benchmarks

Today's figures, made by `scripts/bench-tables.py` from the records in `bench/results/`: for
each GPU, model shape, weights, batch and context, the newest figure, beside the ceiling the
same run measured, an anchor (another engine measured in the same sitting, or dated where it
was not), and the commit, date and command that made it. Decode reads every weight once per token, so
its ceiling is the copy bandwidth the same process measured over the bytes a token reads
(weights plus KV cache); "share" is the figure over that ceiling. A figure copied by hand from
the notebook until a machine record replaces it says "transcribed" and links its round.

- Add a record: run the command on the GPU with `--json`, and save its output wrapped with
  the sitting's facts as `bench/results/DATE-GPU-WHAT.json`:
  `{"kind": "rustle-bench", "commit": "...", "date": "YYYY-MM-DD", "gpu": "H100", "command":
  "rustle bench ... --json", "report": OUTPUT}` (optional `"anchor"`: the script's header
  says how). Then `python3 scripts/bench-tables.py` rewrites this file, and `cargo test
  --release --test docs` holds it to the records (`scripts/bench-tables.py --check`).
- Every round of measurement before these tables (rounds 1-59: predictions, commands,
  figures, what was tried and dropped) is in [the notebook](bench/history/rounds.md); what
  the rounds taught is [docs/lessons.md](docs/lessons.md). Anchors measured in other
  sittings (llama.cpp, calm, published serving figures) are in the design notes.

Do not edit this file by hand: edit a record, then run the script.
"""


def render(rows, superseded):
    lines = [HEADER]
    gpus = sorted({r["gpu"] for r in rows})
    for gpu in gpus:
        lines.append(f"## {gpu}\n")
        notes = []
        for table, (title, key_cells, figures) in TABLES.items():
            these = sorted((r for r in rows if r["gpu"] == gpu and r["table"] == table),
                           key=sort_key)
            if not these:
                continue
            cols = ["GPU", "shape", "weights"] + key_cells + figures + TAIL
            lines.append(f"### {title}\n")
            lines.append("| " + " | ".join(cols) + " |")
            lines.append("|" + " --- |" * len(cols))
            for r in these:
                shown = {"GPU": r["gpu"]}
                lines.append("| " + " | ".join(
                    shown.get(c) or cell(r, c) for c in cols) + " |")
                if r.get("note") and r["note"] not in notes:
                    notes.append(r["note"])
            lines.append("")
        anchors = anchor_notes([r for r in rows if r["gpu"] == gpu])
        for text in anchors + notes:
            lines.append(f"- {text}")
        if anchors or notes:
            lines.append("")
    if superseded:
        lines.append(f"{superseded} older rows of the records are left out, each replaced "
                     "by a newer figure of the same key; their records stay in `bench/results/`.\n")
    return "\n".join(lines).rstrip() + "\n"


def anchor_notes(rows):
    """A line for each anchor beside these rows: its engine and command."""
    out = []
    for r in rows:
        a = r.get("anchor_record")
        if a:
            text = f"Anchor: {a['engine']}, " + (
                f"`{a['command']}`" if a.get("command") else "no command recorded")
            if a.get("date"):
                text += f"; measured {a['date']}"
            if text not in out:
                out.append(text)
    return out


def make(records_dir, history_path):
    sections = history_sections(Path(history_path).read_text())
    rows = load(records_dir, sections)
    kept, superseded = newest(rows)
    return render(kept, superseded)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if BENCHMARKS.md differs from what the records make")
    ap.add_argument("--print", action="store_true", help="print the tables, write nothing")
    ap.add_argument("--records", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--history", default=str(ROOT / HISTORY))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    a = ap.parse_args()
    try:
        text = make(a.records, a.history)
    except RecordError as e:
        print(f"bench-tables: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if a.print:
        sys.stdout.write(text)
        return 0
    if a.check:
        old = out.read_text() if out.exists() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(True), text.splitlines(True), str(out), "what the records make"))
        print(f"bench-tables: {out.name} is stale: run scripts/bench-tables.py", file=sys.stderr)
        return 1
    out.write_text(text)
    print(f"bench-tables: wrote {out} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
