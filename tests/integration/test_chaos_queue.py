"""
test_chaos_queue.py — the durable queue under chaos (issue 6, tier 5 and
the queue drill), through the real binary:

- 1,000 requests accepted while the model server is down (each gets the
  template with X-Sluice-Request-Id), sluice killed with kill -9 twice in
  the middle (restarted on the same conf and queue store), then the server
  comes back: every accepted request is delivered exactly once (the mock
  sees each queue id as X-Request-Id once, none lost, none twice) and
  GET /v1/requests/{id} gives 200 with the chat.completion for its own
  prompt; 202 with Retry-After while pending; 404 for unknown ids — with
  the journal and with the Redis store (appendonly, appendfsync always:
  what the durability promise needs, see docs/fallback.md);
- 404 for another user's id (auth on, two users);
- Redis down on the queue path: the template without a request id (the
  store error counted), GET answers 503, and it recovers;
- what a client's resend with the same Idempotency-Key gets.
"""

import collections
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import bound, mock_upstream, wait_until

N = 1000
WORKERS = 8
KILL_AT = (330, 660)  # accepted answers after which sluice is killed


def queue_over(tmp_path, store="journal", redis=None, backoff="100ms"):
    q = {"enabled": True, "store": store, "dir": str(tmp_path / "queue"), "backoff": backoff,
         "backoff_max": "500ms", "lease": "2s", "max_attempts": 20}
    over = fh.chain(queue=q, circuit={"failures": 5, "cooldown": "500ms"})
    if redis is not None:
        over["redis"] = {"url": ph.redis_url(redis), "timeout": "%dms" % bound(500)}
    return over


class Accepts:
    """Sends prompts from WORKERS threads on keep-alive connections and
    records what came back: prompt -> queue id. A request that got no
    answer (sluice was killed under it) is returned as not sent."""

    def __init__(self, s):
        self.s = s
        self.ids = {}
        self.lock = threading.Lock()
        self.bad = []

    def send(self, prompts):
        todo = list(prompts)
        failed = []
        it_lock = threading.Lock()

        def worker():
            c = None
            while True:
                with it_lock:
                    if not todo:
                        break
                    p = todo.pop(0)
                try:
                    if c is None:
                        c = self.s.client(timeout=20)
                    r = c.request("POST", fh.CHAT, helpers.chat_body(p))
                except (OSError, helpers.ProtocolError):
                    if c is not None:
                        c.close()
                    c = None
                    with it_lock:
                        failed.append(p)
                    continue
                qid = r.header("X-Sluice-Request-Id")
                with self.lock:
                    if fh.is_template(r) and qid:
                        self.ids[p] = qid
                    else:
                        self.bad.append((p, r.status, r.headers))
            if c is not None:
                c.close()

        with ThreadPoolExecutor(WORKERS) as ex:
            for f in [ex.submit(worker) for _ in range(WORKERS)]:
                f.result()
        return failed


def kill9_when(s, acc, n):
    """A thread that SIGKILLs sluice once n requests were accepted."""

    def run():
        wait_until(lambda: len(acc.ids) >= n or not s.alive(), bound(60), interval=0.005,
                   what="%d accepted" % n)
        os.kill(s.p.pid, signal.SIGKILL)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def get_all(s, ids, workers=WORKERS):
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda q: s.request("GET", "/v1/requests/" + q, timeout=20), ids))


def drill(sluice_factory, mock_factory, tmp_path, store, redis=None):
    port = helpers.free_port()  # the model server: down until the end
    s = sluice_factory(overrides=queue_over(tmp_path, store, redis),
                       upstream="http://127.0.0.1:%d" % port)
    prompts = ["queued request %04d" % i for i in range(N)]
    acc = Accepts(s)
    left = prompts
    for k, at in enumerate(KILL_AT):
        t = kill9_when(s, acc, at)
        not_sent = acc.send(left)
        t.join(bound(10))
        assert s.p.wait(bound(5)) == -signal.SIGKILL
        assert len(acc.ids) >= at and not_sent, (len(acc.ids), len(not_sent))
        if k == 0:
            # Pending while the server is down: 202 with a Retry-After.
            some = list(acc.ids.values())[:5]
            s.start()
            for q in some:
                r = s.request("GET", "/v1/requests/" + q)
                assert r.status == 202, r
                assert r.json() == {"id": q, "object": "request", "status": "pending"}
                assert int(r.header("Retry-After")) >= 1
        else:
            s.start()
        left = not_sent
    assert acc.send(left) == []
    assert acc.bad == [], acc.bad[:3]
    assert len(acc.ids) == N
    ids = list(acc.ids.values())
    assert len(set(ids)) == N
    for bogus in ("nope", "q" + "0" * 32, ids[0][:-1] + ("0" if ids[0][-1] != "0" else "1")):
        helpers.assert_error(s.request("GET", "/v1/requests/" + bogus), 404, "not_found")

    # The server comes back.
    t_back = time.monotonic()
    mock = mock_factory(name="back", port=port)
    want = set(ids)

    def delivered():
        seen = {v for v in fh.mock_ids(mock) if v in want}
        return len(seen) == N

    wait_until(delivered, bound(90), interval=0.5, what="every accepted request delivered")
    took = time.monotonic() - t_back
    # every answer stored and readable by the same (here: anonymous) user
    rs = get_all(s, ids)
    bodies = {}
    for p, q, r in zip(acc.ids.keys(), ids, rs):
        assert r.status == 200, (q, r)
        j = r.json()
        assert j["object"] == "chat.completion", j
        assert j["choices"][0]["message"]["content"] == mock_upstream.reply_text(p), (p, j)
        bodies[q] = j
    # exactly once: no queue id reached the model server twice, none is missing
    seen = collections.Counter(fh.mock_ids(mock))
    twice = {k: v for k, v in seen.items() if v > 1}
    assert twice == {}, twice
    assert set(seen) >= want
    # Requests whose client lost the answer in a kill may still have been
    # stored before it: at most one per sending connection and kill.
    extra = set(seen) - want
    assert len(extra) <= WORKERS * len(KILL_AT), extra
    reqs = mock.requests()
    assert all(helpers.header_values(q["headers"], "X-Sluice-Resend") for q in reqs)
    assert all(q["json"]["stream"] is False for q in reqs)
    m = s.metrics()
    wait_until(lambda: fh.metric(s, "sluice_queue_depth") == 0, bound(5), what="queue depth 0")
    assert m.value("sluice_queue_dead_letters_total") == 0
    return s, mock, took


@pytest.mark.timeout(180)
def test_queue_drill_journal(sluice_factory, mock_factory, tmp_path):
    s, mock, took = drill(sluice_factory, mock_factory, tmp_path, "journal")
    assert (tmp_path / "queue" / "journal").is_file()
    print("journal: %d delivered in %.1fs after the server came back" % (N, took))


@pytest.mark.timeout(180)
def test_queue_drill_redis(sluice_factory, mock_factory, tmp_path, redis_server):
    # What the README's guarantee needs from Redis (its AOF fsynced on every write).
    assert redis_server.cmd("CONFIG", "SET", "appendonly", "yes") == "OK"
    assert redis_server.cmd("CONFIG", "SET", "appendfsync", "always") == "OK"
    wait_until(lambda: "aof_rewrite_in_progress:0" in redis_server.cmd("INFO", "persistence")
               and "aof_enabled:1" in redis_server.cmd("INFO", "persistence"), bound(10),
               what="redis AOF on")
    # Redis's own account of its stalls (fsync, slow commands), for a failure's message.
    assert redis_server.cmd("CONFIG", "SET", "latency-monitor-threshold", "100") == "OK"
    try:
        s, mock, took = drill(sluice_factory, mock_factory, tmp_path, "redis", redis_server)
    except AssertionError as e:
        raise AssertionError("%s\nredis LATENCY LATEST (event, when, last ms, max ms): %r" % (
            e, redis_server.cmd("LATENCY", "LATEST"))) from None
    assert not (tmp_path / "queue" / "journal").exists()  # the stream, not the journal
    stats = redis_server.cmd("HGETALL", "sluice:q:stats")
    st = dict(zip(stats[::2], stats[1::2]))
    # accepted = delivered + dead + pending, across the three processes
    assert int(st["acc"]) == int(st["del"]) + int(st.get("dead", 0)) and int(st.get("dead", 0)) == 0, st
    assert int(st["acc"]) >= N
    print("redis: %d delivered in %.1fs after the server came back" % (N, took))


def test_another_users_id_is_404(sluice_factory, tmp_path):
    over = fh.merge(queue_over(tmp_path), {"auth": {"signing": {"required": False}}})
    s = ph.start(sluice_factory, fh.dead_url(), over)
    alice, bob = ph.mint(sub="alice"), ph.mint(sub="bob")
    r = ph.as_user(s, alice, helpers.chat_body("alice's question"))
    fh.assert_template_json(r)
    q = r.header("X-Sluice-Request-Id")
    assert q

    def get(tok):
        h = {"Authorization": tok.bearer} if tok else {}
        return s.request("GET", "/v1/requests/" + q, None, h)

    assert get(alice).status == 202
    helpers.assert_error(get(bob), 404, "not_found")
    assert get(None).status == 401


def test_redis_down_on_the_queue_path(sluice_factory, tmp_path, redis_server):
    s = sluice_factory(overrides=queue_over(tmp_path, "redis", redis_server), upstream=fh.dead_url())
    r = s.chat("before")
    q = r.header("X-Sluice-Request-Id")
    assert fh.is_template(r) and q
    n_clients = ph.redis_settled_clients(s, redis_server)
    ph.redis_kill(redis_server)
    m0 = fh.Metrics(s)
    for i in range(3):
        r = s.chat("during %d" % i)
        fh.assert_template_json(r)  # the client still gets the template ...
        assert r.header("X-Sluice-Request-Id") is None  # ... without an id it could not poll
    assert m0.delta("sluice_queue_store_errors_total") >= 3
    assert m0.delta("sluice_queue_accepted_total") == 0
    helpers.assert_error(s.request("GET", "/v1/requests/" + q), 503, "store_unavailable")
    ph.redis_restart(redis_server)  # empty (no persistence in this one): q is gone with it
    wait_until(lambda: s.chat("after").header("X-Sluice-Request-Id"), bound(10),
               what="queued again once Redis is back")
    # each worker has its own Redis connection, back within its reconnect
    # backoff (at most 5 s): until then a lookup on another worker may be 503
    ph.redis_wait_clients(redis_server, n_clients, s=s)
    helpers.assert_error(s.request("GET", "/v1/requests/" + q), 404, "not_found")


def test_keyed_resend_of_a_queued_request_gets_its_id(sluice_factory, tmp_path):
    """A client that lost the first answer and resends with its key gets
    the stored template again, with the same request id to poll."""
    s = sluice_factory(overrides=queue_over(tmp_path), upstream=fh.dead_url())
    h = {"Idempotency-Key": "net-drop-1"}
    r1 = s.chat("lost answer", headers=h)
    q = r1.header("X-Sluice-Request-Id")
    assert fh.is_template(r1) and q
    r2 = s.chat("lost answer", headers=h)
    assert r2.header("Idempotent-Replayed") == "true" and r2.body == r1.body
    assert fh.metric(s, "sluice_queue_accepted_total") == 1  # not queued twice
    assert r2.header("X-Sluice-Request-Id") == q


def test_pending_body_names_the_id_redis(sluice_factory, tmp_path, redis_server):
    """The 202 body names the id with the Redis store too (its lookup
    answers through a callback)."""
    s = sluice_factory(overrides=queue_over(tmp_path, "redis", redis_server), upstream=fh.dead_url())
    q = s.chat("pending").header("X-Sluice-Request-Id")
    assert q
    r = s.request("GET", "/v1/requests/" + q)
    assert r.status == 202
    assert r.json() == {"id": q, "object": "request", "status": "pending"}
