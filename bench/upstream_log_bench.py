#!/usr/bin/python3
"""
upstream_log_bench.py — what the upstream failure log (issue 19) costs during
an outage. sluice in front of a refused port (every request fails at
connect, no breaker, no retry, no template): failing requests per second
with the error log at `warn` (each failure goes through the rate limiter,
one line per interval is written) against `error` (the upstream lines are
not even formatted), in interleaved rounds on the same machine, and the
lines written per 1,000 failures. Prints figures, asserts nothing.

    /usr/bin/python3 bench/upstream_log_bench.py [ROUNDS] [REQUESTS]
    SLUICE_BIN=build/sluice (default)
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import helpers  # noqa: E402


def run(bin_path, workdir, level, n):
    url = "http://127.0.0.1:%d" % helpers.free_port()
    conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), url,
                             log={"access": "off", "level": level, "repeat_interval": "10s"},
                             fallback={"circuit": {"failures": 0, "failure_percent": 0}},
                             limits={"keepalive_requests": 1000000})
    s = helpers.Sluice(bin_path, workdir, conf, name="bench-" + level)
    try:
        body = helpers.chat_body()
        with s.client(timeout=10) as c:
            for _ in range(50):  # warm-up
                c.request("POST", "/v1/chat/completions", body)
            t0 = time.perf_counter()
            for _ in range(n):
                r = c.request("POST", "/v1/chat/completions", body)
                assert r.status == 502, r.status
            dt = time.perf_counter() - t0
        lines = sum(1 for ln in s.stderr_text().splitlines() if url in ln)
        return n / dt, lines
    finally:
        s.term()
        s.wait_exit(10)
        s.p.close_logs()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    bin_path = os.environ.get("SLUICE_BIN") or str(ROOT / "build" / "sluice")
    rate = {"warn": [], "error": []}
    lines = {"warn": [], "error": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(rounds):
            for level in (("warn", "error") if i % 2 == 0 else ("error", "warn")):
                r, ln = run(bin_path, Path(d) / ("%s-%d" % (level, i)), level, n)
                rate[level].append(r)
                lines[level].append(ln)
    w, e = statistics.median(rate["warn"]), statistics.median(rate["error"])
    print("failing requests/s, median of %d rounds of %d (one keep-alive client):" % (rounds, n))
    print("  log.level warn  (failures logged, rate-limited): %8.0f" % w)
    print("  log.level error (upstream lines off):            %8.0f" % e)
    print("  ratio warn/error: %.3f" % (w / e))
    print("error-log lines for %d failures (+50 warm-up) at warn: %s" % (n, lines["warn"]))


if __name__ == "__main__":
    main()
