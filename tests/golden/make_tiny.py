#!/usr/bin/env python3
"""Tiny random models in Hugging Face format, with transformers' outputs on them.

The default model covers the GGUF path and the plain Llama architecture. These cover the rest
of what rustle claims, each in a few hundred kilobytes:
- tiny-llama3: Llama 3 style, grouped-query attention (4 query heads over 2 KV heads),
  `rope_scaling` type llama3, an untied output head, bf16 safetensors in one file.
- tiny-qwen2: Qwen2, bias on q/k/v, tied embeddings, f16 safetensors split into shards
  with a `model.safetensors.index.json`.
- tiny-qwen3: Qwen3, each query and key head RMSNormed before RoPE (q_norm, k_norm), a
  head_dim (32) that is not hidden / heads (16), an untied head, bf16. make_tiny_gguf.py
  converts it to GGUF with llama.cpp's own converter.
- tiny-mistral: Mistral, every layer attending over a sliding window of 8 positions (the
  prompts run past it, across KV blocks), an untied head, bf16.
- tiny-phi3: Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, RoPE on half of each head,
  longrope scaling (its golden prompts run past the original context of 32 from the start).
- tiny-mixtral, tiny-qwen3moe: mixtures of experts (4 experts, 2 a token; 8 of 48, 3 a token
  with Qwen3's head norms).
- tiny-gemma3: Gemma 3 (text): GeGLU, the embedding scaled by sqrt(hidden), norms of 1 + w
  before and after attention and the MLP, head norms, a query_pre_attn_scalar (24) that is
  not head_dim (32), a local layer over a sliding window of 8 positions (the prompts run past
  it, across KV blocks) with its own RoPE base, and a global layer with linear scaling.
- tiny-gemma3-1b: Gemma 3 as its 1B's configuration has it, which is what llama.cpp's GGUF
  says of a Gemma 3 (make_tiny_gguf.py): every 6th layer global, query_pre_attn_scalar =
  head_dim, RoPE unscaled, the vocabulary the tokenizer's length (the converter cuts the
  embedding to it).
All share a byte-level BPE tokenizer of 256 byte tokens, a few merges and one special token.

    pip install torch transformers tokenizers
    python3 tests/golden/make_tiny.py              # writes tests/golden/tiny-*/ and tiny-*.json
    python3 tests/golden/make_tiny.py tiny-qwen3   # only the models named
"""

import json
import os
import shutil
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
import transformers
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          MixtralConfig, Phi3Config, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config,
                          Qwen3MoeConfig)

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [
    "Hello, tiny world! 123",
    # 48 bytes = 48 tokens at most: several 16-token KV blocks.
    "The quick brown fox jumps over the lazy dog, twice.",
]
# Longer than tiny-phi3's original context of 32 from the first token, so that transformers
# runs every step with longrope's long factors, as rustle does at a context past 32.
LONG_PROMPTS = [
    PROMPTS[1],
    "Sphinx of black quartz, judge my vow; pack my box with five dozen jugs.",
]
NEW_TOKENS = 16


def tokenizer():
    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("h", "e"), ("Ġ", "t"), ("Ġt", "he"), ("o", "u")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", bos_token="<|end|>")


def build(name, config, dtype, shard, prompts=PROMPTS, tokenizer_class=None, norm_low=0.5):
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config)
    # Larger weights than the default init, so greedy choices are clear rather than near-ties.
    # Norm weights uniform over [norm_low, norm_low + 1) (Gemma's multiply by 1 + w).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.25) if p.dim() > 1 else p.uniform_(norm_low, norm_low + 1.0)
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.to(dtype).save_pretrained(folder, max_shard_size="100KB" if shard else "50GB")
    tok = tokenizer()
    tok.save_pretrained(folder)
    for extra in ["generation_config.json", "special_tokens_map.json"]:
        path = os.path.join(folder, extra)
        if os.path.exists(path):
            os.remove(path)
    # The golden outputs come from the saved (rounded) weights, computed in float32.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    write_golden(name, model, tok, "tests/golden/make_tiny.py", prompts)
    if tokenizer_class:
        # What llama.cpp's converter reads to pick the tokenizer it writes (make_tiny_gguf.py).
        path = os.path.join(folder, "tokenizer_config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["tokenizer_class"] = tokenizer_class
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)


def write_golden(name, model, tok, made_by, prompts=PROMPTS):
    """Greedy tokens, their margins and the top logits of `model` on `prompts`, as NAME.json."""
    cases = []
    for prompt in prompts:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        seq, margins = list(ids), []
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([seq])).logits[0, -1]
                top2 = torch.topk(logits, 2)
                margins.append(float(top2.values[0] - top2.values[1]))
                seq.append(int(top2.indices[0]))
            all_logits = model(torch.tensor([seq])).logits[0]
        n = len(ids)
        tops = []
        for p in sorted({0, n - 1, n + 2, len(seq) - 2}):
            t = torch.topk(all_logits[p], 8)
            tops.append({"position": p, "ids": [int(i) for i in t.indices],
                         "logits": [float(v) for v in t.values]})
        cases.append({"prompt": prompt, "prompt_ids": ids, "generated_ids": seq[n:],
                      "generated_text": tok.decode(seq[n:], skip_special_tokens=True),
                      "greedy_margins": margins, "top_logits": tops})
        print(name, repr(prompt[:20]), "min margin", min(margins))
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"made_by": made_by, "model": name,
                   "transformers": __import__("transformers").__version__,
                   "dtype": "float32", "cases": cases}, f, indent=1)


def main():
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=264, max_position_embeddings=256,
                  rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=256)
    models = {
        "tiny-llama3": lambda: build(
            "tiny-llama3",
            LlamaConfig(**common, head_dim=16, rope_theta=500000.0, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
            torch.bfloat16, shard=False),
        "tiny-qwen2": lambda: build(
            "tiny-qwen2",
            Qwen2Config(**common, rope_theta=10000.0, tie_word_embeddings=True,
                        use_sliding_window=False),
            torch.float16, shard=True),
        "tiny-qwen3": lambda: build(
            "tiny-qwen3",
            Qwen3Config(**common, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=False,
                        use_sliding_window=False, attention_bias=False),
            torch.bfloat16, shard=False),
        # Every layer over a sliding window of 8: the golden prompts and tokens run past it.
        "tiny-mistral": lambda: build(
            "tiny-mistral",
            MistralConfig(**common, head_dim=16, rope_theta=10000.0, sliding_window=8,
                          tie_word_embeddings=False),
            torch.bfloat16, shard=False),
        # Fused qkv_proj and gate_up_proj, RoPE on half of each head (partial_rotary_factor),
        # longrope: per-frequency factors and an attention factor past an original context.
        "tiny-phi3": lambda: build(
            "tiny-phi3",
            Phi3Config(**common, rope_theta=10000.0, tie_word_embeddings=False,
                       partial_rotary_factor=0.5, original_max_position_embeddings=32,
                       rope_scaling={"rope_type": "longrope",
                                     "short_factor": [1.0, 1.1, 1.3, 1.6],
                                     "long_factor": [1.0, 2.0, 5.0, 11.0]},
                       pad_token_id=None),
            torch.bfloat16, shard=False, prompts=LONG_PROMPTS, tokenizer_class="GPT2Tokenizer"),
        # Mixture of experts: 4 experts, 2 a token, the softmax over the chosen two.
        "tiny-mixtral": lambda: build(
            "tiny-mixtral",
            MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2,
                          rope_theta=1000000.0, tie_word_embeddings=False, sliding_window=None),
            torch.bfloat16, shard=False),
        # Qwen3's MoE: 8 experts of 48, 3 a token, the softmax over all then renormalized over
        # the chosen (norm_topk_prob); q and k normed by head as in Qwen3.
        "tiny-qwen3moe": lambda: build(
            "tiny-qwen3moe",
            Qwen3MoeConfig(**common, head_dim=32, num_experts=8, num_experts_per_tok=3,
                           moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                           mlp_only_layers=[], rope_theta=1000000.0, tie_word_embeddings=False,
                           use_sliding_window=False),
            torch.bfloat16, shard=False),
    }
    # Gemma 3: transformers 5 takes each kind of layer's RoPE in `rope_parameters`, earlier
    # versions `rope_scaling` (global layers) and `rope_local_base_freq`.
    if int(transformers.__version__.split(".")[0]) >= 5:
        rope = dict(rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    else:
        rope = dict(rope_theta=1000000.0, rope_local_base_freq=10000.0,
                    rope_scaling={"rope_type": "linear", "factor": 2.0})
    models["tiny-gemma3"] = lambda: build(
        "tiny-gemma3",
        Gemma3TextConfig(**{**common, "rms_norm_eps": 1e-6}, head_dim=32, query_pre_attn_scalar=24,
                         sliding_window=8, sliding_window_pattern=2,
                         layer_types=["sliding_attention", "full_attention"],
                         hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                         final_logit_softcapping=None, attn_logit_softcapping=None,
                         attention_bias=False, pad_token_id=0, **rope),
        torch.bfloat16, shard=False, norm_low=-0.5)
    models["tiny-gemma3-1b"] = lambda: build(
        "tiny-gemma3-1b",
        Gemma3TextConfig(**{**common, "rms_norm_eps": 1e-6, "num_hidden_layers": 6,
                            "vocab_size": len(tokenizer())},
                         head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
                         sliding_window_pattern=6,
                         layer_types=["sliding_attention"] * 5 + ["full_attention"],
                         hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                         final_logit_softcapping=None, attn_logit_softcapping=None,
                         attention_bias=False, pad_token_id=0, rope_theta=1000000.0,
                         rope_local_base_freq=10000.0),
        torch.bfloat16, shard=False, norm_low=-0.5)
    names = sys.argv[1:] or list(models)
    for name in names:
        if name not in models:
            sys.exit(f"unknown model {name!r}; known: {', '.join(models)}")
        models[name]()


if __name__ == "__main__":
    main()
