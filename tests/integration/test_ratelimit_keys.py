"""
test_ratelimit_keys.py — rate limits hold past max_keys (issue 21, item 1),
through the real binary: with max_keys 256 and 2 requests a minute, three
passes over N users let exactly 2 * min(N, 256) requests through — no user
ever gets a third, below the cap (eviction used to start at ~88%: 64 stripes
capped at max_keys/64 each) or above it (an evicted user came back with a
fresh burst: N = 512 allowed all 1,536). A new user while every tracked key
is live gets 429 with limit "max_keys" and a Retry-After, counted in
sluice_ratelimited_total{limit="max_keys"}; refused requests never reach the
upstream.
"""

import pytest

import helpers
import policy_helpers as ph
from helpers import assert_error, chat_body

MAX_KEYS = 256


def _passes(s, toks, passes=3):
    """`passes` passes over the users on one keep-alive connection:
    (statuses per user, the max_keys refusals)."""
    got = [[] for _ in toks]
    keys_refusals = []
    body = ph.body_bytes(chat_body("k"))
    c = s.client(timeout=helpers.bound(10))
    try:
        for _ in range(passes):
            for i, tok in enumerate(toks):
                c.send_request("POST", ph.CHAT_PATH, body, {"Authorization": tok.bearer})
                r = c.read_response()
                got[i].append(r.status)
                if r.status == 429 and r.json()["error"].get("limit") == "max_keys":
                    keys_refusals.append(r)
                if r.closed or "close" in (r.header("Connection") or "").lower():
                    c.close()  # a keep-alive connection serves so many requests
                    c = s.client(timeout=helpers.bound(10))
    finally:
        c.close()
    return got, keys_refusals


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [230, 512])
def test_users_never_exceed_the_limit_past_max_keys(sluice_factory, mock, n):
    s = ph.rl_start(sluice_factory, mock,
                    {"per_user": {"requests_per_minute": 2}, "max_keys": MAX_KEYS})
    toks = [ph.mint("user-%d" % i) for i in range(n)]
    got, refusals = _passes(s, toks)
    allowed = sum(st.count(200) for st in got)
    over = [i for i, st in enumerate(got) if st.count(200) > 2]
    assert not over, "users with more than 2 requests in a minute: %d (e.g. %r)" % (
        len(over), got[over[0]])
    assert allowed == 2 * min(n, MAX_KEYS), "N=%d: %d allowed" % (n, allowed)
    assert all(x in (200, 429) for st in got for x in st), got
    # the users past the cap: refused on every pass, as new keys
    assert len(refusals) == 3 * max(0, n - MAX_KEYS)
    for r in refusals[:5]:
        e = assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
        assert "max_keys" in e["message"], e
        assert 1 <= int(r.header("Retry-After")) <= 30, r.headers  # 1 of 2/min: idle in 30 s
        assert r.header("X-RateLimit-Limit") is None
    assert len(mock.requests()) == allowed
    m = s.metrics()
    assert m.value("sluice_ratelimited_total", limit="max_keys") == len(refusals)
    assert m.value("sluice_ratelimited_total", limit="requests_per_minute") == \
        3 * n - allowed - len(refusals)
