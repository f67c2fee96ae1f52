"""The engine's forward pass against a float64 NumPy reference (tests/model/
reference.py) on synthetic qwen2 models of every weight type, tied and
separate heads (tests/model/gguf_writer.py), through `mdl_tool logits`.

- precise path (float activations): logits within 1e-4 of the reference on
  the dequantized weights, over a multi-token prompt and decode steps, and
  the same greedy tokens;
- fast path (int8 activations): against the reference emulating the same
  activation rounding. float32-vs-float64 noise flips a rounding now and
  then (about one activation in 10^5; the change then spreads through the
  KV cache), so the bound is 10% of the logits' spread: a wrong kernel is
  off by about 100%. The kernels themselves are held exactly to the
  emulation in tests/unit/test_model_quant.c;
- incremental decode == full recompute == batched prefill, bit for bit,
  also across thread counts and chunk sizes;
- scalar == AVX2 == AVX-512 kernels.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import mdltest  # noqa: E402
import reference  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")

PROMPT = [5, 100, 300, 7, 42, 9, 13, 77, 1, 250]
GEN = 6
ALL = sorted(mdltest.MODELS)
TYPED = [m for m in ALL if m.endswith("tied")] + ["mix-untied"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return mdltest.ModelCache(tmp_path_factory.mktemp("models"))


def ref_rows(path, generated, act_quant):
    m = reference.Model(str(path), act_quant=act_quant)
    toks = PROMPT + generated[:-1]
    return m.forward(toks), m


@pytest.mark.parametrize("name", ALL)
def test_precise_logits_match_reference(models, name, tmp_path):
    path = models.get(name)
    got, gen, _ = mdltest.logits(path, PROMPT, GEN, extra=["--precise"], tmpdir=tmp_path)
    ref, _ = ref_rows(path, gen, act_quant=False)
    got = got.reshape(ref.shape)
    assert ref.shape[0] == len(PROMPT) + GEN - 1
    diff = np.abs(got - ref).max()
    assert diff <= 1e-4, "max |engine - reference| = %g (logit std %.2f)" % (diff, ref.std())
    ok, checked = mdltest.greedy_agrees(ref, gen, len(PROMPT) - 1)
    assert ok, "greedy token %d differs: engine %s" % (checked, gen)
    assert checked >= 3, "reference margins too small to check greedy decoding"


@pytest.mark.parametrize("name", TYPED)
def test_fast_path_matches_emulated_reference(models, name, tmp_path):
    path = models.get(name)
    got, gen, kern = mdltest.logits(path, PROMPT, GEN, tmpdir=tmp_path)
    ref, _ = ref_rows(path, gen, act_quant=True)
    got = got.reshape(ref.shape)
    per_row = np.abs(got - ref).max(axis=1)
    assert per_row.max() <= 0.1 * ref.std(), per_row
    # against the pure float reference only quantization-noise agreement holds
    exact, _ = ref_rows(path, gen, act_quant=False)
    rel = np.abs(got - exact).max() / exact.std()
    assert rel < 0.25, "fast path off the float reference by %.3f logit std" % rel


@pytest.mark.parametrize("name", ["Q8_0-tied", "Q4_0-untied", "F16-tied", "Q4_K-untied",
                                  "mix-untied", "gqa4"])
@pytest.mark.parametrize("precise", [False, True])
def test_incremental_equals_recompute(models, name, precise, tmp_path):
    path = models.get(name)
    extra = ["--precise"] if precise else []
    outs = {}
    for mode in ("batch", "incremental", "recompute"):
        outs[mode] = mdltest.logits(path, PROMPT, GEN, mode=mode, extra=extra, tmpdir=tmp_path)
    base, gen, _ = outs["batch"]
    for mode in ("incremental", "recompute"):
        got, g2, _ = outs[mode]
        assert g2 == gen
        assert np.array_equal(got, base), "%s differs from batch by %g" % (
            mode, np.abs(got - base).max())


@pytest.mark.parametrize("name", ["Q8_0-untied", "Q5_0-tied", "Q6_K-tied"])
def test_threads_and_chunks_do_not_change_results(models, name, tmp_path):
    path = models.get(name)
    base, gen, _ = mdltest.logits(path, PROMPT, GEN, tmpdir=tmp_path)
    for extra in (["--threads", "2"], ["--threads", "3", "--batch", "3"], ["--batch", "1"]):
        got, g2, _ = mdltest.logits(path, PROMPT, GEN, extra=extra, tmpdir=tmp_path)
        assert g2 == gen and np.array_equal(got, base), extra


@pytest.mark.parametrize("name", ["F32-untied", "F16-tied", "Q8_0-tied", "Q4_0-tied",
                                  "Q5_0-untied", "Q4_K-tied", "Q6_K-untied", "mix-untied"])
@pytest.mark.parametrize("precise", [False, True])
def test_scalar_equals_simd(models, name, precise, tmp_path):
    levels = mdltest.cpu_levels()
    if len(levels) < 2:
        pytest.skip("this CPU has no SIMD level to compare")
    path = models.get(name)
    extra = ["--precise"] if precise else []
    res = {}
    for lvl in levels:
        got, gen, kern = mdltest.logits(path, PROMPT, GEN, extra=extra + ["--kernels", lvl],
                                        tmpdir=tmp_path)
        assert kern == lvl
        res[lvl] = (got, gen)
    base, gen = res["scalar"]
    V = base.size // (len(PROMPT) + GEN - 1)
    for lvl in levels[1:]:
        got, g2 = res[lvl]
        per_row = np.abs(got - base).reshape(-1, V).max(axis=1)
        if precise:
            assert per_row.max() <= 1e-4, (lvl, per_row)
        else:
            # bit-identical int8 activations and exact integer dots; only
            # the float summation order differs, which may flip a later
            # rounding (see the module comment)
            assert per_row.max() <= 0.1 * base.std(), (lvl, per_row)


def test_environment_forces_scalar(models, tmp_path):
    path = models.get("Q8_0-tied")
    _, _, kern = mdltest.logits(path, PROMPT, 1, env={"SLUICE_MDL_KERNELS": "scalar"},
                                tmpdir=tmp_path)
    assert kern == "scalar"
    _, _, kern = mdltest.logits(path, PROMPT, 1, tmpdir=tmp_path)
    assert kern == mdltest.cpu_levels()[-1]


def test_rope_base_comes_from_metadata(models, tmp_path):
    """Two files differing only in rope.freq_base give different logits, each
    matching the reference (which reads the same key)."""
    a = models.get("mha-rope1e4")
    b = tmp_path / "rope1e6.gguf"
    kw = dict(mdltest.MODELS["mha-rope1e4"], rope_base=1e6)
    mdltest.gguf_writer.make_model(str(b), **kw)
    la, ga, _ = mdltest.logits(a, PROMPT, 0, extra=["--precise"], tmpdir=tmp_path)
    lb, gb, _ = mdltest.logits(b, PROMPT, 0, extra=["--precise"], tmpdir=tmp_path)
    assert np.abs(la - lb).max() > 1e-3
    for path, got in ((a, la), (b, lb)):
        ref = reference.Model(str(path)).forward(PROMPT)
        assert np.abs(got.reshape(ref.shape) - ref).max() <= 1e-4


def test_context_overflow_and_bad_ids_are_errors(models, tmp_path):
    path = models.get("Q8_0-tied")
    p = mdltest.run("logits", "--model", path, "--tokens", "1,2,3,4", "--ctx", "3",
                    check=False)
    assert p.returncode == 1 and "evaluation failed" in p.stderr
    p = mdltest.run("logits", "--model", path, "--tokens", "1,99999", check=False)
    assert p.returncode == 1 and "out of range" in p.stderr
