"""Hostile and broken GGUF files through the real tool (`mdl_tool info`,
`generate`): every one must end in a one-line error naming the problem and
exit status 1 — never a crash. Under `make SANITIZE=1` the tool is built
with ASan+UBSan and mdltest.run() fails on any sanitizer report.

The variants start from a valid synthetic model and change one field,
located by a small position-recording parser below.
"""

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
import gguf_writer as W  # noqa: E402
import mdltest  # noqa: E402

pytestmark = pytest.mark.skipif(not mdltest.tool_path().exists(),
                                reason="mdl_tool not built (make ... tools)")


def layout(buf):
    """Offsets of the header fields: {'kv': [(key, type_off, value_off)],
    'tensors': [(name, ndims_off, dims_off, type_off, offset_off)]}."""
    off = 24
    n_t, n_kv = struct.unpack_from("<QQ", buf, 8)

    def rd_str(o):
        n = struct.unpack_from("<Q", buf, o)[0]
        return buf[o + 8:o + 8 + n].decode(), o + 8 + n

    def skip_val(t, o):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if t == 8:
            return rd_str(o)[1]
        if t == 9:
            it, cnt = struct.unpack_from("<IQ", buf, o)
            o += 12
            for _ in range(cnt):
                o = skip_val(it, o)
            return o
        return o + sizes[t]

    kvs, tensors = [], []
    for _ in range(n_kv):
        key, off = rd_str(off)
        t = struct.unpack_from("<I", buf, off)[0]
        kvs.append((key, off, off + 4))
        off = skip_val(t, off + 4)
    for _ in range(n_t):
        name, o2 = rd_str(off)
        nd = struct.unpack_from("<I", buf, o2)[0]
        tensors.append((name, o2, o2 + 4, o2 + 4 + 8 * nd, o2 + 8 + 8 * nd))
        off = o2 + 4 + 8 * nd + 4 + 8
    return {"kv": dict((k, (a, b)) for k, a, b in kvs),
            "tensors": dict((n, rest) for n, *rest in tensors), "end": off}


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "valid.gguf"
    W.make_model(str(path), wtype="Q8_0", untied=True, vocab=300, n_merges=20, seed=2)
    return path.read_bytes()


def check_error(tmp_path, data, needle, cmd="info"):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    if cmd == "info":
        r = mdltest.run("info", p, check=False)
    else:
        r = mdltest.run("generate", "--model", p, "--prompt", "hi", "--max-tokens", "2",
                        check=False)
    assert r.returncode == 1, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    text = r.stderr + r.stdout
    assert needle in text, "expected %r in:\n%s" % (needle, text[-1500:])
    return text


def patch(data, off, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def test_valid_file_info(valid, tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(valid)
    out = mdltest.run("info", p).stdout
    assert "general.architecture" in out and '"qwen2"' in out
    assert "blk.1.ffn_down.weight" in out and "Q8_0" in out
    assert "engine: qwen2 n_embd=64 n_layer=2 n_head=4 n_kv=2 head_dim=16" in out
    assert "separate head" in out


def test_truncated_everywhere(valid, tmp_path):
    lay = layout(valid)
    cuts = sorted(set(list(range(0, lay["end"] + 64, 37)) + [4, 8, 16, 24, lay["end"],
                                                          len(valid) - 40, len(valid) // 2]))
    for n in cuts:
        check_error(tmp_path, valid[:n], "model info:")


def test_bad_header_fields(valid, tmp_path):
    check_error(tmp_path, b"GGUX" + valid[4:], "bad magic")
    check_error(tmp_path, patch(valid, 4, "<I", 1), "version 1 is not supported")
    check_error(tmp_path, patch(valid, 4, "<I", 3 << 24), "byte-swapped")
    check_error(tmp_path, patch(valid, 8, "<Q", 1 << 40), "tensor count")
    check_error(tmp_path, patch(valid, 16, "<Q", 1 << 60), "metadata count")


def test_bad_metadata(valid, tmp_path):
    lay = layout(valid)
    t_off, v_off = lay["kv"]["general.architecture"]
    check_error(tmp_path, patch(valid, v_off, "<Q", 1 << 62), "metadata value needs")
    check_error(tmp_path, patch(valid, t_off, "<I", 77), "unknown value type 77")
    t_off, v_off = lay["kv"]["tokenizer.ggml.tokens"]
    check_error(tmp_path, patch(valid, v_off + 4, "<Q", 1 << 40), "array count")
    check_error(tmp_path, patch(valid, v_off, "<I", 9), "nested arrays")
    t_off, v_off = lay["kv"]["general.alignment"]
    check_error(tmp_path, patch(valid, v_off, "<I", 24), "power of two")


def test_bad_tensor_infos(valid, tmp_path):
    lay = layout(valid)
    nd_off, dims_off, type_off, offset_off = lay["tensors"]["blk.0.attn_q.weight"]
    check_error(tmp_path, patch(valid, type_off, "<I", 99), "unknown or unsupported type 99")
    check_error(tmp_path, patch(valid, offset_off, "<Q", 1 << 50), "outside")
    check_error(tmp_path, patch(valid, offset_off, "<Q", 16), "not aligned")
    check_error(tmp_path, patch(valid, nd_off, "<I", 7), "n_dims 7")
    check_error(tmp_path, patch(valid, dims_off, "<Q", 1 << 55), "bad dimension")
    check_error(tmp_path, patch(valid, dims_off, "<Q", 0), "bad dimension 0")
    # point one tensor at another's data
    prev = lay["tensors"]["blk.0.attn_norm.weight"][3]
    prev_val = struct.unpack_from("<Q", valid, prev)[0]
    check_error(tmp_path, patch(valid, offset_off, "<Q", prev_val), "overlap")


def test_structurally_valid_but_not_runnable(tmp_path):
    """Files the reader accepts but the engine refuses, with the reason."""
    cases = [
        (dict(wtype="Q8_0"), "general.architecture", "llama",
         "architecture 'llama' is not supported"),
        (dict(wtype="Q8_0"), "qwen2.attention.head_count_kv", 3, "not a multiple"),
        (dict(wtype="Q8_0"), "qwen2.embedding_length", 96, "shape"),
        (dict(wtype="Q8_0"), "qwen2.rope.freq_base", -5.0, "freq_base"),
    ]
    for kw, key, value, needle in cases:
        path = tmp_path / "m.gguf"
        W.make_model(str(path), vocab=300, n_merges=10, **kw)
        data = bytearray(path.read_bytes())
        lay = layout(bytes(data))
        t_off, v_off = lay["kv"][key]
        t = struct.unpack_from("<I", data, t_off)[0]
        if t == W.GV_STRING:
            assert len(value) == 5  # "qwen2" -> same length
            data[v_off + 8:v_off + 13] = value.encode()
        elif t == W.GV_F32:
            struct.pack_into("<f", data, v_off, value)
        else:
            struct.pack_into("<I", data, v_off, value)
        check_error(tmp_path, bytes(data), needle)
        check_error(tmp_path, bytes(data), needle, cmd="generate")


def test_missing_tensor_and_unsupported_type(valid, tmp_path):
    i = valid.index(b"blk.1.ffn_up.weight")
    bad = valid[:i] + b"blk.1.ffn_uX.weight" + valid[i + 19:]
    check_error(tmp_path, bad, "tensor blk.1.ffn_up.weight is missing")
    # Q4_1 is a valid ggml type the engine does not compute with
    W.GEOM[3] = (32, 20)
    W.TYPES["Q4_1"] = 3
    try:
        path = tmp_path / "q41.gguf"
        W.make_model(str(path), wtype="Q8_0", vocab=300, n_merges=10,
                     mix={"blk.1.ffn_up.weight": "Q4_1"})
        text = check_error(tmp_path, path.read_bytes(), "type Q4_1 is not supported")
        assert "blk.1.ffn_up.weight" in text
    finally:
        del W.GEOM[3]
        del W.TYPES["Q4_1"]
    # a norm vector stored as Q8_0: readable, but not what qwen2 expects
    path = tmp_path / "normq.gguf"
    W.make_model(str(path), wtype="Q8_0", vocab=300, n_merges=10,
                 mix={"blk.0.attn_norm.weight": "Q8_0"})
    check_error(tmp_path, path.read_bytes(), "expected F32 or F16")


def test_no_tokenizer_is_an_engine_error(tmp_path):
    path = tmp_path / "notok.gguf"
    W.make_model(str(path), vocab=300, n_merges=10)
    data = path.read_bytes()
    i = data.index(b"tokenizer.ggml.model")
    bad = data[:i] + b"tokenizer.ggml.mode_" + data[i + 20:]
    check_error(tmp_path, bad, "tokenizer.ggml.model", cmd="generate")
