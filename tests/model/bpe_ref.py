"""Independent Python reference for the engine's tokenizer: the Qwen2
pre-tokenizer regex through the `regex` module (Debian python3-regex),
GPT-2 byte-to-unicode mapping, and the textbook BPE loop (merge the
lowest-ranked adjacent pair, leftmost first, until none applies).

Special tokens (control and user-defined types) are split out first by
exact match, longest first, as HF's added-token handling does. No NFC
normalisation, matching the engine (see model/tok_internal.h).
"""

import unicodedata
import regex

from gguf_writer import PRETOK_RE, bytes_to_unicode

# \s spelled as Unicode White_Space (the engine and HF's Oniguruma agree on
# it; Python's own \s differs on U+001C..U+001F)
_WS = ("\\t\\n\\x0b\\f\\r\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029"
       "\\u202f\\u205f\\u3000")
PATTERN = (PRETOK_RE.replace(r"[^\s\p{L}\p{N}]", "[^" + _WS + r"\p{L}\p{N}]")
           .replace(r"\s*", "[" + _WS + "]*")
           .replace(r"\s+(?!\S)", "[" + _WS + "]+(?![^" + _WS + "])")
           .replace(r"\s+", "[" + _WS + "]+"))


class BPE:
    def __init__(self, tokens, types, merges):
        self.ids = {}
        for i, t in enumerate(tokens):
            self.ids.setdefault(t, i)
        self.ranks = {}
        for r, m in enumerate(merges):
            a, _, b = m.partition(" ")
            self.ranks.setdefault((a, b), r)
        self.b2u = bytes_to_unicode()
        specials = [t for t, ty in zip(tokens, types) if ty in (3, 4) and t]
        self.specials = sorted(set(specials), key=lambda s: (-len(s.encode()), s))
        self.re = regex.compile(PATTERN)

    @classmethod
    def from_gguf(cls, g):
        kv = g.kv
        return cls(kv["tokenizer.ggml.tokens"], kv.get("tokenizer.ggml.token_type",
                                                       [1] * len(kv["tokenizer.ggml.tokens"])),
                   kv.get("tokenizer.ggml.merges", []))

    def bpe(self, piece_bytes):
        word = [self.b2u[b] for b in piece_bytes]
        while len(word) > 1:
            best = None
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                # a merge counts only if its result is a token (the engine
                # drops rules whose parts or result are missing)
                if r is not None and word[i] + word[i + 1] in self.ids and \
                        (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            word[i:i + 2] = [word[i] + word[i + 1]]
        return [self.ids[w] for w in word]

    def encode_text(self, text):
        # Qwen's tokenizer.json: normalizer NFC, before the pre-tokenizer
        text = unicodedata.normalize("NFC", text)
        out = []
        for piece in self.re.findall(text):
            out += self.bpe(piece.encode("utf-8"))
        return out

    def encode(self, text, allow_special=True):
        if not allow_special or not self.specials:
            return self.encode_text(text)
        out, pos = [], 0
        while pos < len(text):
            best = None
            for s in self.specials:
                k = text.find(s, pos)
                if k >= 0 and (best is None or k < best[0]):
                    best = (k, s)
            if best is None:
                out += self.encode_text(text[pos:])
                break
            k, s = best
            out += self.encode_text(text[pos:k])
            out.append(self.ids[s])
            pos = k + len(s)
        return out
