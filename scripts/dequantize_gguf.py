#!/usr/bin/env python3
"""A GGUF file with every tensor dequantized to float32, its metadata unchanged.

    pip install gguf numpy
    python3 scripts/dequantize_gguf.py IN.gguf OUT.f32.gguf

The float32 file holds exactly the values the quantized file stands for: the reference that
`scripts/quality-table.sh` requantizes (with llama.cpp's llama-quantize) and measures each
format against, so that every row of the table differs from the reference by its own
rounding only.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def main() -> None:
    src, dst = sys.argv[1:3]
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        # The header's own fields, the architecture (the writer adds it) and the file type.
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(0)  # all float32 now (llama.cpp's LLAMA_FTYPE_ALL_F32)
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        # The reader's shape is GGUF's (innermost first); numpy's is the reverse.
        shape = [int(d) for d in reversed(t.shape)]
        writer.add_tensor(t.name, values.reshape(shape), raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
