"""Prefix reuse: a conversation's next turn computes only its new tokens,
whether its slot is still free (slot affinity) or other conversations took
every slot in between (the state was saved to the prefix store when its
slot was needed), and the answer is the same as when everything is
recomputed from scratch (`mdl_tool followup`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import mdltest  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return mdltest.ModelCache(tmp_path_factory.mktemp("prefix-models"))


def followup(path, *extra):
    p = mdltest.run("followup", "--model", path, "--prompt-tokens", 600, "--max-batch", 3,
                    "--ctx", 2048, *extra)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("turn1_")]
    assert len(line) == 1, p.stdout + p.stderr
    return dict(kv.split("=", 1) for kv in line[0].split())


@pytest.mark.parametrize("name", ["Q8_0-tied", "Q4_0-untied"])
def test_followup_reuses_the_conversation(models, name):
    path = models.get(name)
    fresh = followup(path, "--interleave", 3, "--no-reuse")
    assert fresh["turn2_cached_tokens"] == "0"
    t1 = int(fresh["turn1_prompt_tokens"])
    assert t1 > 400
    for k in (0, 3):  # slot still free / slots all taken in between
        r = followup(path, "--interleave", k)
        assert r["turn1_prompt_tokens"] == fresh["turn1_prompt_tokens"]
        assert r["turn2_prompt_tokens"] == fresh["turn2_prompt_tokens"]
        # everything up to the first turn's prompt is reused
        assert int(r["turn2_cached_tokens"]) >= t1, r
        # and the answer does not change
        assert r["turn2_text_hex"] == fresh["turn2_text_hex"]
        assert r["turn2_finish"] == fresh["turn2_finish"]
        if k:
            assert int(r["prefix_cache_saves"]) >= 1
            assert int(r["prefix_cache_hits"]) >= 1
        else:
            assert r["prefix_cache_hits"] == "0"  # the slot itself held it
