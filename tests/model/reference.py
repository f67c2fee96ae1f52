"""Float64 NumPy reference for the qwen2 engine: its own GGUF reader, its own
dequantizers (written from the block descriptions in the notes, §4.3), and
a full-sequence causal forward pass with HF semantics (rotate_half RoPE,
grouped-query attention, q/k/v biases, SwiGLU, tied or separate head).

act_quant=True emulates the engine's fast path: each input of a matrix
product with quantized weights is rounded to int8 per block of 32 using
the same float32 steps as the C code (d = max|x| / 127, q = rint(x / d)).
"""

import struct

import numpy as np

TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 6: "Q5_0", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}
GEOM = {0: (1, 4), 1: (1, 2), 2: (32, 18), 6: (32, 22), 8: (32, 34), 12: (256, 144), 14: (256, 210)}


class GGUF:
    def __init__(self, path):
        self.buf = open(path, "rb").read()
        self.off = 0
        magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", self.buf, 0)
        assert magic == b"GGUF" and version in (2, 3)
        self.off = 24
        self.kv = {}
        for _ in range(n_kv):
            k = self._str()
            t = self._u32()
            self.kv[k] = self._val(t)
        self.tensors = {}
        infos = []
        for _ in range(n_t):
            name = self._str()
            nd = self._u32()
            dims = [self._u64() for _ in range(nd)]
            t = self._u32()
            off = self._u64()
            infos.append((name, dims, t, off))
        align = self.kv.get("general.alignment", 32)
        data = (self.off + align - 1) // align * align
        for name, dims, t, off in infos:
            blk, bs = GEOM[t]
            n = int(np.prod(dims))
            self.tensors[name] = (dims, t, self.buf[data + off:data + off + n // blk * bs])

    def _u32(self):
        v = struct.unpack_from("<I", self.buf, self.off)[0]
        self.off += 4
        return v

    def _u64(self):
        v = struct.unpack_from("<Q", self.buf, self.off)[0]
        self.off += 8
        return v

    def _str(self):
        n = self._u64()
        s = self.buf[self.off:self.off + n].decode("utf-8")
        self.off += n
        return s

    def _val(self, t):
        fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}
        if t == 8:
            return self._str()
        if t == 9:
            it = self._u32()
            n = self._u64()
            return [self._val(it) for _ in range(n)]
        v = struct.unpack_from(fmts[t], self.buf, self.off)[0]
        self.off += struct.calcsize(fmts[t])
        return v

    def matrix(self, name):
        dims, t, raw = self.tensors[name]
        n_in = dims[0]
        n_out = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        return dequant(t, raw, n_in * n_out).reshape(n_out, n_in), t


def _f16(b):
    return np.frombuffer(b.tobytes(), dtype="<f2").astype(np.float64)


def dequant(t, raw, n):
    """float64 values of n elements of type t."""
    if t == 0:
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float64)
    if t == 1:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float64)
    blk, bs = GEOM[t]
    b = np.frombuffer(raw, dtype=np.uint8, count=n // blk * bs).reshape(-1, bs)
    if t == 8:  # Q8_0: d, qs[32]
        d = _f16(b[:, 0:2])
        q = b[:, 2:34].view(np.int8).astype(np.float64)
        return (d[:, None] * q).reshape(-1)
    if t == 2:  # Q4_0: element j = low nibble of qs[j], j+16 = high nibble; minus 8
        d = _f16(b[:, 0:2])
        qs = b[:, 2:18].astype(np.int64)
        q = np.concatenate([qs & 15, qs >> 4], axis=1) - 8
        return (d[:, None] * q).reshape(-1)
    if t == 6:  # Q5_0: d, qh (u32 LE), qs[16]; fifth bit j from qh; minus 16
        d = _f16(b[:, 0:2])
        qh = b[:, 2:6].copy().view("<u4").astype(np.int64).reshape(-1)
        qs = b[:, 6:22].astype(np.int64)
        j = np.arange(16)
        lo = (qs & 15) | (((qh[:, None] >> j) & 1) << 4)
        hi = (qs >> 4) | (((qh[:, None] >> (j + 16)) & 1) << 4)
        return (d[:, None] * (np.concatenate([lo, hi], axis=1) - 16)).reshape(-1)
    if t == 12:  # Q4_K
        d = _f16(b[:, 0:2])
        dmin = _f16(b[:, 2:4])
        sc = b[:, 4:16].astype(np.int64)
        qs = b[:, 16:144].astype(np.int64)
        out = np.empty((b.shape[0], 256))
        for j in range(8):
            if j < 4:
                s, m = sc[:, j] & 63, sc[:, j + 4] & 63
            else:
                s = (sc[:, j + 4] & 15) | ((sc[:, j - 4] >> 6) << 4)
                m = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
            c = j // 2
            q = qs[:, 32 * c:32 * c + 32]
            q = q & 15 if j % 2 == 0 else q >> 4
            out[:, 32 * j:32 * j + 32] = (d * s)[:, None] * q - (dmin * m)[:, None]
        return out.reshape(-1)
    if t == 14:  # Q6_K: ql[128], qh[64], scales[16] int8, d last
        ql = b[:, 0:128].astype(np.int64)
        qh = b[:, 128:192].astype(np.int64)
        sc = b[:, 192:208].view(np.int8).astype(np.float64)
        d = _f16(b[:, 208:210])
        out = np.empty((b.shape[0], 256))
        for h in range(2):
            l0, h0 = ql[:, 64 * h:64 * h + 64], qh[:, 32 * h:32 * h + 32]
            parts = [
                (l0[:, 0:32] & 15) | (((h0 >> 0) & 3) << 4),
                (l0[:, 32:64] & 15) | (((h0 >> 2) & 3) << 4),
                (l0[:, 0:32] >> 4) | (((h0 >> 4) & 3) << 4),
                (l0[:, 32:64] >> 4) | (((h0 >> 6) & 3) << 4),
            ]
            for g in range(4):
                for half in range(2):
                    e0 = 128 * h + 32 * g + 16 * half
                    k = e0 // 16
                    out[:, e0:e0 + 16] = (d * sc[:, k])[:, None] * (
                        parts[g][:, 16 * half:16 * half + 16] - 32)
        return out.reshape(-1)
    raise ValueError("type %d" % t)


def quantize_act(x):
    """The engine's per-32 int8 activation rounding, float32 steps."""
    xf = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.max(np.abs(xf), axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint((xf * idv[:, None]).astype(np.float32)), -127, 127)
    return (d.astype(np.float64)[:, None] * q.astype(np.float64)).reshape(-1)


class Model:
    def __init__(self, path, act_quant=False):
        g = GGUF(path)
        self.g = g
        kv = g.kv
        assert kv["general.architecture"] == "qwen2"
        self.E = kv["qwen2.embedding_length"]
        self.L = kv["qwen2.block_count"]
        self.H = kv["qwen2.attention.head_count"]
        self.KV = kv.get("qwen2.attention.head_count_kv", self.H)
        self.hd = self.E // self.H
        self.eps = kv.get("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
        self.base = kv.get("qwen2.rope.freq_base", 10000.0)
        self.act_quant = act_quant
        self.emb, self.emb_t = g.matrix("token_embd.weight")
        if "output.weight" in g.tensors:
            self.out, self.out_t = g.matrix("output.weight")
        else:
            self.out, self.out_t = self.emb, self.emb_t
        self.onorm = g.matrix("output_norm.weight")[0].reshape(-1)
        self.layers = []
        for i in range(self.L):
            p = "blk.%d." % i
            lay = {}
            for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                      "ffn_down"):
                lay[k] = g.matrix(p + k + ".weight")
            for k in ("attn_norm", "ffn_norm"):
                lay[k] = g.matrix(p + k + ".weight")[0].reshape(-1)
            for k in ("attn_q", "attn_k", "attn_v"):
                name = p + k + ".bias"
                lay[k + ".b"] = g.matrix(name)[0].reshape(-1) if name in g.tensors else 0.0
            self.layers.append(lay)
        self.n_vocab = self.emb.shape[0]

    def mm(self, wt, x):
        """x: [T, n_in] -> [T, n_out] for weight (matrix, type)."""
        w, t = wt
        if self.act_quant and t not in (0, 1):
            x = np.stack([quantize_act(r) for r in x])
        return x @ w.T

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x: [T, heads, hd]; HF rotate_half (NEOX) pairing."""
        half = self.hd // 2
        inv = self.base ** (-2.0 * np.arange(half) / self.hd)
        ang = np.asarray(pos)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def forward(self, tokens):
        """Logits [T, vocab] for every position, full causal recompute."""
        T = len(tokens)
        x = self.emb[np.asarray(tokens)]
        pos = np.arange(T)
        group = self.H // self.KV
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for lay in self.layers:
            h = self.rms(x, lay["attn_norm"])
            q = (self.mm(lay["attn_q"], h) + lay["attn_q.b"]).reshape(T, self.H, self.hd)
            k = (self.mm(lay["attn_k"], h) + lay["attn_k.b"]).reshape(T, self.KV, self.hd)
            v = (self.mm(lay["attn_v"], h) + lay["attn_v.b"]).reshape(T, self.KV, self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            o = np.empty((T, self.H, self.hd))
            for hh in range(self.H):
                g = hh // group
                sc = q[:, hh, :] @ k[:, g, :].T / np.sqrt(self.hd) + mask
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                o[:, hh, :] = sc @ v[:, g, :]
            x = x + self.mm(lay["attn_output"], o.reshape(T, -1))
            h = self.rms(x, lay["ffn_norm"])
            gt = self.mm(lay["ffn_gate"], h)
            up = self.mm(lay["ffn_up"], h)
            x = x + self.mm(lay["ffn_down"], gt / (1.0 + np.exp(-gt)) * up)
        return self.mm((self.out, self.out_t), self.rms(x, self.onorm))

    def greedy(self, prompt, n):
        toks = list(prompt)
        margins = []
        for _ in range(n):
            lg = self.forward(toks)[-1]
            order = np.argsort(lg)
            margins.append(lg[order[-1]] - lg[order[-2]])
            toks.append(int(order[-1]))
        return toks[len(prompt):], margins
