"""
test_reliability_redis.py — issue 15 item 8: once Redis is reachable again,
every Redis client of every worker uses it within the documented reconnect
backoff cap (5 s), however long the outage was.

Redis is killed and kept down long enough for every client's backoff to
reach its cap (100 ms doubling: the cap is reached after ~6.3 s), then
restarted on the same port; the time until sluice_redis_connected is back
to its value before the outage is measured. Before the fix the jitter was
added on top of the cap (up to 6.25 s); it is now taken off it. The bound
below allows for the connect itself and the metrics polling.
"""

import time

import pytest

import helpers
import policy_helpers as ph
from helpers import wait_until

RPM = {"per_user": {"requests_per_minute": 1000}}


@pytest.mark.timeout(90)
def test_redis_recovery_within_the_backoff_cap_on_every_worker(sluice_factory, mock, redis_server):
    s = ph.rl_start(sluice_factory, mock, dict(RPM, on_store_error="deny"), redis=redis_server,
                    extra={"workers": 2})
    # Every client sluice opened is connected (the count Redis sees, this
    # sluice being its only client): a snapshot taken while one was still
    # in its handshake would make the recovery below wait for too few, or
    # for a value the gauge jumps past.
    n = wait_until(lambda: (lambda c: c if c >= 2 and c == ph.redis_clients(redis_server) else 0)(
        ph.metric(s, "sluice_redis_connected")), helpers.bound(5), what="every client connected")
    recoveries = []
    for _ in range(2):
        ph.redis_kill(redis_server)
        t_down = time.monotonic()
        wait_until(lambda: ph.metric(s, "sluice_redis_connected") == 0, helpers.bound(5),
                   what="every client saw Redis go")
        # long enough for every client's backoff to reach the 5 s cap
        wait_until(lambda: time.monotonic() - t_down >= 8.0, 10, interval=0.1, what="outage")
        ph.redis_restart(redis_server)
        t_up = time.monotonic()
        wait_until(lambda: ph.metric(s, "sluice_redis_connected") == n, helpers.bound(15),
                   interval=0.02, what="every client back on Redis")
        recoveries.append(time.monotonic() - t_up)
    print("recovery after Redis came back: %s s" % ", ".join("%.2f" % r for r in recoveries))
    for r in recoveries:
        assert r <= helpers.bound(5.3), recoveries
