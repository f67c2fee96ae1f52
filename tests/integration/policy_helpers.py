"""
policy_helpers.py — what the black-box tests of auth (issue 3), rate limits
(issue 4) and filters (issue 5) share, on top of helpers.py: confs with the
test secrets, JWTs minted in Python (HS256, any claims, any header), request
signatures computed in Python and by `sluice sign`, tokens from
POST /v1/auth/token and `sluice token`, a burst sender that makes N requests
arrive at once (every byte but the last sent first), and a redis-server that
can be killed and started again on the same port.

Stdlib only. Nothing here sleeps to synchronise: waits poll with deadlines.
"""

import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import time

import helpers
from helpers import bound, wait_until

# ---- secrets (env vars named by the conf) ---------------------------------------

TOKEN_SECRET_ENV = "SLUICE_TEST_TOKEN_SECRET"
SIGNING_SECRET_ENV = "SLUICE_TEST_SIGNING_SECRET"
CLIENT_SECRET_ENV = "SLUICE_TEST_CLIENT_SECRET"
ADMIN_KEY_ENV = "SLUICE_TEST_ADMIN_KEY"

TOKEN_SECRET = "tok-secret-for-tests-0123456789abcdefXYZ"  # >= 32 bytes
SIGNING_SECRET = "sig-secret-for-tests-9876543210fedcbaQRS"
OTHER_SECRET = "another-secret-nobody-configured-0123456789"
CLIENT_ID = "test-app"
CLIENT_SECRET = "client-secret-abcdef0123"  # >= 16 bytes
ADMIN_KEY = "admin-key-0123456789abcdef"
ISSUER = "sluice"
AUDIENCE = "chat"
CHAT_PATH = "/v1/chat/completions"

AUTH_ENV = {
    TOKEN_SECRET_ENV: TOKEN_SECRET,
    SIGNING_SECRET_ENV: SIGNING_SECRET,
    CLIENT_SECRET_ENV: CLIENT_SECRET,
    ADMIN_KEY_ENV: ADMIN_KEY,
}


def auth_section(**over):
    """The `auth:` section: one HS256 key k1, issuer/audience set, one
    client, signatures required, the admin key. `over` is deep-merged."""
    a = {
        "required": True,
        "tokens": {
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "ttl": "15m",
            "max_lifetime": "1h",
            "leeway": "30s",
            "keys": [{"kid": "k1", "alg": "HS256", "secret_env": TOKEN_SECRET_ENV}],
        },
        "clients": [{"id": CLIENT_ID, "secret_env": CLIENT_SECRET_ENV}],
        "signing": {"required": True, "secret_env": SIGNING_SECRET_ENV, "window": "300s"},
        "admin_key_env": ADMIN_KEY_ENV,
    }
    return helpers.deep_merge(a, over)


def start(sluice_factory, upstream, overrides=None, auth=True, env=None, name=None):
    """sluice with the test secrets in its environment, and (auth=True) the
    auth section of auth_section(); `overrides` deep-merges over that."""
    over = {"auth": auth_section()} if auth else {}
    if overrides:
        over = helpers.deep_merge(over, overrides)
    e = dict(AUTH_ENV)
    if env:
        e.update(env)
    return sluice_factory(overrides=over, upstream=upstream, env=e, name=name)


def redis_url(r):
    return "redis://127.0.0.1:%d/0" % r.port


def redis_section(r):
    """The redis: section for a test that is not about redis.timeout: the
    default 50 ms deadline is for a production Redis, and a real one on two
    loaded cores (or beside an ASan build) can miss it on a first call
    (connect, SELECT, script load), which on_store_error then decides."""
    return {"url": redis_url(r), "timeout": "%dms" % bound(2000)}


# ---- JWTs ------------------------------------------------------------------------


def b64url(b):
    if isinstance(b, str):
        b = b.encode()
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def signing_key_for(jti, secret=SIGNING_SECRET):
    """hex(HMAC-SHA256(signing secret, jti)): the key a token's requests
    are signed with (docs/auth.md)."""
    return hmac.new(secret.encode(), jti.encode(), hashlib.sha256).hexdigest()


class Token:
    def __init__(self, access_token, signing_key, jti=None, sub=None, claims=None):
        self.access_token = access_token
        self.signing_key = signing_key
        self.claims = claims if claims is not None else decode_claims(access_token)
        self.jti = jti if jti is not None else self.claims.get("jti")
        self.sub = sub if sub is not None else self.claims.get("sub")

    @property
    def bearer(self):
        return "Bearer " + self.access_token


def decode_claims(token):
    try:
        return json.loads(b64url_decode(token.split(".")[1]))
    except (IndexError, ValueError):
        return {}


def decode_header(token):
    return json.loads(b64url_decode(token.split(".")[0]))


def jwt_encode(header, claims, secret=TOKEN_SECRET, raw_header=None, raw_claims=None):
    """A compact HS256-signed JWT (the MAC is over whatever header says:
    the tests choose both). raw_* give the JSON text verbatim."""
    h = b64url(raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")))
    c = b64url(raw_claims if raw_claims is not None else json.dumps(claims, separators=(",", ":")))
    key = secret if isinstance(secret, bytes) else secret.encode()
    mac = hmac.new(key, ("%s.%s" % (h, c)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (h, c, b64url(mac))


def mint(sub="alice", ttl=900, iat=None, jti=None, kid="k1", alg="HS256", secret=TOKEN_SECRET,
         drop=(), extra=None, header_extra=None):
    """A token as a login service would mint it (HS256, key k1), claims
    overridable: drop names claims to leave out, extra adds or replaces."""
    now = int(time.time())
    iat = now if iat is None else iat
    jti = jti or secrets.token_urlsafe(16)
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "jti": jti, "iat": iat, "exp": iat + ttl}
    if extra:
        claims.update(extra)
    for k in drop:
        claims.pop(k, None)
    header = {"alg": alg, "typ": "JWT", "kid": kid}
    if header_extra:
        header.update(header_extra)
    for k in [k for k, v in header.items() if v is None]:
        del header[k]
    tok = jwt_encode(header, claims, secret)
    return Token(tok, signing_key_for(jti), jti=jti, sub=sub, claims=claims)


# ---- request signatures -------------------------------------------------------------


def new_nonce():
    """24 characters of [A-Za-z0-9_-]."""
    return secrets.token_urlsafe(18)


def canonical(method, path, ts, nonce, body):
    return "\n".join([method, path, str(ts), nonce, hashlib.sha256(body).hexdigest()])


def sign(key, method, path, body=b"", ts=None, nonce=None):
    """The three X-Sluice-* headers, computed here (docs/auth.md): the HMAC
    key is the signing key as text."""
    if isinstance(body, str):
        body = body.encode()
    ts = int(time.time()) if ts is None else ts
    nonce = nonce or new_nonce()
    sig = hmac.new(key.encode(), canonical(method, path, ts, nonce, body).encode(), hashlib.sha256)
    return {
        "X-Sluice-Timestamp": str(ts),
        "X-Sluice-Nonce": nonce,
        "X-Sluice-Signature": sig.hexdigest(),
    }


def cli_sign(sluice_bin, key, method, path, body, tmpdir, ts=None, nonce=None):
    """The headers `sluice sign` prints for the same inputs."""
    f = os.path.join(str(tmpdir), "sign-body-%s.bin" % secrets.token_hex(4))
    with open(f, "wb") as fh:
        fh.write(body if isinstance(body, bytes) else body.encode())
    argv = [sluice_bin, "sign", "--key", key, "--method", method, "--path", path, "--body", f]
    if ts is not None:
        argv += ["--timestamp", str(ts)]
    if nonce is not None:
        argv += ["--nonce", nonce]
    p = subprocess.run(argv, capture_output=True, timeout=bound(10))
    assert p.returncode == 0, "sluice sign failed (%d): %s" % (p.returncode, p.stderr.decode())
    out = {}
    for ln in p.stdout.decode().splitlines():
        k, sep, v = ln.partition(":")
        assert sep, "sluice sign printed %r" % ln
        out[k.strip()] = v.strip()
    return out


def cli_token(sluice, sub, ttl=None, as_json=False):
    """Runs `sluice token` against a Sluice's conf and environment:
    (CompletedProcess, parsed output dict)."""
    argv = [sluice.bin, "token", "--sub", sub, "-c", str(sluice.conf_path)]
    if ttl:
        argv += ["--ttl", ttl]
    if as_json:
        argv.append("--json")
    p = subprocess.run(argv, capture_output=True, timeout=bound(10), env=sluice.env)
    out = {}
    if p.returncode == 0:
        text = p.stdout.decode()
        if as_json:
            out = json.loads(text)
        else:
            for ln in text.splitlines():
                k, sep, v = ln.partition(":")
                if sep:
                    out[k.strip()] = v.strip()
    return p, out


# ---- talking to sluice ----------------------------------------------------------------


def body_bytes(body):
    if body is None:
        return b""
    if isinstance(body, (dict, list)):
        return json.dumps(body).encode()
    if isinstance(body, str):
        return body.encode()
    return body


def fetch_token(sluice, sub="alice", client_id=CLIENT_ID, secret=CLIENT_SECRET, ttl=None, headers=None):
    """POST /v1/auth/token: (response, Token or None)."""
    req = {"client_id": client_id, "client_secret": secret, "sub": sub}
    if ttl is not None:
        req["ttl"] = ttl
    r = sluice.request("POST", "/v1/auth/token", req, headers)
    tok = None
    if r.status == 200:
        j = r.json()
        tok = Token(j["access_token"], j["signing_key"])
    return r, tok


def signed_headers(token, method, path, body, ts=None, nonce=None, extra=None):
    h = {"Authorization": token.bearer}
    h.update(sign(token.signing_key, method, path, body_bytes(body), ts, nonce))
    if extra:
        h.update(extra)
    return h


def signed(target, token, body=None, path=CHAT_PATH, method="POST", ts=None, nonce=None, extra=None,
           timeout=10):
    """One signed request to `target` (a Sluice) on a fresh connection."""
    if body is None and method == "GET":
        b = None
    else:
        b = body_bytes(body if body is not None else helpers.chat_body())
    hdrs = signed_headers(token, method, path, b, ts, nonce, extra)
    return target.request(method, path, b, hdrs, timeout=timeout)


def request_bytes(host, port, method, path, body, headers):
    """The exact bytes of one HTTP/1.1 request (Content-Length framing)."""
    b = body_bytes(body)
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s:%d" % (host, port)]
    for k, v in headers.items():
        lines.append("%s: %s" % (k, v))
    if b or method == "POST":
        lines.append("Content-Type: application/json")
        lines.append("Content-Length: %d" % len(b))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + b


def burst(targets, timeout=20.0):
    """Sends requests so that they arrive together: every connection is
    opened and gets all of its request but the last byte, then the last
    bytes go out back to back. targets: [(host, port, request bytes)].
    Returns the responses in order (helpers.Response; status 0 for a
    connection that ended without one)."""
    clients = []
    try:
        for host, port, data in targets:
            c = helpers.HTTPClient(host, port, timeout=timeout)
            c.send(data[:-1])
            clients.append((c, data[-1:]))
        for c, last in clients:
            c.send(last)
        out = []
        for c, _ in clients:
            try:
                out.append(c.read_response())
            except (helpers.ProtocolError, OSError) as e:
                r = helpers.Response(0, repr(e), "1.1", [])
                out.append(r)
        return out
    finally:
        for c, _ in clients:
            c.close()


def statuses(responses):
    out = {}
    for r in responses:
        out[r.status] = out.get(r.status, 0) + 1
    return out


# ---- assertions --------------------------------------------------------------------


def assert_auth_error(r, reason, status=401):
    """An auth refusal: status, WWW-Authenticate naming the reason (RFC
    6750), an OpenAI-style body with code == reason."""
    etype = "server_error" if status == 503 else "authentication_error"
    e = helpers.assert_error(r, status, reason, etype)
    if status == 401:
        wa = r.header_all("WWW-Authenticate")
        assert len(wa) == 1, "WWW-Authenticate: %r" % wa
        assert wa[0].startswith('Bearer realm="sluice"'), wa[0]
        if reason != "token_missing":
            kind = "invalid_request" if reason.startswith("signature_") else "invalid_token"
            assert 'error="%s"' % kind in wa[0], wa[0]
            assert 'error_description="%s"' % reason in wa[0], wa[0]
    return e


def assert_upstream_untouched(mock):
    reqs = mock.requests()
    assert reqs == [], "the upstream received %d request(s): %r" % (len(reqs), [x["path"] for x in reqs])
    assert mock.bytes_received() == 0, "the upstream received %d bytes" % mock.bytes_received()


def metric(sluice, name, **labels):
    return sluice.metrics().value(name, **labels)


# ---- a redis-server that can die and come back ---------------------------------------


def redis_kill(r):
    """SIGKILL: connections drop at once, nothing is saved."""
    r.p.kill()
    r.p.close_logs()


def redis_restart(r):
    """Starts redis-server again on the same port (empty: no persistence)."""
    assert not r.p.alive()
    r.p = helpers.Proc("redis", r.p.argv, r.dir)
    wait_until(lambda: r._ping(), bound(10), what="redis-server PING after restart")


def redis_clients(r):
    """Clients connected to redis-server other than the asker."""
    listing = r.cmd("CLIENT", "LIST")
    if isinstance(listing, bytes):
        listing = listing.decode()
    return len([l for l in listing.splitlines() if l.strip()]) - 1


def redis_settled_clients(s, r):
    """The number of Redis clients sluice s holds, once every one of them is
    connected: sluice's own gauge (sluice_redis_connected, moved when a
    connection comes up or goes) equals the count Redis sees (s being its
    only client). A count taken while a worker's client was still in its
    handshake would make a later redis_wait_clients wait for too few."""
    def settled():
        c = (metric(s, "sluice_redis_connected") or 0)
        return c if c >= 1 and c == redis_clients(r) else 0

    return int(wait_until(settled, bound(5), what="every sluice Redis client connected"))


def redis_wait_clients(r, n, what="every sluice worker reconnected to Redis", s=None):
    """Waits until n clients are connected again: each sluice worker holds
    its own connection and reconnects on its own backoff (docs/fallback.md),
    so one served request does not mean the next worker is back. With s,
    also until sluice's own gauge says all n are up (its side of the
    handshake done, not only Redis's)."""
    wait_until(lambda: redis_clients(r) >= n and (s is None or (metric(s, "sluice_redis_connected") or 0) == n),
               bound(10), what=what)


# ---- rate-limit setups ------------------------------------------------------------------


def rl_start(sluice_factory, upstream, ratelimit, redis=None, name=None, extra=None):
    """sluice with tokens on (signatures optional: the limit tests send
    bearer tokens only) and this `ratelimit:` section; redis: a RedisServer
    (or a URL) shared by the instances that name it."""
    over = {"auth": {"signing": {"required": False}}, "ratelimit": ratelimit}
    if redis is not None:
        over["redis"] = {"url": redis} if isinstance(redis, str) else redis_section(redis)
        # auth's own Redis checks must not decide these tests (test_auth_redis does that)
        over["auth"]["on_store_error"] = {"nonces": "allow", "revocations": "allow"}
    if extra:
        over = helpers.deep_merge(over, extra)
    return start(sluice_factory, upstream, over, name=name)


def as_user(s, tok, body=None, headers=None, timeout=10):
    """A request carrying tok's bearer token (no signature)."""
    h = {"Authorization": tok.bearer}
    if headers:
        h.update(headers)
    return s.request("POST", CHAT_PATH, body if body is not None else helpers.chat_body(), h,
                     timeout=timeout)


def user_burst(instances, tok, n, body=None):
    """n copies of one bearer-token request arriving at once, spread
    round-robin over the instances."""
    b = body_bytes(body if body is not None else helpers.chat_body("burst"))
    h = {"Authorization": tok.bearer}
    return burst([(s.host, s.port, request_bytes(s.host, s.port, "POST", CHAT_PATH, b, h))
                  for s in (instances[i % len(instances)] for i in range(n))])


def rl_headers(r):
    """(limit, remaining, reset) from X-RateLimit-* as ints (None if absent)."""
    def num(name):
        v = r.header(name)
        return int(v) if v is not None else None
    return num("X-RateLimit-Limit"), num("X-RateLimit-Remaining"), num("X-RateLimit-Reset")


# ---- filter setups ------------------------------------------------------------------------


def word_file(path, words):
    """Writes a word list (one a line, with a comment line) atomically."""
    path = str(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("# test words\n" + "".join(w + "\n" for w in words))
    os.replace(tmp, path)
    return path


def chunk_event(text=None, finish=None, index=0, raw_delta=None):
    """One chat.completion.chunk SSE event (what the mock's `raw` sends)."""
    delta = raw_delta if raw_delta is not None else ({} if text is None else {"content": text})
    c = {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
    return "data: " + json.dumps(c) + "\n\n"


def raw_stream(*texts, finish="stop", done=True):
    """The mock's `raw` list: one content event per text, a finish chunk,
    then [DONE]."""
    evs = [chunk_event(t) for t in texts]
    if finish:
        evs.append(chunk_event(None, finish))
    if done:
        evs.append("data: [DONE]\n\n")
    return evs


def event_text(ev):
    """The delta content of one received event ('' for none)."""
    if ev.data is None or ev.is_done:
        return ""
    out = ""
    for ch in ev.json().get("choices", []):
        out += (ch.get("delta") or {}).get("content") or ""
    return out


def finish_reasons(events):
    out = []
    for e in events:
        if e.data is None or e.is_done:
            continue
        for ch in e.json().get("choices", []):
            if ch.get("finish_reason"):
                out.append(ch["finish_reason"])
    return out
