"""Regenerates the seed corpus of tests/fuzz/fuzz_gguf.c (small files only):
micro qwen2 models of several weight types with a micro vocabulary, a
tokenizer-only file, and a few broken headers. Run with /usr/bin/python3
from the repository root; the output is committed.
"""

import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_writer as W  # noqa: E402

OUT = Path("tests/fuzz/corpus/fuzz_gguf")


def micro_vocab():
    b2u = W.bytes_to_unicode()
    tokens = [b2u[b] for b in b"Helo wrd'sx12\n"] + ["He", "ll", "Hell", "Hello", "\u0120w"]
    merges = ["H e", "l l", "He ll", "Hell o", "\u0120 w"]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    return tokens, types, merges


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    voc = micro_vocab()
    n = len(voc[0])
    for t in ("F32", "F16", "Q8_0", "Q4_0", "Q5_0"):
        W.make_model(str(OUT / ("micro-%s.gguf" % t)), wtype=t, embd=32, layers=1, heads=2,
                     kv_heads=1, ff=32, vocab=n, untied=(t == "Q4_0"), head_type="Q8_0",
                     seed=1, vocab_tokens=voc)
    w = W.Writer()
    w.add("general.architecture", W.GV_STRING, "qwen2")
    W.add_tokenizer(w, *voc)
    w.write(str(OUT / "tokenizer-only.gguf"))
    good = (OUT / "micro-F32.gguf").read_bytes()
    (OUT / "truncated.gguf").write_bytes(good[:len(good) // 3])
    small = (OUT / "micro-Q4_0.gguf").read_bytes()
    (OUT / "version2.gguf").write_bytes(small[:4] + struct.pack("<I", 2) + small[8:])
    (OUT / "empty-v3.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    for f in sorted(OUT.iterdir()):
        print("%-24s %7d" % (f.name, os.path.getsize(f)))


if __name__ == "__main__":
    main()
