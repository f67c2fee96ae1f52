"""
test_reliability_queue.py — issue 15 item 7: the durable queue drains as
fast as the model server takes the requests once it is back, with bounded
concurrency, whatever the store (journal or Redis).

500 requests are queued while the model server is down (each client gets
the template and a request id); the server comes back and every one must
reach it within a bound. The same scenario, timed for both stores, is
bench/queue_drain.py (the drain rate and the Redis/journal ratio).
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import bound, wait_until

N = 500


def queue_conf(tmp_path, store, redis=None):
    q = {"enabled": True, "store": store, "dir": str(tmp_path / "queue"), "backoff": "200ms",
         "backoff_max": "2s", "lease": "5s", "max_attempts": 50}
    over = fh.chain(queue=q, circuit={"failures": 5, "cooldown": "500ms"})
    if redis is not None:
        over["redis"] = {"url": ph.redis_url(redis), "timeout": "500ms"}
    return over


def queue_while_down(s, n, workers=8):
    """n chat requests answered with the template and a queue id."""
    ids = []
    lock = threading.Lock()
    todo = list(range(n))

    def worker():
        c = s.client(timeout=20)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                r = c.request("POST", fh.CHAT, helpers.chat_body("queued %04d" % i))
                assert fh.is_template(r), (r.status, r.headers)
                q = r.header("X-Sluice-Request-Id")
                assert q
                with lock:
                    ids.append(q)
        finally:
            c.close()

    with ThreadPoolExecutor(workers) as ex:
        for f in [ex.submit(worker) for _ in range(workers)]:
            f.result()
    return ids


def drain(sluice_factory, mock_factory, tmp_path, store, redis=None, n=N, outage_s=2.0):
    """Queues n requests during an outage of outage_s seconds, brings the
    server back, and returns (seconds until all n were delivered, the
    most requests the server saw at once)."""
    port = helpers.free_port()
    s = sluice_factory(overrides=queue_conf(tmp_path, store, redis),
                       upstream="http://127.0.0.1:%d" % port)
    t0 = time.monotonic()
    ids = queue_while_down(s, n)
    assert len(set(ids)) == n
    # the outage goes on for a while: resend attempts fail and back off
    left = outage_s - (time.monotonic() - t0)
    if left > 0:
        wait_until(lambda: time.monotonic() - t0 >= outage_s, left + 1, what="the outage")
    t_back = time.monotonic()
    mock = mock_factory(name="back", port=port)
    want = set(ids)
    wait_until(lambda: want <= set(fh.mock_ids(mock)), bound(120), interval=0.05,
               what="every queued request delivered")
    took = time.monotonic() - t_back
    reqs = mock.requests()
    # bounded concurrency: never more in flight than the resender's slots
    events = sorted([(q["t"], 1) for q in reqs] + [(q["t_end"] or q["t"], -1) for q in reqs])
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return s, mock, took, peak


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["journal", "redis"])
def test_500_queued_requests_drain_within_a_bound(sluice_factory, mock_factory, tmp_path, store,
                                                  request):
    redis = request.getfixturevalue("redis_server") if store == "redis" else None
    s, mock, took, peak = drain(sluice_factory, mock_factory, tmp_path, store, redis)
    print("%s: %d delivered in %.2f s (%.0f/s), peak in flight %d" % (store, N, took, N / took,
                                                                      peak))
    # the mock answers at once: 500 requests at 8 in flight take well under
    # a second of its time; the bound leaves room for the breaker's cooldown
    # and a slow machine
    assert took < bound(10), took
    assert peak <= 16, peak
