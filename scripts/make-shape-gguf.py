#!/usr/bin/env python3
"""A GGUF file of a named shape with random bf16 weights, for timing two engines on one file.

rustle's `bench --shape` builds random weights on the GPU, but another engine (llama.cpp) can
only be timed on a file. This writes one in the layout llama.cpp's converter gives the
architecture (tensor names, metadata keys, the experts of a layer stacked in one tensor), so
that `llama-quantize` turns it into any GGUF type and both engines read the same bytes:

    python3 scripts/make-shape-gguf.py --shape qwen3-30b-a3b --layers 12 --out moe.bf16.gguf
    llama-quantize moe.bf16.gguf moe.q4_k_m.gguf Q4_K_M
    rustle bench -m moe.q4_k_m.gguf --batch 1,64 ...      llama-batched-bench -m moe.q4_k_m.gguf ...

The layer shapes are the shape's own (engine/shapes.rs); --layers keeps the first N (a file of
all 48 layers of qwen3-30b-a3b is 61 GB in bf16). The tokenizer is the tiny golden models'
byte-level BPE (tests/golden/tiny-qwen3moe.gguf, written by llama.cpp's converter), its list
padded with unused tokens to the shape's vocabulary, as the converter pads one, and its
pre-tokenizer named "qwen2" (the golden file says "gpt2", which llama.cpp does not load); speed
does not depend on which token is which. Weights are normal with standard deviation 0.02,
norms 1. Shapes: llama3-8b, qwen3-8b, qwen3-30b-a3b, and two small ones (llama-small,
qwen3moe-small) to check a file on a CPU.

Needs numpy and llama.cpp's gguf-py (GGUF_PY=PATH/TO/llama.cpp/gguf-py, or `pip install gguf`);
torch, where installed, draws the numbers (on the GPU if there is one), else numpy does.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_FILE = os.path.join(HERE, "..", "tests", "golden", "tiny-qwen3moe.gguf")

# The shapes, as engine/shapes.rs gives them, with the architecture llama.cpp's converter names
# (llama, qwen3, qwen3moe). The small ones are for checking a file on a CPU.
SHAPES = {
    "llama3-8b": dict(
        arch="llama", hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, head_dim=128,
        vocab=128256, context=8192, eps=1e-5, rope_base=500000.0,
    ),
    "qwen3-8b": dict(
        arch="qwen3", hidden=4096, ffn=12288, layers=36, heads=32, kv_heads=8, head_dim=128,
        vocab=151936, context=40960, eps=1e-6, rope_base=1e6,
    ),
    "qwen3-30b-a3b": dict(
        arch="qwen3moe", hidden=2048, ffn=6144, expert_ffn=768, experts=128, used=8, layers=48,
        heads=32, kv_heads=4, head_dim=128, vocab=151936, context=40960, eps=1e-6, rope_base=1e6,
    ),
    "llama-small": dict(
        arch="llama", hidden=256, ffn=512, layers=2, heads=4, kv_heads=2, head_dim=64,
        vocab=1024, context=4096, eps=1e-5, rope_base=500000.0,
    ),
    "qwen3moe-small": dict(
        arch="qwen3moe", hidden=256, ffn=512, expert_ffn=256, experts=8, used=2, layers=2,
        heads=4, kv_heads=2, head_dim=64, vocab=1024, context=4096, eps=1e-6, rope_base=1e6,
    ),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--layers", type=int, help="keep the first N layers (default: all)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    if os.environ.get("GGUF_PY"):
        sys.path.insert(0, os.environ["GGUF_PY"])
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    s = dict(SHAPES[args.shape])
    if args.layers is not None:
        if not 1 <= args.layers <= s["layers"]:
            sys.exit(f"--layers must be 1 to {s['layers']} for {args.shape}, got {args.layers}")
        s["layers"] = args.layers
    arch = s["arch"]

    draw = random_source(args.seed, np)
    w = GGUFWriter(args.out, arch)
    w.add_string("general.name", f"random {args.shape}, {s['layers']} layers")
    for key, value in metadata(s):
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    w.add_uint32("general.file_type", 32)  # llama.cpp's LLAMA_FTYPE_MOSTLY_BF16
    w.add_uint32("general.quantization_version", 2)
    copy_tokenizer(GGUFReader(TOKENIZER_FILE), w, s["vocab"])

    tensors = tensor_list(s)
    for name, shape, kind in tensors:
        n = int(np.prod(shape))
        raw = T.F32 if kind != "w" else T.BF16
        w.add_tensor_info(name, shape, np.dtype(np.float32 if raw == T.F32 else np.uint16),
                          n * (4 if raw == T.F32 else 2), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(int(np.prod(shape)) * (2 if kind == "w" else 4) for _, shape, kind in tensors)
    done, start = 0, time.time()
    for i, (name, shape, kind) in enumerate(tensors):
        n = int(np.prod(shape))
        if kind == "norm":
            data = np.ones(n, dtype=np.float32)
        else:
            data = draw(n, bf16=kind == "w")
        w.write_tensor_data(data)
        done += data.nbytes
        if i % 24 == 0 or i == len(tensors) - 1:
            rate = done / max(time.time() - start, 1e-9) / 1e9
            print(f"{done / 1e9:.1f} of {total / 1e9:.1f} GB ({rate:.2f} GB/s)", file=sys.stderr)
    w.close()
    print(f"wrote {args.out}: {args.shape}, {s['layers']} layers, {total / 1e9:.2f} GB of "
          f"weights", file=sys.stderr)


def metadata(s):
    """The architecture's hyperparameters, keys after "ARCH.", as the converter writes them."""
    keys = [
        ("block_count", s["layers"]),
        ("context_length", s["context"]),
        ("embedding_length", s["hidden"]),
        ("feed_forward_length", s["ffn"]),
        ("attention.head_count", s["heads"]),
        ("attention.head_count_kv", s["kv_heads"]),
        ("rope.freq_base", float(s["rope_base"])),
        ("attention.layer_norm_rms_epsilon", float(s["eps"])),
    ]
    if s["arch"] == "llama":
        keys += [("rope.dimension_count", s["head_dim"]), ("vocab_size", s["vocab"])]
    else:
        keys += [("attention.key_length", s["head_dim"]), ("attention.value_length", s["head_dim"])]
    if s["arch"] == "qwen3moe":
        keys += [
            ("expert_feed_forward_length", s["expert_ffn"]),
            ("expert_count", s["experts"]),
            ("expert_used_count", s["used"]),
        ]
    return keys


def tensor_list(s):
    """(name, numpy shape [.., out, in], kind) of every tensor: the converter's names; kind
    "w" for bf16 matrices, "norm" (ones) and "router" (f32, as the converter keeps it)."""
    h, hd = s["hidden"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    tensors = [("token_embd.weight", (s["vocab"], h), "w"), ("output_norm.weight", (h,), "norm")]
    tensors.append(("output.weight", (s["vocab"], h), "w"))
    layer = [
        ("attn_norm.weight", (h,), "norm"),
        ("attn_q.weight", (q, h), "w"),
        ("attn_k.weight", (kv, h), "w"),
        ("attn_v.weight", (kv, h), "w"),
        ("attn_output.weight", (h, q), "w"),
        ("ffn_norm.weight", (h,), "norm"),
    ]
    if s["arch"] in ("qwen3", "qwen3moe"):
        layer += [("attn_q_norm.weight", (hd,), "norm"), ("attn_k_norm.weight", (hd,), "norm")]
    if s["arch"] == "qwen3moe":
        e, f = s["experts"], s["expert_ffn"]
        layer += [
            ("ffn_gate_inp.weight", (e, h), "router"),
            ("ffn_gate_exps.weight", (e, f, h), "w"),
            ("ffn_up_exps.weight", (e, f, h), "w"),
            ("ffn_down_exps.weight", (e, h, f), "w"),
        ]
    else:
        f = s["ffn"]
        layer += [
            ("ffn_gate.weight", (f, h), "w"),
            ("ffn_up.weight", (f, h), "w"),
            ("ffn_down.weight", (h, f), "w"),
        ]
    for b in range(s["layers"]):
        tensors += [(f"blk.{b}.{name}", shape, kind) for name, shape, kind in layer]
    return tensors


def random_source(seed, np):
    """draw(n, bf16) -> n numbers, normal with standard deviation 0.02, as bf16 bits (uint16)
    or f32: by torch where installed (on the GPU if there is one), else by numpy."""
    try:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        gen = torch.Generator(device=dev).manual_seed(seed)

        def draw(n, bf16):
            x = torch.randn(n, generator=gen, device=dev, dtype=torch.float32) * 0.02
            if bf16:
                return x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
            return x.cpu().numpy()

        return draw
    except ImportError:
        rng = np.random.default_rng(seed)

        def draw(n, bf16):
            x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            if bf16:  # round to nearest even, as torch's conversion does
                bits = x.view(np.uint32)
                return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return x

        return draw


def copy_tokenizer(reader, w, vocab):
    """The tokenizer.* fields of `reader`, its token list padded to `vocab` entries with unused
    tokens ([PADn], type 5), as llama.cpp's converter pads a vocabulary smaller than the
    matrices."""
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            if len(value) > vocab:
                sys.exit(f"the tokenizer's {len(value)} tokens exceed the vocabulary {vocab}")
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [5] * (vocab - len(value))
        elif key == "tokenizer.ggml.pre":
            value = "qwen2"  # the golden files say "gpt2", a name llama.cpp does not load
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, value, field.types[0], sub)


if __name__ == "__main__":
    main()
