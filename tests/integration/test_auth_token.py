"""
test_auth_token.py — tokens and signatures through the real binary (issue
3): POST /v1/auth/token (client secret, no-store, per-address limit), a
signed request accepted with the signature computed in Python and by
`sluice sign` (the two must agree byte for byte), `sluice token`, and the
model server never seeing the app's token or signature headers.
"""

import hashlib
import hmac
import math
import subprocess
import time

import helpers
import policy_helpers as ph
from helpers import assert_error, chat_body


def test_token_endpoint_issues_a_working_token(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    t0 = int(time.time())
    r, tok = ph.fetch_token(s, sub="alice")
    assert r.status == 200, r
    assert r.header("Cache-Control") == "no-store"
    j = r.json()
    assert set(j) == {"access_token", "token_type", "expires_in", "signing_key"}
    assert j["token_type"] == "Bearer" and j["expires_in"] == 900
    hdr = ph.decode_header(tok.access_token)
    assert hdr["alg"] == "HS256" and hdr["kid"] == "k1"
    c = tok.claims
    assert c["sub"] == "alice" and c["iss"] == ph.ISSUER and c["aud"] == ph.AUDIENCE
    assert t0 - 1 <= c["iat"] <= int(time.time()) + 1 and c["exp"] - c["iat"] == 900
    assert len(c["jti"]) >= 16
    # the signing key is derivable from the jti by anyone with the signing secret
    assert tok.signing_key == ph.signing_key_for(c["jti"])
    # the token verifies with the configured secret (a real HS256 JWT)
    h, p, sig = tok.access_token.split(".")
    mac = hmac.new(ph.TOKEN_SECRET.encode(), ("%s.%s" % (h, p)).encode(), hashlib.sha256).digest()
    assert ph.b64url(mac) == sig
    # a second token has its own jti and signing key
    _, tok2 = ph.fetch_token(s, sub="alice")
    assert tok2.jti != tok.jti and tok2.signing_key != tok.signing_key

    assert mock.requests() == []  # issuance never touches the upstream
    r = ph.signed(s, tok, chat_body("hi there"))
    assert r.status == 200, r
    (req,) = mock.requests()
    # what the model server sees: our key, none of the app's credentials
    assert helpers.header_values(req["headers"], "Authorization") == ["Bearer " + helpers.UPSTREAM_KEY]
    sent = " ".join("%s: %s" % (k, v) for k, v in req["headers"])
    assert tok.access_token not in sent and tok.signing_key not in sent


def test_token_endpoint_ttl_and_refusals(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    r, tok = ph.fetch_token(s, sub="bob", ttl=60)
    assert r.status == 200 and r.json()["expires_in"] == 60
    assert tok.claims["exp"] - tok.claims["iat"] == 60
    r, _ = ph.fetch_token(s, secret="wrong-secret-0123456789")
    assert_error(r, 401, "invalid_client", "authentication_error")
    assert r.header("Cache-Control") == "no-store"
    assert "invalid_client" in (r.header("WWW-Authenticate") or "")
    assert ph.CLIENT_SECRET not in r.body.decode()
    r, _ = ph.fetch_token(s, client_id="nobody")
    assert_error(r, 401, "invalid_client", "authentication_error")
    r, _ = ph.fetch_token(s, ttl=7200)  # over max_lifetime (1h)
    assert_error(r, 400, "invalid_ttl")
    r = s.request("POST", "/v1/auth/token", {"client_id": ph.CLIENT_ID, "client_secret": ph.CLIENT_SECRET})
    assert_error(r, 400, "invalid_request")
    r = s.request("POST", "/v1/auth/token", {"client_id": ph.CLIENT_ID, "client_secret": ph.CLIENT_SECRET,
                                             "sub": "x", "admin": True})
    assert_error(r, 400, "invalid_request")
    ph.assert_upstream_untouched(mock)


def test_token_endpoint_limited_per_address(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, {"ratelimit": {"per_ip": {"requests_per_minute": 3}}})
    t0 = time.monotonic()
    r, _ = ph.fetch_token(s, sub="u0")
    t0_reply = time.monotonic()
    assert r.status == 200, r
    for i in (1, 2):
        r, _ = ph.fetch_token(s, sub="u%d" % i)
        assert r.status == 200, (i, r)
    t3 = time.monotonic()
    r, _ = ph.fetch_token(s, sub="u3")
    t3_done = time.monotonic()
    e = assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert e.get("limit") == "ip_requests_per_minute"
    # 3/min: one every 20 s; the next fits 20 s after the first was taken
    ra = int(r.header("Retry-After"))
    assert math.ceil(t0 + 20 - t3_done) <= ra <= math.ceil(t0_reply + 20 - t3), ra
    assert r.header("X-RateLimit-Limit") == "3" and r.header("X-RateLimit-Remaining") == "0"
    # a wrong secret is limited too (no free guessing)
    r, _ = ph.fetch_token(s, secret="guess-guess-guess-guess")
    assert r.status == 429
    # X-Forwarded-For is not believed from an untrusted peer
    r, _ = ph.fetch_token(s, sub="u4", headers={"X-Forwarded-For": "198.51.100.7"})
    assert r.status == 429
    m = s.metrics()
    assert m.value("sluice_ratelimited_total", limit="ip_requests_per_minute") == 3
    # /v1/* requests of users are not charged to the address limit
    tok = ph.mint("carol")
    assert ph.signed(s, tok).status == 200


def test_token_endpoint_trusts_forwarded_for_from_trusted_proxy(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, {"ratelimit": {"per_ip": {"requests_per_minute": 1},
                                                      "trusted_proxies": ["127.0.0.1"]}})
    fwd = lambda ip: {"X-Forwarded-For": ip}  # noqa: E731
    assert ph.fetch_token(s, headers=fwd("198.51.100.1"))[0].status == 200
    assert ph.fetch_token(s, headers=fwd("198.51.100.1"))[0].status == 429
    # another client behind the same proxy has its own budget
    assert ph.fetch_token(s, headers=fwd("198.51.100.2"))[0].status == 200
    # a client cannot escape by prepending: the right-most untrusted address counts
    assert ph.fetch_token(s, headers=fwd("203.0.113.9, 198.51.100.2"))[0].status == 429


def test_python_and_cli_signatures_agree_and_verify(sluice_factory, mock, tmp_path):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("dave")
    body = ph.body_bytes(chat_body("sign me \u00e9\u4f60"))
    for path in (ph.CHAT_PATH, ph.CHAT_PATH + "?x=1&y=two"):
        ts, nonce = int(time.time()), ph.new_nonce()
        mine = ph.sign(tok.signing_key, "POST", path, body, ts, nonce)
        cli = ph.cli_sign(s.bin, tok.signing_key, "POST", path, body, tmp_path, ts, nonce)
        assert cli == mine, (cli, mine)
    # each signer's output is accepted by the running sluice
    for who in ("python", "cli"):
        ts, nonce = int(time.time()), ph.new_nonce()
        if who == "python":
            h = ph.sign(tok.signing_key, "POST", ph.CHAT_PATH, body, ts, nonce)
        else:
            h = ph.cli_sign(s.bin, tok.signing_key, "POST", ph.CHAT_PATH, body, tmp_path, ts, nonce)
        h["Authorization"] = tok.bearer
        r = s.request("POST", ph.CHAT_PATH, body, h)
        assert r.status == 200, (who, r)
    # `sluice sign` without --timestamp/--nonce makes fresh ones that verify
    cli = ph.cli_sign(s.bin, tok.signing_key, "POST", ph.CHAT_PATH, body, tmp_path)
    assert abs(int(cli["X-Sluice-Timestamp"]) - time.time()) <= 2
    assert 16 <= len(cli["X-Sluice-Nonce"]) <= 64
    cli["Authorization"] = tok.bearer
    assert s.request("POST", ph.CHAT_PATH, body, cli).status == 200
    assert len(mock.requests()) == 3


def test_signed_get_and_models_behind_auth(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("erin")
    r = s.request("GET", "/v1/models")
    ph.assert_auth_error(r, "token_missing")
    r = ph.signed(s, tok, None, path="/v1/models", method="GET")
    assert r.status == 200, r


def test_cli_token_output_verifies(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    t0 = int(time.time())
    p, out = ph.cli_token(s, "frank", ttl="10m")
    assert p.returncode == 0, p.stderr
    assert set(out) >= {"access_token", "signing_key", "expires_in"}, out
    assert out["expires_in"] == "600"
    tok = ph.Token(out["access_token"], out["signing_key"])
    c = tok.claims
    assert c["sub"] == "frank" and c["iss"] == ph.ISSUER and c["aud"] == ph.AUDIENCE
    assert c["exp"] - c["iat"] == 600 and abs(c["iat"] - t0) <= 2
    assert tok.signing_key == ph.signing_key_for(c["jti"])
    assert ph.signed(s, tok).status == 200
    p, j = ph.cli_token(s, "frank", as_json=True)
    assert p.returncode == 0 and j["token_type"] == "Bearer" and j["expires_in"] == 900
    assert ph.signed(s, ph.Token(j["access_token"], j["signing_key"])).status == 200
    # a ttl over max_lifetime is refused; without the secret there is no token
    p, _ = ph.cli_token(s, "frank", ttl="2h")
    assert p.returncode != 0 and b"access_token" not in p.stdout
    env = dict(s.env)
    env.pop(ph.TOKEN_SECRET_ENV)
    q = subprocess.run([s.bin, "token", "--sub", "x", "-c", str(s.conf_path)], capture_output=True,
                       env=env, timeout=10)
    assert q.returncode != 0 and b"access_token" not in q.stdout
    assert len(mock.requests()) == 2
