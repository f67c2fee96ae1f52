"""
test_obs_queue.py — the queue's gauges and counters through the real binary
(issue 14), with the Redis store and with the journal, which must agree:

- while requests wait (the model server down), sluice_queue_depth equals the
  requests queued and sluice_queue_oldest_pending_seconds grows with the
  oldest one's age;
- once the server is back and every request was delivered,
  sluice_queue_delivered_total equals them, the depth and the oldest age are
  0, and no dead letters were counted.

With the Redis store these stayed 0 before: the gateway's maintenance runs
on a thread without a queue worker, and a delivery was counted only by the
journal.
"""

import pytest

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import bound, wait_until

N = 3


def queue_conf(tmp_path, store, redis):
    q = {"enabled": True, "store": store, "dir": str(tmp_path / "queue"), "backoff": "100ms",
         "backoff_max": "500ms", "lease": "2s", "max_attempts": 20}
    over = fh.chain(queue=q, circuit={"failures": 5, "cooldown": "500ms"})
    if store == "redis":
        over["redis"] = {"url": ph.redis_url(redis), "timeout": "500ms"}
    return over


@pytest.fixture(params=["redis", "journal"])
def store(request):
    return request.param


@pytest.mark.timeout(60)
def test_queue_metrics_while_waiting_and_after_delivery(sluice_factory, mock_factory, tmp_path,
                                                        store, request):
    redis_server = request.getfixturevalue("redis_server") if store == "redis" else None
    port = helpers.free_port()  # the model server: down until the end
    s = sluice_factory(overrides=queue_conf(tmp_path, store, redis_server),
                       upstream="http://127.0.0.1:%d" % port)
    m0 = fh.Metrics(s)
    assert m0.value("sluice_queue_depth") == 0
    ids = []
    for i in range(N):
        r = s.chat("waiting %d" % i)
        assert fh.is_template(r), r
        q = r.header("X-Sluice-Request-Id")
        assert q, r.headers
        ids.append(q)
    assert len(set(ids)) == N

    # Waiting: the depth is what was queued, the oldest age grows.
    wait_until(lambda: fh.metric(s, "sluice_queue_depth") == N, bound(5),
               what="queue depth %d while waiting" % N)
    wait_until(lambda: fh.metric(s, "sluice_queue_oldest_pending_seconds") >= 2, bound(8),
               what="oldest pending age growing")
    m = s.metrics()
    assert m.value("sluice_queue_depth") == N  # nothing delivered meanwhile
    assert m.value("sluice_queue_accepted_total") - m0.value("sluice_queue_accepted_total") == N
    assert m.value("sluice_queue_delivered_total") == m0.value("sluice_queue_delivered_total")
    ok, out = helpers.promtool_check(s.metrics_text())
    assert ok, out

    # The server comes back: all delivered, the gauges go back to 0.
    mock = mock_factory(name="back", port=port)
    wait_until(lambda: set(ids) <= set(fh.mock_ids(mock)), bound(20), interval=0.1,
               what="every queued request delivered")
    wait_until(lambda: fh.metric(s, "sluice_queue_delivered_total")
               - m0.value("sluice_queue_delivered_total") == N, bound(5),
               what="delivered_total %d" % N)
    wait_until(lambda: fh.metric(s, "sluice_queue_depth") == 0, bound(5), what="depth 0")
    wait_until(lambda: fh.metric(s, "sluice_queue_oldest_pending_seconds") == 0, bound(5),
               what="oldest age 0")
    m = s.metrics()
    assert m.value("sluice_queue_delivered_total") - m0.value("sluice_queue_delivered_total") == N
    assert m.value("sluice_queue_dead_letters_total") == m0.value("sluice_queue_dead_letters_total")
    for q in ids:
        assert s.request("GET", "/v1/requests/" + q).status == 200
