#!/usr/bin/python3
"""
bench/queue_drain.py — how fast the durable queue drains once the model
server is back (issue 15 item 7), for both stores, in the same run.

Per round and store: a fresh sluice (workers: 2) and queue store, N chat
requests queued while nothing listens at the model server's address (each
gets the template and a request id), an outage of OUTAGE seconds in all
(resend attempts fail and back off meanwhile), then the scripted mock comes
up on that address; the figure is the time from then until the mock has
seen every queued request, and the rate N / time. Rounds alternate the
stores (journal, redis, journal, redis, ...) so machine noise hits both.
Prints each run, then the medians and the ratio redis / journal of the
rates (1.0 = the store does not matter).

Usage: bench/queue_drain.py [N] [ROUNDS] [OUTAGE_S]   (defaults 500 3 2)
Needs: build/sluice (or SLUICE_BIN), redis-server, /usr/bin/python3.
"""

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import fallback_helpers as fh  # noqa: E402
import helpers  # noqa: E402


def queue_conf(d, store, redis):
    q = {"enabled": True, "store": store, "dir": str(d / "queue"), "backoff": "200ms",
         "backoff_max": "2s", "lease": "5s", "max_attempts": 50}
    over = fh.chain(queue=q, circuit={"failures": 5, "cooldown": "500ms"})
    if redis is not None:
        over["redis"] = {"url": "redis://127.0.0.1:%d/0" % redis.port, "timeout": "500ms"}
    return over


def queue_while_down(s, n, workers=8):
    ids, lock, todo = [], threading.Lock(), list(range(n))

    def worker():
        c = s.client(timeout=20)
        while True:
            with lock:
                if not todo:
                    break
                i = todo.pop()
            r = c.request("POST", fh.CHAT, helpers.chat_body("queued %04d" % i))
            q = r.header("X-Sluice-Request-Id")
            if fh.is_template(r) and q:
                with lock:
                    ids.append(q)
        c.close()

    ts = [threading.Thread(target=worker) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return ids


def one_run(binary, store, n, outage):
    with tempfile.TemporaryDirectory(prefix="sluice-qdrain-") as td:
        d = Path(td)
        redis = helpers.RedisServer(d / "redis") if store == "redis" else None
        port = helpers.free_port()
        conf = helpers.base_conf(helpers.free_port(), helpers.free_port(),
                                 "http://127.0.0.1:%d" % port, workers=2)
        conf = helpers.deep_merge(conf, queue_conf(d, store, redis))
        conf["log"] = {"access": "off", "level": "warn"}
        s = helpers.Sluice(binary, d / "logs", conf)
        mock = None
        try:
            t0 = time.monotonic()
            ids = queue_while_down(s, n)
            while time.monotonic() - t0 < outage:
                time.sleep(0.05)  # the outage lasts; not synchronisation
            t_back = time.monotonic()
            mock = helpers.Mock(d / "logs", name="back", port=port)
            want = set(ids)
            helpers.wait_until(lambda: want <= set(fh.mock_ids(mock)), 300, interval=0.05,
                               what="all delivered")
            took = time.monotonic() - t_back
            return len(ids), took
        finally:
            if mock:
                mock.stop()
            s.finish()
            if redis:
                redis.stop()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    outage = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    binary = os.environ.get("SLUICE_BIN") or str(ROOT / "build" / "sluice")
    rates = {"journal": [], "redis": []}
    for k in range(rounds):
        for store in ("journal", "redis"):
            got, took = one_run(binary, store, n, outage)
            rates[store].append(got / took)
            print("round %d %-7s %4d delivered in %6.2f s  %7.1f/s" % (k + 1, store, got, took,
                                                                        got / took), flush=True)
    mj, mr = statistics.median(rates["journal"]), statistics.median(rates["redis"])
    print("median drain rate: journal %.1f/s  redis %.1f/s  ratio redis/journal %.2f"
          % (mj, mr, mr / mj))


if __name__ == "__main__":
    main()
