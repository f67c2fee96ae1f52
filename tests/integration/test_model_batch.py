"""Continuous batching must not change results: a sequence's logits are bit
for bit the same evaluated alone or in batched steps with others (joining
at different steps, prompts in chunks between the others' decode tokens),
for every weight type and kernel level, with one thread or two; and through
the engine API, requests served together get the same sampled answers as
the same requests served one at a time. The float64 NumPy reference judges
the alone path (test_model_forward.py); this file ties batched to alone.
"""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import mdltest  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return mdltest.ModelCache(tmp_path_factory.mktemp("batch-models"))


BATCH_MODELS = ["Q8_0-tied", "Q4_0-untied", "Q5_0-tied", "F16-untied", "Q4_K-tied",
                "mix-untied", "gqa4"]


@pytest.mark.parametrize("name", BATCH_MODELS)
@pytest.mark.parametrize("kernels", mdltest.cpu_levels())
def test_batched_steps_equal_alone(models, name, kernels):
    p = mdltest.run("batch-check", "--model", models.get(name), "--streams", 6, "--gen", 10,
                    "--batch", 128, "--kernels", kernels, "--threads", 2, check=False)
    lines = p.stdout.strip().splitlines()
    seqs = [ln for ln in lines if ln.startswith("seq=")]
    assert len(seqs) == 6, p.stdout + p.stderr
    for ln in seqs:
        m = re.search(r"alone=(\w+) batched=(\w+) tokens=([\d,]+) (\w+)", ln)
        assert m, ln
        assert m.group(1) == m.group(2), ln  # every logit row, hashed
        assert len(m.group(3).split(",")) == 10
        assert m.group(4) == "identical"
    assert lines[-1].endswith("identical=1"), lines[-1]
    assert p.returncode == 0


def test_batched_precise_path_equal_alone(models):
    p = mdltest.run("batch-check", "--model", models.get("Q8_0-untied"), "--streams", 4,
                    "--gen", 6, "--batch", 64, "--precise")
    assert p.stdout.strip().splitlines()[-1].endswith("identical=1")


def serve(path, max_batch, streams=5, extra=()):
    p = mdltest.run("serve", "--model", path, "--streams", streams, "--max-tokens", 24,
                    "--max-batch", max_batch, "--temperature", "1.3", "--top-k", "0",
                    "--seed", 7, "--ctx", 512, *extra)
    rows = {}
    summary = None
    for ln in p.stdout.splitlines():
        if ln.startswith("stream="):
            f = dict(kv.split("=", 1) for kv in ln.split())
            rows[int(f["stream"])] = f
        elif ln.startswith("summary"):
            summary = dict(kv.split("=", 1) for kv in ln.split()[1:])
    assert len(rows) == streams and summary, p.stdout
    return rows, summary


def test_engine_batched_answers_equal_one_at_a_time(models):
    path = models.get("Q4_0-untied")
    alone, s1 = serve(path, 1)
    together, s5 = serve(path, 5)
    assert s1["max_batch"] == "1" and s5["max_batch"] == "5"
    for i in range(5):
        a, b = alone[i], together[i]
        for k in ("finish", "prompt_tokens", "completion_tokens", "text_hex"):
            assert a[k] == b[k], (i, k, a[k], b[k])
    # the streams differ from each other (their prompts do), so equality above
    # is not the trivial kind
    assert len({alone[i]["text_hex"] for i in range(5)}) > 1 or \
        len({alone[i]["prompt_tokens"] for i in range(5)}) > 1
    # batched: far fewer steps than tokens (one step serves every stream)
    tokens = sum(int(together[i]["completion_tokens"]) for i in range(5))
    assert int(s5["steps"]) < tokens / 2, s5
    assert int(s1["steps"]) >= tokens, s1


def test_engine_batch_obeys_the_kv_budget_and_threads(models):
    # two compute threads give the same answers as one
    path = models.get("Q8_0-tied")
    one, _ = serve(path, 4, streams=4)
    two, s2 = serve(path, 4, streams=4, extra=("--threads", 2))
    assert s2["threads"] == "2"
    for i in range(4):
        assert one[i]["text_hex"] == two[i]["text_hex"]
