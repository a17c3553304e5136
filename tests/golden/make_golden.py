#!/usr/bin/env python3
"""Golden outputs for rustle's end-to-end test, made by Hugging Face transformers.

transformers is an independent implementation of the same model: it reads the GGUF file with
its own loader (the `gguf` package dequantizes; transformers un-permutes Q/K for `llama`
files), builds its own tokenizer from the file's metadata, and runs the forward in float32.
rustle must reproduce its tokens and logits.

    pip install torch transformers gguf accelerate numpy
    python3 tests/golden/make_golden.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf

writes tests/golden/smollm2-135m.json: for each prompt, the prompt's token ids, the greedy
continuation (ids and text), the margin between the best and second-best logit at every
greedy step (so the test can tell a real divergence from a near-tie), and the top logits at
several positions.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "Here is a short list of the planets of the solar system, in order from the sun:",
    # Long enough to cross several 16-token KV blocks during prefill and decode.
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker named Elias. Every morning he opened his shop, wound the hundred clocks that "
    "lined its walls, and waited for the villagers to bring him their broken watches. One "
    "winter day, a stranger arrived with a clock that had no hands. Elias looked at it and said",
]
NEW_TOKENS = 24
TOP_K = 8


def main() -> None:
    gguf_path = os.path.abspath(sys.argv[1])
    folder, name = os.path.split(gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()

    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        # Greedy, one token at a time with the full sequence each step: no cache subtleties.
        seq = list(ids)
        margins = []
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([seq])).logits[0, -1]
                top2 = torch.topk(logits, 2)
                margins.append(float(top2.values[0] - top2.values[1]))
                seq.append(int(top2.indices[0]))
            all_logits = model(torch.tensor([seq])).logits[0]
        n = len(ids)
        # Logits at position p predict token p + 1: prompt positions test prefill, later
        # positions test decode steps.
        positions = sorted({0, n // 2, n - 1, n + 3, n + NEW_TOKENS // 2, len(seq) - 2})
        tops = []
        for p in positions:
            t = torch.topk(all_logits[p], TOP_K)
            tops.append({
                "position": p,
                "ids": [int(i) for i in t.indices],
                "logits": [float(v) for v in t.values],
            })
        generated = seq[n:]
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids,
            "generated_ids": generated,
            "generated_text": tok.decode(generated),
            "greedy_margins": margins,
            "top_logits": tops,
        })
        print(repr(prompt[:40]), "->", repr(tok.decode(generated)))

    out = {
        "made_by": "tests/golden/make_golden.py",
        "model": name,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2-135m.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
