"""`model generate` end to end (mdl_tool = `sluice model`): the chat prompt
goes through the engine (queue, generation thread, callbacks, UTF-8 repair)
and, at temperature 0, must print exactly the text the float64 reference's
greedy tokens decode to; the summary line reports finish reason, usage and
tokens/s. Also `model help` and bad usage.
"""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import bpe_ref  # noqa: E402
import gguf_writer as W  # noqa: E402
import mdltest  # noqa: E402
import reference  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")

SUMMARY = re.compile(r"finish=(\w+) prompt_tokens=(\d+) \(cached (\d+)\) completion_tokens=(\d+)"
                     r" prefill \d+ ms, ([\d.]+) tokens/s decode")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "m.gguf"
    W.make_model(str(path), wtype="F32", untied=True, head_type="F32", vocab=600, n_merges=300,
                 seed=21)
    return path


def reference_answer(path, prompt_ids, n):
    m = reference.Model(str(path))
    g = reference.GGUF(str(path))
    bpe = bpe_ref.BPE.from_gguf(g)
    ids, margins = m.greedy(prompt_ids, n)
    inv = {v: k for k, v in bpe.b2u.items()}
    tokens = g.kv["tokenizer.ggml.tokens"]
    types = g.kv["tokenizer.ggml.token_type"]
    out = b""
    for i in ids:
        if i in (bpe.ids["<|im_end|>"], bpe.ids["<|endoftext|>"]):
            return out, ids[:ids.index(i) + 1], margins, "stop"
        if types[i] == 1:
            out += bytes(inv[c] for c in tokens[i])
    return out, ids, margins, "length"


def test_generate_greedy_matches_reference(model):
    prompt = "Hello, who are you? 日本"
    ids = [int(x) for x in mdltest.run("chat-tokens", "--model", model, "--messages",
                                       "user=" + prompt).stdout.split(",")]
    want, toks, margins, why = reference_answer(model, ids, 12)
    assert min(margins) > 1e-3, "reference too close to a tie to compare"
    p = mdltest.run("generate", "--model", model, "--prompt", prompt, "--max-tokens", "12",
                    "--temperature", "0", "--precise")
    got = p.stdout.encode("utf-8")
    assert got.endswith(b"\n")
    assert got[:-1] == want.decode("utf-8", "replace").encode("utf-8"), (toks, p.stdout)
    m = SUMMARY.search(p.stderr)
    assert m, p.stderr
    assert m.group(1) == why
    assert int(m.group(2)) == len(ids)
    # the default system prompt was prefilled at start and reused
    assert int(m.group(3)) >= 20
    n_out = 12 if why == "length" else len(toks) - 1
    assert int(m.group(4)) == n_out
    assert float(m.group(5)) > 0


def test_generate_sampling_is_seeded(model):
    args = ["generate", "--model", model, "--prompt", "hi", "--max-tokens", "16",
            "--temperature", "1.0", "--top-p", "0.9", "--top-k", "40", "--seed", "5"]
    a = mdltest.run(*args).stdout
    b = mdltest.run(*args).stdout
    assert a == b
    c = mdltest.run(*(args[:-1] + ["6"])).stdout
    assert c != a


def test_help_and_bad_usage(model):
    p = mdltest.run("help")
    assert "generate --model FILE --prompt TEXT" in p.stdout
    p = mdltest.run(check=False)
    assert p.returncode == 2
    p = mdltest.run("generate", "--model", model, check=False)
    assert p.returncode == 1 and "--prompt" in p.stderr
    p = mdltest.run("generate", "--model", model, "--prompt", "x", "--threads", "0",
                    check=False)
    assert p.returncode == 2 and "--threads" in p.stderr
    p = mdltest.run("frobnicate", check=False)
    assert p.returncode == 2 and "unknown command" in p.stderr
    p = mdltest.run("generate", "--model", "/nonexistent.gguf", "--prompt", "x", check=False)
    assert p.returncode == 1 and "No such file" in p.stderr
