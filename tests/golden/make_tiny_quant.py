#!/usr/bin/env python3
"""A tiny Llama in GGUF whose matrices mix Q4_K, Q5_0, Q6_K and Q8_0, with transformers' outputs.

The default model covers one quantization (Q4_1); this covers the mix that Q4_K_M-style files
hold, in 875 kB: dim 256 and head_dim 64 (4 query heads over 2 KV heads), so that rows are
whole 256-value k-quant blocks, ffn 512 (two k-quant blocks per row of ffn_down), 2 layers, an
untied output head, and the byte-level tokenizer of make_tiny.py written as GGUF metadata.

How the weights are made, tensor by tensor, in the layout the GGUF file stores (Q and K rows
permuted for interleaved RoPE, as llama.cpp's converter writes `llama` files):
- Q5_0, Q8_0: random normal floats, quantized by `gguf.quants.quantize`;
- Q4_K, Q6_K: the package cannot quantize these, so each block is random bytes with modest
  f16 scales (for Q4_K, each sub-block's min set to centre its values on zero);
- norms: f32.
The golden outputs come from what the `gguf` package dequantizes (Q and K un-permuted), loaded
into transformers' LlamaForCausalLM on the CPU in float32. As a check on this script's own
reading of the file (the un-permuting above), transformers' GGUF loader must find the same
weights in the file.

    pip install torch transformers tokenizers gguf numpy accelerate
    python3 tests/golden/make_tiny_quant.py    # writes tests/golden/tiny-quant.gguf and .json
"""

import json
import os

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from make_tiny import HERE, tokenizer, write_golden

NAME = "tiny-quant"
DIM, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 2, 4, 2, 64
CONTEXT, ROPE_THETA, EPS = 256, 10000.0, 1e-5
# Standard deviation of every matrix's values: on an rmsnormed input, outputs of about
# 0.125 * sqrt(256) = 2, as make_tiny.py's 0.25 * sqrt(64).
SIGMA = 0.125

# Each layer's matrices: layer 0 as a Q4_K_M file mixes them, layer 1 another mix, so that
# the types serve in attention and in the MLP at both row lengths (256 and 512). Q8_0, the
# largest, only where the matrices are small (k and v), to keep the file under a megabyte.
LAYER_TYPES = [
    {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "attn_output": T.Q5_0,
     "ffn_gate": T.Q4_K, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K},
    {"attn_q": T.Q5_0, "attn_k": T.Q8_0, "attn_v": T.Q8_0, "attn_output": T.Q4_K,
     "ffn_gate": T.Q4_K, "ffn_up": T.Q5_0, "ffn_down": T.Q4_K},
]
# As Q4_K_M files have them.
EMBEDDING, OUTPUT = T.Q4_K, T.Q6_K

# GGUF name -> (Hugging Face name, [out, in]).
MATRICES = {
    "attn_q": ("self_attn.q_proj", [HEADS * HEAD_DIM, DIM]),
    "attn_k": ("self_attn.k_proj", [KV_HEADS * HEAD_DIM, DIM]),
    "attn_v": ("self_attn.v_proj", [KV_HEADS * HEAD_DIM, DIM]),
    "attn_output": ("self_attn.o_proj", [DIM, HEADS * HEAD_DIM]),
    "ffn_gate": ("mlp.gate_proj", [FFN, DIM]),
    "ffn_up": ("mlp.up_proj", [FFN, DIM]),
    "ffn_down": ("mlp.down_proj", [DIM, FFN]),
}

rng = np.random.default_rng(2027)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def q4_k_blocks(n):
    """n random Q4_K blocks: `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`, x = d*sc*q - dmin*m
    for 8 sub-blocks of 32 with 6-bit sc and m. With dmin = 8d and m = sc*7.5/8 rounded, each
    sub-block is d*sc*(q - 7.5), centred; std about 221 d."""
    d = SIGMA / 221 * rng.uniform(0.5, 1.5, n)
    sc = rng.integers(32, 64, (n, 8))
    m = np.round(sc * 7.5 / 8).astype(np.int64)
    scales = np.zeros((n, 12), dtype=np.int64)
    # ggml's get_scale_min_k4, inverted: sub-blocks 0-3 in six low bits, 4-7 split in two.
    scales[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    qs = rng.integers(0, 256, (n, 128))
    return np.concatenate([f16_bytes(d), f16_bytes(8 * d), scales.astype(np.uint8),
                           qs.astype(np.uint8)], axis=1)


def q6_k_blocks(n):
    """n random Q6_K blocks: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`,
    x = d*sc*(q - 32) for 16 sub-blocks of 16 with 6-bit q; std about 773 d."""
    d = SIGMA / 773 * rng.uniform(0.5, 1.5, n)
    sc = rng.integers(16, 64, (n, 16)) * rng.choice([-1, 1], (n, 16))
    q = rng.integers(0, 256, (n, 192)).astype(np.uint8)
    return np.concatenate([q, sc.astype(np.int8).view(np.uint8), f16_bytes(d)], axis=1)


def make_tensor(qtype, shape):
    """A [rows, cols] tensor of type qtype, as the bytes GGUF stores (one row of blocks per
    row), with the float values it stands for."""
    rows, cols = shape
    block_len, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (T.Q4_K, T.Q6_K):
        blocks = (q4_k_blocks if qtype == T.Q4_K else q6_k_blocks)(rows * cols // block_len)
        raw = blocks.reshape(rows, cols // block_len * block_bytes)
    else:
        raw = quantize(rng.normal(0.0, SIGMA, shape).astype(np.float32), qtype)
    values = dequantize(raw, qtype).astype(np.float32)
    assert values.shape == (rows, cols), (qtype.name, values.shape)
    assert np.isfinite(values).all()
    return raw, values


def unpermute(w, n_head):
    """GGUF `llama` Q/K rows back to Hugging Face order: llama.cpp's converter stored each
    head's rows as (i, half) pairs for interleaved RoPE, transformers wants (half, i)."""
    return w.reshape(n_head, HEAD_DIM // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def main():
    tok = tokenizer()
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    vocab = len(tokens)
    backend = json.loads(tok.backend_tokenizer.to_str())
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    end = tok.convert_tokens_to_ids("<|end|>")

    path = os.path.join(HERE, NAME + ".gguf")
    w = GGUFWriter(path, "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|end|>" else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(end)
    w.add_eos_token_id(end)
    w.add_add_bos_token(False)

    state = {}  # Hugging Face name -> float32 tensor

    def add(gguf_name, hf_name, qtype, shape, n_head=None):
        raw, values = make_tensor(qtype, shape)
        w.add_tensor(gguf_name, raw, raw_dtype=qtype)
        if n_head is not None:
            values = unpermute(values, n_head)
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(values))
        print(f"{gguf_name:24} {qtype.name:5} {shape} {raw.nbytes:7} bytes, "
              f"mean {values.mean():+.4f} std {values.std():.4f}")

    def norm(gguf_name, hf_name):
        values = rng.uniform(0.5, 1.5, DIM).astype(np.float32)
        w.add_tensor(gguf_name, values)
        state[hf_name] = torch.from_numpy(values)

    add("token_embd.weight", "model.embed_tokens.weight", EMBEDDING, [vocab, DIM])
    for i, types in enumerate(LAYER_TYPES):
        norm(f"blk.{i}.attn_norm.weight", f"model.layers.{i}.input_layernorm.weight")
        norm(f"blk.{i}.ffn_norm.weight", f"model.layers.{i}.post_attention_layernorm.weight")
        for gguf_name, (hf_name, shape) in MATRICES.items():
            n_head = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(gguf_name)
            add(f"blk.{i}.{gguf_name}.weight", f"model.layers.{i}.{hf_name}.weight",
                types[gguf_name], shape, n_head)
    norm("output_norm.weight", "model.norm.weight")
    add("output.weight", "lm_head.weight", OUTPUT, [vocab, DIM])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", path, os.path.getsize(path), "bytes")

    config = LlamaConfig(hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         head_dim=HEAD_DIM, vocab_size=vocab, max_position_embeddings=CONTEXT,
                         rms_norm_eps=EPS, rope_theta=ROPE_THETA, tie_word_embeddings=False,
                         bos_token_id=end, eos_token_id=end)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)

    # transformers' own GGUF reader (its dequantizer is the same package; the un-permuting
    # and the name mapping are its own) must see the same model in the file.
    theirs = AutoModelForCausalLM.from_pretrained(HERE, gguf_file=NAME + ".gguf",
                                                  dtype=torch.float32).state_dict()
    for k, v in state.items():
        assert torch.equal(theirs[k], v), k

    write_golden(NAME, model, tok, "tests/golden/make_tiny_quant.py")


if __name__ == "__main__":
    main()
