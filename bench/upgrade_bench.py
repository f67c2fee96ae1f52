#!/usr/bin/python3
"""
bench/upgrade_bench.py — what a SIGUSR2 binary upgrade (issue 13) costs the
clients: request latency in a window with an upgrade in its middle, against
a window without one, in interleaved rounds of the same run (the machine is
shared: only the ratios mean something). Also the time from SIGUSR2 to the
new process being ready (the old one's log line), and failures (target: 0).

Load: BENCH_THREADS (default 4) loops of chat requests, each on a fresh
connection (so every one goes through accept: the part the upgrade moves),
against the mock upstream of the tests. Knobs: BENCH_ROUNDS (default 3),
BENCH_WINDOW (s, default 3), SLUICE_BIN (default build/sluice).

    /usr/bin/python3 bench/upgrade_bench.py
"""

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import helpers  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WINDOW = float(os.environ.get("BENCH_WINDOW", "3"))
THREADS = int(os.environ.get("BENCH_THREADS", "4"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main():
    work = Path(tempfile.mkdtemp(prefix="sluice-upgrade-bench-"))
    exe = work / "sluice"
    shutil.copy2(os.environ.get("SLUICE_BIN") or ROOT / "build" / "sluice", exe)
    mock = helpers.Mock(work / "logs")
    conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), mock.url,
                             log={"access": "off", "level": "info"})
    s = helpers.Sluice(exe, work / "logs", conf)
    pids = [s.p.proc.pid]
    samples = []  # (t_start, latency, ok)
    stop = threading.Event()
    errors = []

    def load():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = s.chat("bench")
                ok = r.status == 200
                if not ok:
                    errors.append("%d %r" % (r.status, r.body[:200]))
            except Exception as e:
                ok = False
                errors.append(repr(e))
            samples.append((t0, time.monotonic() - t0, ok))

    threads = [threading.Thread(target=load) for _ in range(THREADS)]
    for t in threads:
        t.start()
    rows = []
    try:
        time.sleep(1)  # warm up
        for rnd in range(ROUNDS):
            a = time.monotonic()
            time.sleep(WINDOW)
            b = time.monotonic()
            time.sleep(WINDOW / 2)
            t_sig = time.monotonic()
            n_ready = s.stderr_text().count("is ready; draining this one")
            os.kill(pids[-1], signal.SIGUSR2)
            helpers.wait_until(lambda: s.stderr_text().count("is ready; draining this one") > n_ready,
                               10, what="the new process ready")
            t_ready = time.monotonic()
            started = [int(p) for p in re.findall(r"sluice started: .*, pid (\d+)", s.stderr_text())]
            pids.append(started[-1])
            time.sleep(WINDOW / 2)
            c = time.monotonic()
            base = [x for x in samples if a <= x[0] < b]
            up = [x for x in samples if b <= x[0] < c]
            rows.append((rnd, base, up, t_ready - t_sig))
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        helpers.wait_until(lambda: all(not os.path.exists("/proc/%d" % p) or
                                       "zombie" in open("/proc/%d/status" % p).read().lower()
                                       for p in pids), 20, what="every pid gone")
        mock.stop()
    print("round  window     reqs  fail  p50_ms  p99_ms  max_ms   p99/base  max/base  usr2->ready_ms")
    for rnd, base, up, swap in rows:
        lb = [x[1] * 1000 for x in base if x[2]]
        lu = [x[1] * 1000 for x in up if x[2]]
        for name, xs, lat in (("base", base, lb), ("upgrade", up, lu)):
            fails = sum(1 for x in xs if not x[2])
            print("%5d  %-8s %6d %5d %7.2f %7.2f %7.2f   %8.2f  %8.2f  %s" % (
                rnd, name, len(xs), fails, pct(lat, 0.5), pct(lat, 0.99), max(lat or [0]),
                pct(lat, 0.99) / pct(lb, 0.99), max(lat or [0]) / max(lb or [1]),
                "%.0f" % (swap * 1000) if name == "upgrade" else ""))
    total_fail = sum(1 for _, b, u, _ in rows for x in b + u if not x[2])
    print("failed requests, all rounds: %d" % total_fail)
    for e in errors[:5]:
        print("  " + e)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
