"""
test_auth_revoke.py — revocation through the admin listener (issue 3, part
3), through the real binary: POST /admin/revoke needs the admin key; by jti
one token stops working, by sub every token of that user issued up to that
second does (a later one works); with Redis, a revocation made through one
instance is enforced by the other within 1 s.
"""

import time

import helpers
import policy_helpers as ph
from helpers import assert_error, chat_body

ADMIN = {"Authorization": "Bearer " + ph.ADMIN_KEY}


def revoke(s, body, headers=ADMIN):
    return helpers.request("127.0.0.1", s.admin_port, "POST", "/admin/revoke", body, headers)


def test_revoke_needs_the_admin_key_and_the_admin_listener(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("alice")
    r = revoke(s, {"jti": tok.jti}, headers={})
    assert_error(r, 401, "invalid_admin_key", "authentication_error")
    r = revoke(s, {"jti": tok.jti}, headers={"Authorization": "Bearer " + ph.ADMIN_KEY[:-1] + "X"})
    assert_error(r, 401, "invalid_admin_key", "authentication_error")
    r = revoke(s, {"jti": tok.jti}, headers={"Authorization": "Bearer " + ph.CLIENT_SECRET})
    assert_error(r, 401, "invalid_admin_key", "authentication_error")
    assert ph.ADMIN_KEY not in r.body.decode()
    # a user's own token is not an admin key
    r = revoke(s, {"jti": tok.jti}, headers={"Authorization": tok.bearer})
    assert_error(r, 401, "invalid_admin_key", "authentication_error")
    for bad in ({}, {"jti": 5}, {"user": "alice"}, {"sub": "alice", "extra": 1}, [1]):
        assert_error(revoke(s, bad), 400, "invalid_request")
    # the public listener does not serve it
    r = s.request("POST", "/admin/revoke", {"jti": tok.jti}, ADMIN)
    assert r.status == 404, r
    # none of that revoked anything
    assert ph.signed(s, tok).status == 200
    assert len(mock.requests()) == 1
    assert ph.metric(s, "sluice_auth_rejected_total", reason="token_revoked") == 0


def test_revoke_by_jti(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    a, b = ph.mint("alice"), ph.mint("alice")
    assert ph.signed(s, a).status == 200  # cached as verified: revocation must still apply
    t0 = int(time.time())
    r = revoke(s, {"jti": a.jti})
    assert r.status == 200, r
    assert r.header("Cache-Control") == "no-store"
    j = r.json()
    assert j["revoked"] == {"jti": a.jti} and j["store"] == "local"
    assert t0 + 3600 + 60 <= j["until"] <= int(time.time()) + 3600 + 60  # max_lifetime + 2 x leeway
    ph.assert_auth_error(ph.signed(s, a), "token_revoked")
    assert ph.signed(s, b).status == 200  # the user's other token is untouched
    assert len(mock.requests()) == 2
    assert ph.metric(s, "sluice_auth_rejected_total", reason="token_revoked") == 1


def test_revoke_by_sub(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    now = int(time.time())
    old, new, bob = ph.mint("alice", iat=now - 60), ph.mint("alice"), ph.mint("bob")
    r = revoke(s, {"sub": "alice"})
    assert r.status == 200 and r.json()["revoked"] == {"sub": "alice"}, r
    cut = r.json()["until"] - 3660  # the revocation second
    assert now <= cut <= int(time.time())
    ph.assert_auth_error(ph.signed(s, old), "token_revoked")
    ph.assert_auth_error(ph.signed(s, new), "token_revoked")
    ph.assert_auth_error(ph.signed(s, ph.mint("alice", iat=cut)), "token_revoked")  # "at or before"
    assert ph.signed(s, bob).status == 200
    # a token issued after the revocation second works
    later = ph.mint("alice", iat=cut + 1)
    assert ph.signed(s, later).status == 200
    assert len(mock.requests()) == 2
    # both at once
    c = ph.mint("carol")
    r = revoke(s, {"sub": "carol", "jti": c.jti})
    assert r.status == 200 and r.json()["revoked"] == {"sub": "carol", "jti": c.jti}
    ph.assert_auth_error(ph.signed(s, c), "token_revoked")


def _wait_refused(s, tok, deadline):
    """Polls s with fresh signed requests until tok is refused as
    revoked; returns when (monotonic)."""
    while True:
        r = ph.signed(s, tok, chat_body("poll"))
        if r.status == 401:
            ph.assert_auth_error(r, "token_revoked")
            return time.monotonic()
        assert r.status == 200, r
        assert time.monotonic() < deadline, "revocation not effective within the deadline"


def test_revocation_reaches_the_other_instance_within_1s(sluice_factory, mock, redis_server):
    over = {"redis": ph.redis_section(redis_server)}
    a = ph.start(sluice_factory, mock, over, name="a")
    b = ph.start(sluice_factory, mock, over, name="b")
    t1, t2, keep = ph.mint("alice"), ph.mint("dora"), ph.mint("dora")
    for s in (a, b):
        assert ph.signed(s, t1).status == 200 and ph.signed(s, t2).status == 200

    # by jti, through A
    r = revoke(a, {"jti": t1.jti})
    t_rev = time.monotonic()
    assert r.status == 200 and r.json()["store"] == "redis", r
    limit = t_rev + helpers.bound(1.0)
    for s in (b, a):
        assert _wait_refused(s, t1, limit) - t_rev <= helpers.bound(1.0)

    # by sub, through B
    r = revoke(b, {"sub": "dora"})
    t_rev = time.monotonic()
    assert r.status == 200 and r.json()["store"] == "redis", r
    limit = t_rev + helpers.bound(1.0)
    for s in (a, b):
        assert _wait_refused(s, t2, limit) - t_rev <= helpers.bound(1.0)
        ph.assert_auth_error(ph.signed(s, keep), "token_revoked")
    assert redis_server.cmd("EXISTS", "sluice:rev:j:" + t1.jti) == 1
    assert redis_server.cmd("EXISTS", "sluice:rev:s:dora") == 1
    ttl = redis_server.cmd("TTL", "sluice:rev:s:dora")
    assert 3600 <= ttl <= 3661, ttl  # kept as long as a token it concerns can live
