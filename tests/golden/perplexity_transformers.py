#!/usr/bin/env python3
"""Perplexity of a text as `rustle perplexity` computes it, by Hugging Face transformers.

transformers reads the GGUF file with its own loader (the `gguf` package dequantizes the
blocks to float32) and builds its own tokenizer from the file's metadata: an independent
implementation of the same weights. The chunking is rustle's (and llama.cpp's): the text's
tokens (no special tokens) cut into chunks of CTX, each run from a fresh start with its first
token replaced by the beginning-of-sequence token when the model has one, the second half of
each chunk scored.

    pip install torch transformers gguf accelerate numpy
    python3 tests/golden/perplexity_transformers.py MODEL.gguf tests/data/declaration.txt 64

prints `perplexity P over N tokens (C chunks of CTX)`, to set beside
`rustle perplexity -m MODEL.gguf -f TEXT --ctx CTX --reference`.
"""

import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    gguf_path, text_path, ctx = os.path.abspath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    folder, name = os.path.split(gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    text = open(text_path, encoding="utf-8").read()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with_special = tok("", add_special_tokens=True)["input_ids"]
    bos = with_special[0] if with_special else None
    chunks = len(ids) // ctx
    nll, scored = 0.0, 0
    with torch.no_grad():
        for c in range(chunks):
            chunk = ids[c * ctx:(c + 1) * ctx]
            if bos is not None:
                chunk[0] = bos
            logits = model(torch.tensor([chunk])).logits[0].double()
            log_probs = torch.log_softmax(logits, dim=-1)
            for p in range(ctx // 2, ctx - 1):
                nll -= float(log_probs[p, chunk[p + 1]])
                scored += 1
    print(f"tokens {len(ids)}; perplexity {math.exp(nll / scored):.4f} over {scored} tokens "
          f"({chunks} chunks of {ctx})")


if __name__ == "__main__":
    main()
