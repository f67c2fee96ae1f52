"""
test_auth_redis.py — the shared nonce and revocation stores when Redis dies
(issue 3, part 5), through the real binary and a real redis-server killed
(SIGKILL) and restarted mid-test, for each on_store_error setting:

- deny (nonces or revocations): 503 store_unavailable, the upstream gets
  nothing, counted; service comes back on its own once Redis does;
- allow for both: requests pass, and this instance's own stores still catch
  a replay sent to it and a revocation made through it (503 to the admin,
  enforced locally); back on Redis after the restart.
"""

import time

import pytest

import helpers
import policy_helpers as ph
from helpers import chat_body, wait_until

P = ph.CHAT_PATH
ADMIN = {"Authorization": "Bearer " + ph.ADMIN_KEY}


def _fallback(s, check, action):
    return ph.metric(s, "sluice_auth_store_fallback_total", check=check, action=action)


def _wait_served(s, tok, what):
    """Polls with fresh signed requests until one is served (Redis back)."""
    def ok():
        r = ph.signed(s, tok, chat_body("back?"))
        return r.status == 200
    wait_until(ok, helpers.bound(8), interval=0.05, what=what)


@pytest.mark.parametrize("nonces,revocations", [("deny", "deny"), ("allow", "deny"), ("deny", "allow")])
def test_redis_down_denies(sluice_factory, mock, redis_server, nonces, revocations):
    s = ph.start(sluice_factory, mock, {
        "redis": ph.redis_section(redis_server),
        "auth": {"on_store_error": {"nonces": nonces, "revocations": revocations}},
    })
    tok = ph.mint("alice")
    assert ph.signed(s, tok).status == 200
    n_up = len(mock.requests())
    n_clients = ph.redis_settled_clients(s, redis_server)

    ph.redis_kill(redis_server)
    t_kill = time.monotonic()
    for i in range(3):
        r = ph.signed(s, tok, chat_body("down %d" % i))
        ph.assert_auth_error(r, "store_unavailable", status=503)
    assert time.monotonic() - t_kill < helpers.bound(1.0)  # no waiting on a dead Redis
    assert len(mock.requests()) == n_up  # nothing went upstream
    # revocations are looked up first: deny there decides alone
    if revocations == "deny":
        assert _fallback(s, "revocations", "deny") == 3
        assert _fallback(s, "nonces", "deny") + _fallback(s, "nonces", "allow") == 0
    else:
        assert _fallback(s, "revocations", "allow") == 3 and _fallback(s, "nonces", "deny") == 3
    assert ph.metric(s, "sluice_auth_rejected_total", reason="store_unavailable") == 3

    ph.redis_restart(redis_server)
    _wait_served(s, tok, "service once redis-server is back")
    ph.redis_wait_clients(redis_server, n_clients, s=s)
    # and it is Redis that answers again: a replay is caught there
    body = ph.body_bytes(chat_body("after"))
    h = ph.signed_headers(tok, "POST", P, body)
    assert s.request("POST", P, body, h).status == 200
    assert redis_server.cmd("DBSIZE") >= 1
    ph.assert_auth_error(s.request("POST", P, body, h), "signature_replay")


def test_redis_down_allow_keeps_local_checks(sluice_factory, mock, redis_server):
    over = {
        "redis": ph.redis_section(redis_server),
        "auth": {"on_store_error": {"nonces": "allow", "revocations": "allow"}},
    }
    a = ph.start(sluice_factory, mock, over, name="a")
    b = ph.start(sluice_factory, mock, over, name="b")
    tok, victim = ph.mint("alice"), ph.mint("bob")
    assert ph.signed(a, tok).status == 200 and ph.signed(b, victim).status == 200

    ph.redis_kill(redis_server)
    body = ph.body_bytes(chat_body("while down"))
    h = ph.signed_headers(tok, "POST", P, body)
    assert a.request("POST", P, body, h).status == 200  # allowed without Redis
    ph.assert_auth_error(a.request("POST", P, body, h), "signature_replay")  # A's own store
    assert _fallback(a, "nonces", "allow") >= 2 and _fallback(a, "revocations", "allow") >= 2
    assert _fallback(a, "nonces", "deny") == 0

    # a revocation through A while Redis is down: 503 to the admin, held on A
    r = helpers.request("127.0.0.1", a.admin_port, "POST", "/admin/revoke", {"sub": "bob"}, ADMIN)
    helpers.assert_error(r, 503, "store_unavailable", "server_error")
    ph.assert_auth_error(ph.signed(a, victim), "token_revoked")
    assert ph.signed(b, victim).status == 200  # B cannot know (documented)

    ph.redis_restart(redis_server)
    # back on Redis: a request through B, its copy to A is a replay
    def shared():
        body2 = ph.body_bytes(chat_body("shared %f" % time.monotonic()))
        h2 = ph.signed_headers(tok, "POST", P, body2)
        if b.request("POST", P, body2, h2).status != 200:
            return False
        return a.request("POST", P, body2, h2).status == 401
    wait_until(shared, helpers.bound(8), interval=0.05, what="replays shared through Redis again")
    ph.assert_auth_error(ph.signed(a, victim), "token_revoked")  # still held on A
