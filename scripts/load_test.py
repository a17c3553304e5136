#!/usr/bin/env python3
"""Load test for `rustle serve` (or any OpenAI-compatible server), standard library only.

For each request rate, sends requests arriving as a Poisson process (or all at once with
`--rates all`), each a streamed `/v1/completions` call whose prompt is a list of token ids,
and reports, per rate: requests completed, output tokens per second, time to first token
and inter-token latency (p50 and p99).

    scripts/load_test.py --url http://127.0.0.1:8000 --rates 2,4,8,16,all \\
        --requests 128 --workload sharegpt --vocab 49152

Workloads: `fixed` (every request --prompt-len tokens in, --output-len out) or `sharegpt`
(log-normal prompts of 4-1024 tokens, median 128, and outputs of 4-512, median 96: the mix
`rustle bench --serve --workload sharegpt` draws). Requests ask `ignore_eos`, so each
generates exactly its output length (a server without that extension may stop early).
"""

import argparse
import http.client
import json
import math
import random
import threading
import time
import urllib.parse


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p)))]


def workload(args, rng):
    specs = []
    for _ in range(args.requests):
        if args.workload == "fixed":
            p, o = args.prompt_len, args.output_len
        else:
            p = min(1024, max(4, round(128 * math.exp(rng.gauss(0, 1.0)))))
            o = min(512, max(4, round(96 * math.exp(rng.gauss(0, 0.9)))))
        specs.append(([rng.randrange(args.vocab) for _ in range(p)], o))
    return specs


def one(url, model, key, prompt, max_tokens, t0, result):
    """One streamed completion: the time of each chunk that carries text, and the usage."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = json.dumps({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    })
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            result.update(error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
            return
        times, tokens = [], None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                times.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        result.update(start=start - t0, times=[t - t0 for t in times], tokens=tokens)
    except Exception as e:  # a network error is a result to report, not a crash
        result.update(error=repr(e))
    finally:
        conn.close()


def run_rate(args, rate, specs, rng):
    t0 = time.perf_counter()
    results = [dict() for _ in specs]
    threads = []
    at = 0.0
    for spec, result in zip(specs, results):
        if rate is not None:
            at += rng.expovariate(rate)
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        th = threading.Thread(target=one, args=(args.url, args.model, args.api_key, spec[0], spec[1], t0, result))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    done = [r for r in results if "times" in r and r["times"]]
    errors = [r["error"] for r in results if "error" in r]
    tokens = sum(r["tokens"] or len(r["times"]) for r in done)
    first = min((r["start"] for r in done), default=0.0)
    last = max((r["times"][-1] for r in done), default=0.0)
    ttft = [(r["times"][0] - r["start"]) * 1e3 for r in done]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r["times"], r["times"][1:])]
    return {
        "rate": "all" if rate is None else rate,
        "requests": len(specs),
        "completed": len(done),
        "errors": errors[:3],
        "output_tokens": tokens,
        "seconds": last - first,
        "output_tok_per_s": tokens / (last - first) if last > first else float("nan"),
        "ttft_ms": {"p50": percentile(ttft, 0.5), "p99": percentile(ttft, 0.99)},
        "itl_ms": {"p50": percentile(itl, 0.5), "p99": percentile(itl, 0.99)},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="rustle", help="the model name to ask for")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--rates", default="1,2,4,8,all",
                    help="requests per second, comma-separated; 'all' sends every request at once")
    ap.add_argument("--requests", type=int, default=64, help="requests per rate")
    ap.add_argument("--workload", choices=["fixed", "sharegpt"], default="sharegpt")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, required=True, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    rows = []
    for r in args.rates.split(","):
        rng = random.Random(args.seed)
        specs = workload(args, rng)
        rate = None if r == "all" else float(r)
        row = run_rate(args, rate, specs, rng)
        rows.append(row)
        print(f"rate {row['rate']:>5}: {row['completed']}/{row['requests']} done, "
              f"{row['output_tok_per_s']:.1f} output tok/s, "
              f"TTFT p50 {row['ttft_ms']['p50']:.1f} p99 {row['ttft_ms']['p99']:.1f} ms, "
              f"ITL p50 {row['itl_ms']['p50']:.1f} p99 {row['itl_ms']['p99']:.1f} ms"
              + (f", errors: {row['errors']}" if row["errors"] else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
