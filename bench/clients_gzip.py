#!/usr/bin/env python3
"""clients_gzip.py — what gzip (issue 12, item 10) costs and saves, in one
run on this machine: the real binary in front of the mock upstream, the
same non-streamed chat answer (~4 KiB of prose, or the size given) asked
for with and without `Accept-Encoding: gzip`, interleaved round by round so
a noisy neighbour moves both sides. Prints bytes on the wire per answer and
the median request time, each as a ratio gzip / plain.

    SLUICE_BIN=build/sluice /usr/bin/python3 bench/clients_gzip.py [ROUNDS] [TEXT_BYTES]
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
import helpers  # noqa: E402

WORDS = ("the a model server answer stream event token user request gateway network mobile "
         "retry limit breaker cooldown template queue signature nonce filter relay buffer "
         "latency because which although quickly slowly every never often today tomorrow "
         "事件 转发 缓冲 网络 模型 服务器 请求 用户 回答 稍后").split()


def prose(nbytes, seed=12):
    """Words drawn from a small vocabulary (seeded): compresses about as well
    as real model prose, unlike one sentence repeated."""
    import random
    rnd = random.Random(seed)
    out, n = [], 0
    while n < nbytes:
        w = rnd.choice(WORDS) + (rnd.choice([" ", " ", " ", ", ", ". "]))
        out.append(w)
        n += len(w.encode())
    return "".join(out)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    text = prose(size - 300)  # the rest of the answer is its JSON envelope
    tmp = Path(tempfile.mkdtemp(prefix="gzbench-"))
    mock = helpers.Mock(tmp / "logs")
    conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), mock.url,
                             gzip={"min_bytes": "1k"}, log={"access": "off", "level": "warn"})
    s = helpers.Sluice(os.environ.get("SLUICE_BIN", "build/sluice"), tmp, conf)
    try:
        mock.set_default({"text": text})
        body = json.dumps(helpers.chat_body("bench", max_tokens=16)).encode()
        times = {"plain": [], "gzip": []}
        sizes = {"plain": 0, "gzip": 0}
        with s.client() as c:
            for i in range(rounds):
                order = ("plain", "gzip") if i % 2 == 0 else ("gzip", "plain")
                for kind in order:
                    hdrs = {"Content-Type": "application/json"}
                    if kind == "gzip":
                        hdrs["Accept-Encoding"] = "gzip"
                    t0 = time.perf_counter()
                    r = c.request("POST", "/v1/chat/completions", body, hdrs)
                    times[kind].append(time.perf_counter() - t0)
                    assert r.status == 200, r.body
                    assert (r.header("Content-Encoding") == "gzip") == (kind == "gzip"), (
                        kind, r.header("Content-Encoding"), len(r.body))
                    sizes[kind] = len(r.body)
        p = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print("answer body: plain %d B, gzip %d B, ratio gzip/plain %.3f"
              % (sizes["plain"], sizes["gzip"], sizes["gzip"] / sizes["plain"]))
        print("median request time over %d interleaved rounds: plain %.0f us, gzip %.0f us, "
              "ratio gzip/plain %.2f" % (rounds, p["plain"], p["gzip"], p["gzip"] / p["plain"]))
    finally:
        s.finish()
        mock.stop()


if __name__ == "__main__":
    main()
