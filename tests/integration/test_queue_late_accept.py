"""
test_queue_late_accept.py — the Redis queue's accept once sluice has said
"not stored" (docs/fallback.md, "queue": the accept deadline and the
take-back), through the real binary and a real redis-server:

Redis holds every write (CLIENT PAUSE WRITE from a second connection) for
longer than redis.timeout while a request that must be queued arrives. The
client gets the template without a request id. When Redis resumes, the
accept that was waiting in its socket runs, and must store nothing: the
counters keep one accept (the one made before the pause), the stream one
entry, no item is pending for the late request, and when the model server
comes back it gets the earlier request and never the late one.
"""

import pytest

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import bound, wait_until

PAUSE_MS = 1500  # well over redis.timeout, under the client's stall limit (2 s)


def items(redis):
    """{item key: st} of every sluice:q:item:* hash."""
    return {k: redis.cmd("HGET", k, "st") for k in redis.cmd("KEYS", "sluice:q:item:*")}


def acc(redis):
    return int(redis.cmd("HGET", "sluice:q:stats", "acc") or 0)


def prompts_seen(mock):
    return [r["json"]["messages"][-1]["content"] for r in mock.requests() if r.get("json")]


@pytest.mark.timeout(60)
def test_accept_after_the_deadline_stores_nothing(sluice_factory, mock_factory, tmp_path,
                                                  redis_server):
    port = helpers.free_port()  # the model server: down until the end
    q = {"enabled": True, "store": "redis", "backoff": "100ms", "backoff_max": "200ms",
         "lease": "2s", "max_attempts": 20}
    over = fh.chain(queue=q)
    over["redis"] = {"url": ph.redis_url(redis_server), "timeout": "200ms"}
    s = sluice_factory(overrides=over, upstream="http://127.0.0.1:%d" % port)

    # Before: an accept that works (and that the model server must get later).
    r = s.chat("before the pause")
    before = r.header("X-Sluice-Request-Id")
    assert fh.is_template(r) and before
    assert acc(redis_server) == 1
    m0 = fh.Metrics(s)

    assert redis_server.cmd("CLIENT", "PAUSE", PAUSE_MS, "WRITE") == "OK"
    r = s.chat("during the pause")
    fh.assert_template_json(r)  # the client still gets the template ...
    assert r.header("X-Sluice-Request-Id") is None  # ... told nothing was queued
    assert m0.delta("sluice_queue_store_errors_total") >= 1
    assert m0.delta("sluice_queue_accepted_total") == 0

    # Redis resumes: the accept held in its socket runs now, past its
    # deadline: it stores nothing and counts itself (stats late). Had it
    # stored, acc would read 2.
    def stat(f):
        return int(redis_server.cmd("HGET", "sluice:q:stats", f) or 0)

    wait_until(lambda: stat("late") >= 1 or acc(redis_server) != 1,
               bound(PAUSE_MS / 1000 + 10), interval=0.02, what="the held accept run")
    assert (acc(redis_server), stat("late")) == (1, 1)
    # The take-back sent after it on the same connection leaves a tombstone
    # (st c): a copy of the accept that had not run yet never will.
    wait_until(lambda: "c" in items(redis_server).values(), bound(10), interval=0.02,
               what="the take-back's tombstone")
    st = items(redis_server)
    assert acc(redis_server) == 1, (acc(redis_server), st)
    assert redis_server.cmd("XLEN", "sluice:q:stream") == 1, st
    assert sorted(st.items(), key=lambda kv: kv[1]) [-1] == ("sluice:q:item:" + before, "p"), st
    assert sorted(st.values()) == ["c", "p"], st
    wait_until(lambda: fh.metric(s, "sluice_queue_store_late") == 1, bound(5),
               what="the store's late count in /metrics")

    # The model server comes back: it gets the earlier request, never the late one.
    mock = mock_factory(name="back", port=port)
    wait_until(lambda: before in fh.mock_ids(mock), bound(10), what="the earlier request resent")
    wait_until(lambda: redis_server.cmd("HGET", "sluice:q:stats", "del") == "1", bound(10),
               what="its delivery recorded")
    seen = prompts_seen(mock)
    assert "during the pause" not in seen, seen
    assert seen.count("before the pause") == 1, seen
    assert acc(redis_server) == 1
