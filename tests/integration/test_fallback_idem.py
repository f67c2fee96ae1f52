"""
test_fallback_idem.py — Idempotency-Key through the real binary (issue 6,
part 6): the same key while the first request is in flight gets 409 (one
200 among concurrent copies, one upstream request); after it completed the
stored answer is replayed (Idempotent-Replayed: true, same bytes, no second
upstream request), JSON and SSE alike; the same key with another body gets
422; keys are scoped to the user; a failed request frees its key; a key
that is not 1..255 visible characters gets 400. With Redis as the store:
Redis down is a 503 store_unavailable for keyed requests only (what
gateway/hook_fallback.c does with FB_IDEM_STORE_ERROR), and it recovers
when Redis is back.
"""

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import mock_upstream

KEY = "Idempotency-Key"


def keyed(key, **h):
    d = {KEY: key}
    d.update(h)
    return d


def test_concurrent_same_key_one_proceeds(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(), upstream=mock)
    mock.set_default({"stall_first_byte": 0.5})  # the winner is still in flight when the others come
    body = helpers.chat_body("only once")
    data = ph.request_bytes(s.host, s.port, "POST", fh.CHAT, body, keyed("k-concurrent"))
    rs = ph.burst([(s.host, s.port, data)] * 8)
    assert ph.statuses(rs) == {200: 1, 409: 7}, ph.statuses(rs)
    for r in rs:
        if r.status == 409:
            helpers.assert_error(r, 409, "idempotency_key_in_use")
    assert len(mock.requests()) == 1
    # each copy asks again a few times (50 ms apart) before its 409, in case
    # the winner's answer was still on its way into the store
    assert fh.metric(s, "sluice_idempotency_in_flight_total") >= 7
    # Afterwards every copy gets the winner's answer, without generating.
    winner = next(r for r in rs if r.status == 200)
    for _ in range(3):
        r = s.request("POST", fh.CHAT, body, keyed("k-concurrent"))
        assert r.status == 200 and r.header("Idempotent-Replayed") == "true"
        assert r.body == winner.body
    assert len(mock.requests()) == 1
    assert fh.metric(s, "sluice_idempotent_replays_total") == 3


def test_replay_json_and_stream_and_mismatch(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(), upstream=mock)
    body = helpers.chat_body("replay me")
    r1 = s.request("POST", fh.CHAT, body, keyed("k-json"))
    assert r1.status == 200 and r1.header("Idempotent-Replayed") is None
    assert r1.json()["choices"][0]["message"]["content"] == mock_upstream.reply_text("replay me")
    r2 = s.request("POST", fh.CHAT, body, keyed("k-json"))
    assert r2.status == 200 and r2.header("Idempotent-Replayed") == "true"
    assert r2.body == r1.body and r2.header("Content-Type").startswith("application/json")
    # A stream: its events are stored and replayed as they were sent.
    sb = helpers.chat_body("stream me", stream=True)
    r3, ev3 = fh.stream(s, sb, keyed("k-sse"))
    assert ev3[-1].is_done
    r4, ev4 = fh.stream(s, sb, keyed("k-sse"))
    assert r4.header("Idempotent-Replayed") == "true"
    assert r4.header("Content-Type").startswith("text/event-stream")
    assert [e.raw for e in ev4] == [e.raw for e in ev3]
    assert len(mock.requests()) == 2
    # The same key with another body (even one byte): 422.
    other = helpers.chat_body("replay me!")
    helpers.assert_error(s.request("POST", fh.CHAT, other, keyed("k-json")), 422, "idempotency_key_reused")
    helpers.assert_error(s.request("POST", fh.CHAT, sb, keyed("k-json")), 422, "idempotency_key_reused")
    assert len(mock.requests()) == 2
    m = s.metrics()
    assert m.value("sluice_idempotent_replays_total") == 2
    assert m.value("sluice_idempotency_mismatch_total") == 2


def test_failures_free_the_key_and_4xx_are_kept(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(template=False), upstream=mock)
    body = helpers.chat_body("fails first")
    mock.script({"status": 500})
    assert s.request("POST", fh.CHAT, body, keyed("k-fail")).status == 500
    r = s.request("POST", fh.CHAT, body, keyed("k-fail"))  # not stored: generated now
    assert r.status == 200 and r.header("Idempotent-Replayed") is None
    assert len(mock.requests()) == 2
    # The model server's own 4xx is an answer: kept and replayed.
    mock.script({"status": 400, "body": {"error": {"message": "bad", "type": "invalid_request_error",
                                                    "code": "context_length_exceeded"}}})
    b2 = helpers.chat_body("too long")
    assert s.request("POST", fh.CHAT, b2, keyed("k-400")).status == 400
    r = s.request("POST", fh.CHAT, b2, keyed("k-400"))
    assert r.status == 400 and r.header("Idempotent-Replayed") == "true"
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert len(mock.requests()) == 3
    # Keys must be 1..255 visible ASCII characters.
    for bad in ("x" * 256, "with space", "tab\there", "é"):
        r = s.request("POST", fh.CHAT, body, {KEY: bad.encode("utf-8").decode("latin-1")})
        helpers.assert_error(r, 400, "invalid_idempotency_key")
    assert s.request("POST", fh.CHAT, body, keyed("x" * 255)).status == 200
    assert len(mock.requests()) == 4


def test_keys_are_scoped_to_the_user(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, {"auth": {"signing": {"required": False}}, **fh.chain()})
    alice, bob = ph.mint(sub="alice"), ph.mint(sub="bob")
    body = helpers.chat_body("mine")
    ra = ph.as_user(s, alice, body, keyed("shared-key"))
    rb = ph.as_user(s, bob, body, keyed("shared-key"))
    assert ra.status == rb.status == 200
    assert ra.header("Idempotent-Replayed") is None and rb.header("Idempotent-Replayed") is None
    assert len(mock.requests()) == 2
    # each replays their own; another body is 422 only for the key's owner
    assert ph.as_user(s, alice, body, keyed("shared-key")).body == ra.body
    assert ph.as_user(s, bob, body, keyed("shared-key")).body == rb.body
    assert ph.as_user(s, ph.mint(sub="carol"), helpers.chat_body("other"), keyed("shared-key")).status == 200
    assert len(mock.requests()) == 3


def test_redis_store_down_and_back(sluice_factory, mock, redis_server):
    over = fh.merge(fh.chain(), {"redis": {"url": ph.redis_url(redis_server), "timeout": "200ms"}})
    s = sluice_factory(overrides=over, upstream=mock)
    body = helpers.chat_body("redis keyed")
    assert s.request("POST", fh.CHAT, body, keyed("k-r1")).status == 200
    r = s.request("POST", fh.CHAT, body, keyed("k-r1"))
    assert r.header("Idempotent-Replayed") == "true"
    keys = redis_server.cmd("KEYS", "sluice:idem:*")
    assert len(keys) == 1, keys  # the key lives in Redis (hashed with the user)
    n_clients = ph.redis_settled_clients(s, redis_server)
    ph.redis_kill(redis_server)
    m0 = fh.Metrics(s)
    for k in ("k-r1", "k-r2"):
        helpers.assert_error(s.request("POST", fh.CHAT, body, keyed(k)), 503, "store_unavailable")
    assert s.chat("no key, no store needed").status == 200
    assert m0.delta("sluice_idempotency_store_errors_total") == 2
    assert len(mock.requests()) == 2
    ph.redis_restart(redis_server)  # empty: the stored answer is gone with it
    helpers.wait_until(lambda: s.request("POST", fh.CHAT, body, keyed("k-r3")).status == 200,
                       helpers.bound(10), what="keyed requests served again once Redis is back")
    ph.redis_wait_clients(redis_server, n_clients, s=s)
    r = s.request("POST", fh.CHAT, body, keyed("k-r3"))
    assert r.header("Idempotent-Replayed") == "true"
