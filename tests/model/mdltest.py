"""Shared helpers for the model tests (tests/integration/test_model_*.py):
where the tool is, running it, making synthetic models once per session,
and comparing logits.

The tool is $SLUICE_BUILD/tools/mdl_tool (the Makefile's integration target
sets SLUICE_BUILD), falling back to build/tools/mdl_tool.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import gguf_writer  # noqa: E402
import reference  # noqa: E402


def tool_path():
    build = os.environ.get("SLUICE_BUILD", str(ROOT / "build"))
    return Path(build) / "tools" / "mdl_tool"


def run(*args, check=True, env=None, timeout=120):
    """Runs mdl_tool with args; returns the CompletedProcess (text)."""
    e = dict(os.environ)
    e.pop("SLUICE_MDL_KERNELS", None)
    if env:
        e.update(env)
    p = subprocess.run([str(tool_path())] + [str(a) for a in args], capture_output=True,
                       text=True, env=e, timeout=timeout)
    if "Sanitizer" in p.stderr or "runtime error" in p.stderr:
        raise AssertionError("sanitizer report from mdl_tool %s:\n%s" % (args[:1], p.stderr))
    if p.returncode < 0:
        raise AssertionError("mdl_tool %s died with signal %d\n%s" % (args[:1], -p.returncode,
                                                                       p.stderr))
    if check and p.returncode != 0:
        raise AssertionError("mdl_tool %s failed (%d):\n%s%s" % (args, p.returncode, p.stdout,
                                                                 p.stderr))
    return p


def cpu_levels():
    """Kernel levels this CPU runs, as the tool reports them."""
    flags = open("/proc/cpuinfo").read()
    levels = ["scalar"]
    if " avx2 " in flags and " fma " in flags:
        levels.append("avx2")
        if all(" %s " % f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")):
            levels.append("avx512")
    return levels


# model name -> keyword arguments of gguf_writer.make_model
SMALL = dict(embd=64, layers=2, heads=4, kv_heads=2, ff=160, vocab=512)
KQ = dict(embd=256, layers=2, heads=4, kv_heads=2, ff=512, vocab=512)
MODELS = {}
for _t in ("F32", "F16", "Q8_0", "Q4_0", "Q5_0"):
    MODELS[_t + "-tied"] = dict(SMALL, wtype=_t, seed=11)
    MODELS[_t + "-untied"] = dict(SMALL, wtype=_t, untied=True, head_type="Q8_0", seed=12)
for _t in ("Q4_K", "Q6_K"):
    MODELS[_t + "-tied"] = dict(KQ, wtype=_t, seed=13)
    MODELS[_t + "-untied"] = dict(KQ, wtype=_t, untied=True, seed=14)
# what a Q4_K_M file of the 0.5B looks like: mostly Q5_0, Q8_0 embeddings,
# K-quant ffn_down, Q6_K head
MODELS["mix-untied"] = dict(KQ, wtype="Q5_0", embd_type="Q8_0", untied=True, head_type="Q6_K",
                            mix={"ffn_down.weight": "Q4_K", "attn_v.weight": "Q8_0"}, seed=15)
MODELS["mha-rope1e4"] = dict(SMALL, wtype="F32", heads=4, kv_heads=4, rope_base=10000.0,
                             seed=16)
MODELS["gqa4"] = dict(SMALL, wtype="Q8_0", embd=128, heads=8, kv_heads=2, seed=17)


class ModelCache:
    """Writes each synthetic model once into a directory."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.paths = {}

    def get(self, name):
        if name not in self.paths:
            path = self.dir / (name + ".gguf")
            gguf_writer.make_model(str(path), **MODELS[name])
            self.paths[name] = path
        return self.paths[name]


def logits(path, tokens, gen=0, mode="batch", extra=(), env=None, tmpdir=None):
    """Runs `mdl_tool logits`; returns (logits [rows, vocab], generated ids, kernels)."""
    out = Path(tmpdir) / ("logits-%d.bin" % os.getpid())
    p = run("logits", "--model", path, "--tokens", ",".join(map(str, tokens)), "--gen", gen,
            "--mode", mode, "--out", out, *extra, env=env)
    lines = p.stdout.splitlines()
    kernels = lines[0].split()[1]
    generated = [int(x) for x in lines[1].split(":")[1].split()]
    arr = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return arr, generated, kernels


def greedy_agrees(ref_logits, generated, first_row, min_margin=1e-2):
    """The engine's greedy tokens equal the reference's argmax at each step,
    checked up to the first step where the reference's top-2 margin is too
    small to call (a tie the float32 engine may break either way)."""
    checked = 0
    for i, tok in enumerate(generated):
        row = ref_logits[first_row + i]
        order = np.argsort(row)
        if row[order[-1]] - row[order[-2]] < min_margin:
            break
        if int(order[-1]) != tok:
            return False, i
        checked += 1
    return True, checked
