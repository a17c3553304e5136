#!/usr/bin/env python3
"""Reference dequantizations for rustle's GGUF reader, made by the `gguf` Python package.

For each GGML type rustle loads, a few blocks of seeded random bytes (with sane f16 scales,
so no value is inf or NaN) and what `gguf.quants.dequantize` makes of them. An independent
implementation of the same block layouts: rustle's `dequant.rs` must agree. Also every type
ggml defines (id, name, block geometry), so that rustle names each one it refuses.

    pip install gguf numpy
    python3 tests/golden/make_dequant.py      # writes tests/golden/dequant.json
"""

import json
import os
from importlib.metadata import version

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(2026)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8)


def blocks(qtype, n_blocks):
    """Random bytes for n_blocks blocks, with every f16 scale field set to a modest value."""
    if qtype == T.F16:
        return f16_bytes(rng.normal(size=n_blocks))
    if qtype == T.BF16:
        f = rng.normal(size=n_blocks).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if qtype == T.F32:
        return rng.normal(size=n_blocks).astype(np.float32).view(np.uint8)
    size, scale_fields = {
        T.Q8_0: (34, [0]),
        T.Q4_0: (18, [0]),
        T.Q4_1: (20, [0, 2]),
        T.Q4_K: (144, [0, 2]),
        T.Q6_K: (210, [208]),
        T.Q5_0: (22, [0]),
        T.Q5_1: (24, [0, 2]),
        T.Q2_K: (84, [80, 82]),
        T.Q3_K: (110, [108]),
        T.Q5_K: (176, [0, 2]),
        T.IQ4_NL: (18, [0]),
        T.IQ4_XS: (136, [0]),
    }[qtype]
    # The package's own table of block sizes: the offsets above belong to these layouts.
    assert size == GGML_QUANT_SIZES[qtype][1], (qtype.name, size, GGML_QUANT_SIZES[qtype])
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at in scale_fields:
        raw[:, at:at + 2] = f16_bytes(rng.uniform(-0.1, 0.1, size=n_blocks)).reshape(n_blocks, 2)
    return raw.reshape(-1)


def main():
    cases = []
    # New types go at the end, so that the random bytes of the earlier cases stay the same.
    for qtype, n_blocks in [(T.F32, 7), (T.F16, 9), (T.BF16, 9), (T.Q8_0, 3), (T.Q4_0, 3),
                            (T.Q4_1, 3), (T.Q4_K, 2), (T.Q6_K, 2), (T.Q5_0, 3), (T.Q5_1, 3),
                            (T.Q2_K, 2), (T.Q3_K, 2), (T.Q5_K, 2), (T.IQ4_NL, 3),
                            (T.IQ4_XS, 2)]:
        raw = blocks(qtype, n_blocks)
        values = dequantize(raw, qtype).astype(np.float32).reshape(-1)
        cases.append({
            "type": qtype.name.lower(),
            "bytes_hex": raw.tobytes().hex(),
            "values": [float(v) for v in values],
        })
    ggml_types = [{"id": t.value, "name": t.name.lower(), "block_len": GGML_QUANT_SIZES[t][0],
                   "block_bytes": GGML_QUANT_SIZES[t][1]} for t in T]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dequant.json")
    with open(path, "w") as f:
        json.dump({"made_by": "tests/golden/make_dequant.py", "gguf": version("gguf"),
                   "cases": cases, "ggml_types": ggml_types}, f)
    print("wrote", path, [(c["type"], len(c["values"])) for c in cases])


if __name__ == "__main__":
    main()
