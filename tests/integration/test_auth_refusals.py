"""
test_auth_refusals.py — every way a request can fail auth, through the real
binary (issue 3, parts 1, 4 and 7): each reaches the client as 401 with
WWW-Authenticate and an OpenAI-style error whose code names the check; the
upstream receives nothing (no request, no byte); and
sluice_auth_rejected_total{reason} moves by exactly one per refusal.

One sluice serves a whole table of cases (starting one per case would cost
more than the cases); a failure lists every case that went wrong.
"""

import json
import time

import helpers
import policy_helpers as ph
from helpers import chat_body, wait_until

P = ph.CHAT_PATH


def _now():
    return int(time.time())


def _send(s, headers, body=None, path=P, method="POST"):
    b = ph.body_bytes(body if body is not None else chat_body("refuse me"))
    return s.request(method, path, b, headers)


def _tok_headers(token_text, key=None):
    """A request signed correctly for a token given as text (the signing
    key of an unparseable token is just some key)."""
    body = ph.body_bytes(chat_body("refuse me"))
    h = {"Authorization": "Bearer " + token_text}
    h.update(ph.sign(key or ph.signing_key_for("whatever"), "POST", P, body))
    return h


def _unsigned_jwt(alg):
    h = ph.b64url(json.dumps({"alg": alg, "typ": "JWT", "kid": "k1"}))
    now = _now()
    c = ph.b64url(json.dumps({"iss": ph.ISSUER, "aud": ph.AUDIENCE, "sub": "mallory", "jti": "j" * 20,
                              "iat": now, "exp": now + 600}))
    return "%s.%s." % (h, c)


def _mint_text(**kw):
    return ph.mint(**kw).access_token


def _dup_claims():
    now = _now()
    raw = ('{"iss":"sluice","aud":"chat","sub":"alice","sub":"admin","jti":"%s","iat":%d,"exp":%d}'
           % ("d" * 22, now, now + 600))
    return ph.jwt_encode(None, None, raw_header='{"alg":"HS256","typ":"JWT","kid":"k1"}', raw_claims=raw)


def _dup_alg():
    now = _now()
    claims = json.dumps({"iss": "sluice", "aud": "chat", "sub": "a", "jti": "e" * 22, "iat": now,
                         "exp": now + 600})
    return ph.jwt_encode(None, None, raw_header='{"alg":"none","alg":"HS256","kid":"k1"}', raw_claims=claims)


def token_cases():
    """(name, reason, headers maker) for token refusals."""
    good = ph.mint("alice")
    body = ph.body_bytes(chat_body("refuse me"))
    sig = lambda: ph.sign(good.signing_key, "POST", P, body)  # noqa: E731

    def with_auth(v):
        return lambda: dict(sig(), Authorization=v)

    parts = good.access_token.split(".")
    cases = [
        ("no Authorization", "token_missing", lambda: sig()),
        ("Basic scheme", "token_missing", with_auth("Basic YWxpY2U6c2VjcmV0")),
        ("empty bearer", "token_missing", with_auth("Bearer ")),
        ("two parts", "token_malformed", with_auth("Bearer %s.%s" % (parts[0], parts[1]))),
        ("bad base64", "token_malformed", with_auth("Bearer %s.%s!.%s" % (parts[0], parts[1], parts[2]))),
        ("claims not JSON", "token_malformed",
         with_auth("Bearer %s.%s.%s" % (parts[0], ph.b64url("not json"), parts[2]))),
        ("duplicate sub", "token_malformed", lambda: _tok_headers(_dup_claims())),
        ("duplicate alg", "token_malformed", lambda: _tok_headers(_dup_alg())),
        ("over 8 KiB", "token_malformed",
         lambda: _tok_headers(_mint_text(extra={"pad": "x" * 9000}))),
        ("crit header", "token_malformed",
         lambda: _tok_headers(_mint_text(header_extra={"crit": ["exp"]}))),
        ("alg none", "token_alg", lambda: _tok_headers(_unsigned_jwt("none"))),
        ("alg None", "token_alg", lambda: _tok_headers(_unsigned_jwt("None"))),
        ("alg NONE", "token_alg", lambda: _tok_headers(_unsigned_jwt("NONE"))),
        ("alg RS256 on an HS256 key", "token_alg", lambda: _tok_headers(_mint_text(alg="RS256"))),
        ("alg HS512", "token_alg", lambda: _tok_headers(_mint_text(alg="HS512"))),
        ("unknown kid", "token_unknown_kid", lambda: _tok_headers(_mint_text(kid="k9"))),
        ("another key's signature", "token_signature",
         lambda: _tok_headers(_mint_text(secret=ph.OTHER_SECRET))),
        ("stripped signature", "token_signature",
         with_auth("Bearer %s.%s." % (parts[0], parts[1]))),
        ("truncated signature", "token_signature",
         with_auth("Bearer %s.%s.%s" % (parts[0], parts[1], parts[2][:40]))),
        ("claims altered", "token_signature",
         with_auth("Bearer %s.%s.%s" % (parts[0], ph.b64url(json.dumps(dict(good.claims, sub="root"))),
                                        parts[2]))),
        ("expired", "token_expired", lambda: _tok_headers(_mint_text(iat=_now() - 1000, ttl=900))),
        ("iat in the future", "token_not_yet_valid", lambda: _tok_headers(_mint_text(iat=_now() + 120))),
        ("nbf in the future", "token_not_yet_valid",
         lambda: _tok_headers(_mint_text(extra={"nbf": _now() + 120}))),
        ("lifetime over max", "token_lifetime", lambda: _tok_headers(_mint_text(ttl=3600 + 60))),
        ("wrong iss", "token_issuer", lambda: _tok_headers(_mint_text(extra={"iss": "evil"}))),
        ("no iss", "token_issuer", lambda: _tok_headers(_mint_text(drop=("iss",)))),
        ("wrong aud", "token_audience", lambda: _tok_headers(_mint_text(extra={"aud": "billing"}))),
        ("aud list without ours", "token_audience",
         lambda: _tok_headers(_mint_text(extra={"aud": ["billing", "admin"]}))),
        ("no sub", "token_claims", lambda: _tok_headers(_mint_text(drop=("sub",)))),
        ("no jti", "token_claims", lambda: _tok_headers(_mint_text(drop=("jti",)))),
        ("no exp", "token_claims", lambda: _tok_headers(_mint_text(drop=("exp",)))),
        ("no iat", "token_claims", lambda: _tok_headers(_mint_text(drop=("iat",)))),
        ("sub a number", "token_claims", lambda: _tok_headers(_mint_text(extra={"sub": 42}))),
    ]
    return cases


def signature_cases():
    tok = ph.mint("alice")
    other = ph.mint("alice")
    body = ph.body_bytes(chat_body("refuse me"))

    def h(**kw):
        d = {"Authorization": tok.bearer}
        d.update(ph.sign(tok.signing_key, "POST", P, body, **kw))
        return d

    def without(name):
        return lambda: {k: v for k, v in h().items() if k != name}

    def replace(name, value, **kw):
        return lambda: dict(h(**kw), **{name: value})

    def signed_as(method=None, path=None, ts=None, nonce=None, body_=None, key=None):
        """Signed over altered inputs, sent as the real request."""
        def make():
            t, n = _now(), ph.new_nonce()
            d = {"Authorization": tok.bearer}
            d.update(ph.sign(key or tok.signing_key, method or "POST", path or P,
                             body_ if body_ is not None else body, ts or t, nonce or n))
            d["X-Sluice-Timestamp"], d["X-Sluice-Nonce"] = str(t), n
            return d
        return make

    return [
        ("no signature header", "signature_missing", without("X-Sluice-Signature")),
        ("no nonce header", "signature_missing", without("X-Sluice-Nonce")),
        ("no timestamp header", "signature_missing", without("X-Sluice-Timestamp")),
        ("timestamp -301 s", "signature_timestamp", lambda: h(ts=_now() - 301)),
        ("timestamp +301 s", "signature_timestamp", lambda: h(ts=_now() + 301)),
        ("timestamp -1 day", "signature_timestamp", lambda: h(ts=_now() - 86400)),
        ("timestamp not a number", "signature_timestamp", replace("X-Sluice-Timestamp", "soon")),
        ("timestamp with fraction", "signature_timestamp",
         replace("X-Sluice-Timestamp", "%d.5" % _now())),
        ("timestamp in ms", "signature_timestamp",
         replace("X-Sluice-Timestamp", str(_now() * 1000))),
        ("nonce 15 chars", "signature_nonce", lambda: h(nonce="a" * 15)),
        ("nonce 65 chars", "signature_nonce", lambda: h(nonce="a" * 65)),
        ("nonce with a space", "signature_nonce", lambda: h(nonce="abcdefgh ijklmnopq")),
        ("nonce with /", "signature_nonce", lambda: h(nonce="abcdefgh/ijklmnopq")),
        ("method altered", "signature_mismatch", signed_as(method="PUT")),
        ("path altered", "signature_mismatch", signed_as(path="/v1/completions")),
        ("query added", "signature_mismatch", signed_as(path=P + "?a=1")),
        ("timestamp altered", "signature_mismatch", signed_as(ts=_now() - 1)),
        ("nonce altered", "signature_mismatch", signed_as(nonce=ph.new_nonce())),
        ("body altered", "signature_mismatch", signed_as(body_=body.replace(b"refuse", b"refusE"))),
        ("another token's key", "signature_mismatch", signed_as(key=other.signing_key)),
        ("signature upper-case hex", "signature_mismatch",
         lambda: (lambda d: dict(d, **{"X-Sluice-Signature": d["X-Sluice-Signature"].upper()}))(h())),
        ("signature truncated", "signature_mismatch",
         lambda: (lambda d: dict(d, **{"X-Sluice-Signature": d["X-Sluice-Signature"][:-2]}))(h())),
    ]


def _wait_second_start():
    # "+301 s" must still be 301 s ahead when sluice reads its clock: start
    # early in a second (pacing, not synchronisation) - but not in its first
    # 50 ms, where sluice's time(2) (the kernel's coarse clock, up to a tick
    # behind) may still read the second before and take "-301 s" for -300.
    wait_until(lambda: 0.05 < time.time() % 1.0 < 0.6, 2, interval=0.01, what="early in a second")


def _run_table(s, mock, cases):
    before = s.metrics()
    counts, failures = {}, []
    for name, reason, make in cases:
        _wait_second_start()
        r = _send(s, make())
        counts[reason] = counts.get(reason, 0) + 1
        try:
            ph.assert_auth_error(r, reason)
            body = r.body.decode()
            assert ph.TOKEN_SECRET not in body and ph.SIGNING_SECRET not in body
            assert "Bearer ey" not in body
        except AssertionError as e:
            failures.append("%s: %s" % (name, str(e).splitlines()[0]))
    assert not failures, "\n".join(failures)
    ph.assert_upstream_untouched(mock)
    after = s.metrics()
    for reason, n in counts.items():
        got = after.value("sluice_auth_rejected_total", reason=reason) - before.value(
            "sluice_auth_rejected_total", reason=reason)
        assert got == n, "sluice_auth_rejected_total{reason=%s} moved by %s, want %d" % (reason, got, n)
    # and the access log names the reason of each refusal
    def logged():
        kinds = [e.get("error") for e in s.access_log()]
        return all(kinds.count(rsn) >= n for rsn, n in counts.items())
    wait_until(logged, helpers.bound(3), what="refusals in the access log")


def test_every_token_refusal(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    _run_table(s, mock, token_cases())


def test_every_signature_refusal(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    _run_table(s, mock, signature_cases())


def test_timestamp_edges_accepted(sluice_factory, mock):
    # -299 s is before this process started: the window alone is tested
    # here (test_auth_replay.py covers refuse_before_start)
    s = ph.start(sluice_factory, mock, {"auth": {"signing": {"refuse_before_start": False}}})
    tok = ph.mint("alice")
    for d in (-299, 299, 0):
        _wait_second_start()
        r = ph.signed(s, tok, ts=_now() + d)
        assert r.status == 200, (d, r)
    assert len(mock.requests()) == 3


def test_refused_signature_does_not_burn_the_nonce(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("alice")
    body = ph.body_bytes(chat_body("n"))
    ts, nonce = _now(), ph.new_nonce()
    h = {"Authorization": tok.bearer}
    h.update(ph.sign(tok.signing_key, "POST", P, body, ts, nonce))
    bad = dict(h, **{"X-Sluice-Signature": "0" * 64})
    ph.assert_auth_error(s.request("POST", P, body, bad), "signature_mismatch")
    assert s.request("POST", P, body, h).status == 200
    ph.assert_auth_error(s.request("POST", P, body, h), "signature_replay")
    assert len(mock.requests()) == 1


def test_signatures_optional_but_checked_when_present(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, {"auth": {"signing": {"required": False}}})
    tok = ph.mint("alice")
    r = s.request("POST", P, chat_body("x"), {"Authorization": tok.bearer})
    assert r.status == 200, r
    h = ph.signed_headers(tok, "POST", P, b"something else")
    ph.assert_auth_error(s.request("POST", P, chat_body("x"), h), "signature_mismatch")
    ph.assert_auth_error(s.request("POST", P, chat_body("x")), "token_missing")
    assert len(mock.requests()) == 1


def test_auth_off_without_auth_section(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, auth=False)
    assert s.request("POST", P, chat_body("x")).status == 200
    r = s.request("POST", "/v1/auth/token", {"client_id": ph.CLIENT_ID, "client_secret": ph.CLIENT_SECRET,
                                             "sub": "a"})
    helpers.assert_error(r, 404, "not_found")
