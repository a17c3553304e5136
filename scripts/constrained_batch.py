#!/usr/bin/env python3
"""What one grammar-constrained request costs the others in a batch.

Usage: python3 scripts/constrained_batch.py BASE_URL MODEL [--requests 64] [--tokens 256]
       [--rounds 3]

Against a running `rustle serve`: a batch of REQUESTS chat requests sent at once, each
generating exactly TOKENS tokens (`ignore_eos`), timed from the first send to the last reply;
once with no constraint, once with one request held to a JSON schema that cannot end before
TOKENS (an array of at least 10,000 integers), alternating for ROUNDS rounds. Prints each
round's output tokens per second and the ratio of the medians (constrained / plain). Only
the standard library: it runs on the GPU machine as it is.
"""

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

LONG_ARRAY = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
              "minItems": 10000}


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def batch(base, model, n, tokens, constrained):
    bodies = []
    for i in range(n):
        body = {"model": model, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8,
                "seed": i,
                "messages": [{"role": "user", "content": f"Request {i}: list some numbers."}]}
        if constrained and i == 0:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "numbers", "schema": LONG_ARRAY}}
        bodies.append(body)
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda b: post(base, b), bodies))
    took = time.perf_counter() - start
    out = sum(r["usage"]["completion_tokens"] for r in replies)
    if constrained:
        text = replies[0]["choices"][0]["message"]["content"]
        assert text.startswith("[") and "]" not in text, text[:80]
    return out / took


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("model")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    batch(a.base, a.model, a.requests, 16, True)  # warm-up: graphs, the grammar engine
    plain, constrained = [], []
    for r in range(a.rounds):
        plain.append(batch(a.base, a.model, a.requests, a.tokens, False))
        constrained.append(batch(a.base, a.model, a.requests, a.tokens, True))
        print(f"round {r}: plain {plain[-1]:.0f} tok/s, one constrained {constrained[-1]:.0f} tok/s")
    ratio = statistics.median(constrained) / statistics.median(plain)
    print(json.dumps({"requests": a.requests, "tokens": a.tokens,
                      "plain_tok_s": statistics.median(plain),
                      "constrained_tok_s": statistics.median(constrained),
                      "ratio": round(ratio, 4)}))


if __name__ == "__main__":
    main()
