#!/usr/bin/env python3
"""GGUF files of the tiny Hugging Face models, made by llama.cpp's own converter.

rustle reads GGUF files as llama.cpp's converter writes them (tensor names, metadata keys,
row orders); a file written by this project's own scripts would only test what those
scripts believe. So the tiny models of make_tiny.py go through `convert_hf_to_gguf.py` from
the llama.cpp source that scripts/compare-llama-cpp.sh pins (llama-cpp-python 0.3.36's
vendored copy), in bf16: the models are bf16, so the file holds the same weights, and the
golden outputs of the folder (tiny-NAME.json) hold for the file too.

One change to the converter, made here and not in its source: it names a BPE pre-tokenizer
by hashing how the tokenizer splits a test text, and refuses ones it does not know. The tiny
tokenizer is byte-level BPE with GPT-2's split (make_tiny.py), so the file says "gpt2".

    pip install torch transformers tokenizers safetensors numpy sentencepiece
    # llama.cpp's source: llama-cpp-python's sdist, unpacked (compare-llama-cpp.sh does it)
    python3 tests/golden/make_tiny_gguf.py PATH/TO/llama.cpp tiny-qwen3
        # writes tests/golden/tiny-qwen3.gguf
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, names = os.path.abspath(sys.argv[1]), sys.argv[2:]
    sys.path.insert(0, source)
    sys.path.insert(1, os.path.join(source, "gguf-py"))
    import convert_hf_to_gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt2"
    for name in names:
        folder = os.path.join(HERE, name)
        out = os.path.join(HERE, name + ".gguf")
        sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", "bf16", "--outfile", out]
        convert_hf_to_gguf.main()
        print("wrote", out)


if __name__ == "__main__":
    main()
