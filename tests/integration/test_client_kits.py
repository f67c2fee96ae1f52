"""
test_client_kits.py — the client kits in clients/ (issue 12, item 8): every
attempt of a request, SDK retries included, is signed afresh.

sluice uses a request's nonce up even when it answers 429 (a replay must not
pass later), so an SDK that retries with the first attempt's headers is
refused as signature_replay. Here, against the real binary with signatures
required:

- TypeScript: the kit (clients/typescript, compiled with the pinned tsc)
  under the official `openai` package and the Vercel AI SDK: chat and
  stream pass; a 429 (the upstream's, or sluice's own concurrency limit)
  followed by the SDK's own retry succeeds, each attempt with its own nonce,
  counted at the client, the mock and sluice's metrics; and the same retry
  with headers signed once (no kit) is refused as signature_replay — which
  is what shows these tests can fail.
- Shared vectors: clients/vectors.json is what clients/gen_vectors.py makes
  with this `sluice sign`; the TypeScript/ArkTS core and the Kotlin signer
  (compiled with Debian's kotlinc and run) reproduce every signature.
- ArkTS: SluiceHttpClient compiled with tsc over a stand-in `http` (Node's
  fetch) and run against the real binary: a 429, then a re-signed retry.
- Kotlin: the OkHttp 4 interceptor respelled for Debian's OkHttp 3, compiled
  and run as a network interceptor in a real OkHttp client against the real
  binary: 429s, each retry re-signed.
- Swift (no compiler on Debian 12) and the transport layers that need a
  platform SDK (OkHttp, @ohos.net.http): their source is checked for the
  canonical string's order and separator, the key used as text, lowercase
  hex, the header names, and signing inside the per-attempt path; each
  checker is also run on a broken copy, which it must reject.
"""

import base64
import hashlib
import hmac
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time

import pytest

import helpers
import policy_helpers as ph
from helpers import bound, wait_until

ROOT = helpers.ROOT
CLIENTS = ROOT / "clients"
NODE_DIR = ROOT / "tests" / "integration" / "node"
VECTORS = CLIENTS / "vectors.json"
P = ph.CHAT_PATH
NODE_MODULES = ("openai", "ai", "@ai-sdk/openai", "typescript")


def load_vectors():
    with open(VECTORS, encoding="utf-8") as f:
        return json.load(f)


# ---- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kit_node(node):
    if not all((NODE_DIR / "node_modules" / m).is_dir() for m in NODE_MODULES):
        npm = shutil.which("npm")
        p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci in %s failed:\n%s" % (NODE_DIR, (p.stdout + p.stderr).decode()[-3000:]))
    return node


@pytest.fixture(scope="session")
def kit_dist(kit_node, tmp_path_factory):
    """clients/typescript compiled (strict) by the pinned tsc: the compile is
    also the kit's type check."""
    out = tmp_path_factory.mktemp("kit-ts")
    tsc = NODE_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    p = subprocess.run([kit_node, str(tsc), "-p", str(CLIENTS / "typescript"), "--outDir", str(out)],
                       capture_output=True, timeout=bound(120))
    assert p.returncode == 0, "tsc failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:]
    (out / "package.json").write_text('{"type": "module"}\n')
    return out


def run_kit(node, dist, base, mode, arg=None, env=None, timeout=60):
    argv = [node, str(NODE_DIR / "kit_client.mjs"), str(dist), base, mode] + ([arg] if arg else [])
    p = subprocess.run(argv, capture_output=True, timeout=bound(timeout), cwd=NODE_DIR,
                       env=kit_env(env))
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def kit_env(extra=None):
    e = dict(os.environ)
    e.update({"KIT_CLIENT_ID": ph.CLIENT_ID, "KIT_CLIENT_SECRET": ph.CLIENT_SECRET, "KIT_SUB": "alice",
              "KIT_MAX_RETRIES": "2"})
    e.update(extra or {})
    return e


def base_url(s):
    return "http://%s:%d" % (s.host, s.port)


def rejected(s, reason):
    return ph.metric(s, "sluice_auth_rejected_total", reason=reason)


def chat_attempts(out):
    return [a for a in out["attempts"] if a["path"] == P]


def assert_each_attempt_signed_afresh(attempts):
    nonces = [a["nonce"] for a in attempts]
    assert all(n and re.fullmatch(r"[0-9a-f]{32}", n) for n in nonces), nonces
    assert len(set(nonces)) == len(nonces), "a nonce was sent twice: %r" % nonces


UPSTREAM_429 = {"status": 429, "retry_after": "0",
                "body": {"error": {"message": "slow down", "type": "rate_limit_error",
                                   "code": "rate_limit_exceeded"}}}


# ---- shared vectors --------------------------------------------------------------------


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_vectors", CLIENTS / "gen_vectors.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_vectors_file_is_what_sluice_sign_makes(sluice_bin):
    gen = _gen_module()
    with open(VECTORS, encoding="utf-8") as f:
        committed = f.read()
    assert gen.render(gen.build(sluice_bin)) == committed, \
        "clients/vectors.json is stale: run clients/gen_vectors.py"
    doc = load_vectors()
    assert len(doc["vectors"]) >= 7
    for v in doc["vectors"]:
        body = base64.b64decode(v["body_b64"])
        assert v["body_sha256"] == hashlib.sha256(body).hexdigest()
        assert v["canonical"] == "\n".join(
            [v["method"], v["path"], v["timestamp"], v["nonce"], v["body_sha256"]])
        mac = hmac.new(v["key"].encode(), v["canonical"].encode(), hashlib.sha256).hexdigest()
        assert mac == v["signature"], v["name"]
    # the key is text: the same hex in upper case signs differently
    by = {v["name"]: v for v in doc["vectors"]}
    assert by["key_is_text"]["signature"] != by["chat_post"]["signature"]


def test_typescript_core_reproduces_the_vectors(kit_node, kit_dist):
    doc = load_vectors()
    out = run_kit(kit_node, kit_dist, "http://unused", "vectors", str(VECTORS))
    got = {r["name"]: r for r in out["results"]}
    assert len(got) == len(doc["vectors"])
    for v in doc["vectors"]:
        assert got[v["name"]]["canonical"] == v["canonical"], v["name"]
        assert got[v["name"]]["signature"] == v["signature"], v["name"]
    assert out["headers"] == [doc["headers"][k] for k in ("timestamp", "nonce", "signature")]
    assert re.fullmatch(r"[0-9a-f]{32}", out["fresh"]["nonce"])
    assert abs(int(out["fresh"]["timestamp"]) - time.time()) < 30
    paths = dict(out["paths"])
    assert paths["http://h:1/v1/chat/completions"] == "/v1/chat/completions"
    assert paths["http://h/v1/x?"] == "/v1/x?"  # an empty query still sends its "?"
    assert paths["http://u:p@h/v1/x?a=1&b=%20#frag?"] == "/v1/x?a=1&b=%20"
    assert paths["http://h/v1/a b?q=é"] == "/v1/a%20b?q=%C3%A9"


def test_typescript_fetch_signs_every_body_shape_and_caches_tokens(kit_node, kit_dist):
    """signingFetch against a recording server: for strings, bytes, views,
    Blob, FormData, URLSearchParams, streams, Request objects and GETs, the
    bytes that arrived are the bytes signed (checked here with Python's
    HMAC), with the Content-Type the body implies; one mint serves parallel
    calls, a 401 invalid_token and the approach of expiry mint again."""
    key = load_vectors()["vectors"][0]["key"]
    out = run_kit(kit_node, kit_dist, "http://unused", "shapes", key)
    assert out["names"] == ["string", "bytes", "dataview", "blob", "form", "params", "stream", "request", "get"]
    seen = out["seen"]
    assert len(seen) == 9 + 5 + 1 + 1 + 1 + 1
    nonces = set()
    for r in seen:
        h = r["headers"]
        body = base64.b64decode(r["body_b64"])
        canon = "\n".join([r["method"], r["target"], h["x-sluice-timestamp"], h["x-sluice-nonce"],
                           hashlib.sha256(body).hexdigest()])
        want = hmac.new(key.encode(), canon.encode(), hashlib.sha256).hexdigest()
        assert h["x-sluice-signature"] == want, (r["method"], r["target"])
        assert abs(int(h["x-sluice-timestamp"]) - time.time()) < 30
        nonces.add(h["x-sluice-nonce"])
    assert len(nonces) == len(seen)
    by = dict(zip(out["names"], seen))
    assert base64.b64decode(by["string"]["body_b64"]) == '{"a":"é"}'.encode()
    assert by["bytes"]["target"] == "/v1/embeddings?x=1&y=%20"
    assert base64.b64decode(by["bytes"]["body_b64"]) == bytes([0, 1, 2, 255])
    assert base64.b64decode(by["dataview"]["body_b64"]) == bytes([8, 7, 6])
    assert by["blob"]["headers"]["content-type"] == "text/plain"
    ctype = by["form"]["headers"]["content-type"]
    boundary = ctype.split("boundary=")[1]
    form = base64.b64decode(by["form"]["body_b64"])
    assert ctype.startswith("multipart/form-data; boundary=") and boundary.encode() in form
    assert b"line one\nline two\n" in form and b'filename="data.jsonl"' in form
    assert by["params"]["headers"]["content-type"].startswith("application/x-www-form-urlencoded")
    assert base64.b64decode(by["params"]["body_b64"]) == b"a=1&b=x+y"
    assert base64.b64decode(by["stream"]["body_b64"]) == b'{"streamed":true}'
    assert by["request"]["target"] == "/v1/chat/completions?q=1"
    assert base64.b64decode(by["request"]["body_b64"]) == b'{"r":1}'
    assert by["get"]["method"] == "GET" and by["get"]["body_b64"] == ""
    # mints: after the shapes, after 5 parallel calls, after a 401, 30 s on, 50 s on
    assert out["mints"] == [1, 1, 2, 2, 3], out["mints"]
    assert [r["headers"]["authorization"] for r in seen[-3:]] == ["Bearer tok-2", "Bearer tok-2", "Bearer tok-3"]


# ---- TypeScript under the SDKs, against the real binary ---------------------------------


def test_openai_sdk_chat_and_stream_signed(sluice_factory, mock, kit_node, kit_dist):
    s = ph.start(sluice_factory, mock)
    # signing really is required here: a token alone is refused
    ph.assert_auth_error(ph.as_user(s, ph.mint("alice")), "signature_missing")
    out = run_kit(kit_node, kit_dist, base_url(s), "openai-chat",
                  env={"KIT_PROMPT": "kit chat"})
    assert out["error"] is None, out
    assert out["text"] == "echo: kit chat"
    assert [a["status"] for a in chat_attempts(out)] == [200]
    out = run_kit(kit_node, kit_dist, base_url(s), "openai-stream",
                  env={"KIT_PROMPT": "kit stream"})
    assert out["error"] is None, out
    assert out["text"] == "echo: kit stream" and out["chunks"] >= 4, out
    assert [a["status"] for a in chat_attempts(out)] == [200]
    reqs = mock.requests(path=P)
    assert [r["json"]["messages"][-1]["content"] for r in reqs] == ["kit chat", "kit stream"]
    assert reqs[1]["json"]["stream"] is True
    for r in ("signature_mismatch", "signature_replay", "signature_timestamp", "signature_nonce"):
        assert rejected(s, r) == 0, r


@pytest.mark.parametrize("mode", ["openai-chat", "openai-stream", "ai-chat", "ai-stream"])
def test_sdk_retry_after_upstream_429_is_signed_again(sluice_factory, mock, kit_node, kit_dist, mode):
    s = ph.start(sluice_factory, mock)
    mock.script(UPSTREAM_429, "normal")
    out = run_kit(kit_node, kit_dist, base_url(s), mode, env={"KIT_PROMPT": "again"})
    assert out["error"] is None, out
    assert out["text"] == "echo: again"
    att = chat_attempts(out)
    assert [a["status"] for a in att] == [429, 200], att
    assert_each_attempt_signed_afresh(att)
    if mode.startswith("openai"):
        assert [a["retry_count"] for a in att] == ["0", "1"]  # the SDK's own retry
    reqs = mock.requests(path=P)
    assert [r["status"] for r in reqs] == [429, 200], [r["status"] for r in reqs]
    assert rejected(s, "signature_replay") == 0
    assert ph.metric(s, "sluice_requests_total", code="4xx") == 1
    assert ph.metric(s, "sluice_requests_total", code="2xx") >= 2  # the token and the retry


def test_sdk_retry_after_sluice_own_429_is_signed_again(sluice_factory, mock, kit_node, kit_dist):
    """sluice's own 429 (alice may have one request in flight): the nonce
    of the refused attempt is used up, and the SDK's retry passes because
    the kit signed it again."""
    s = ph.start(sluice_factory, mock, {"ratelimit": {"per_user": {"concurrent": 1}}})
    tok = ph.mint("alice")
    mock.script({"gate": True}, "normal")
    body = ph.body_bytes(helpers.chat_body("held", stream=True))
    held = helpers.HTTPClient(s.host, s.port, timeout=bound(20))
    try:
        held.send(ph.request_bytes(s.host, s.port, "POST", P, body,
                                   ph.signed_headers(tok, "POST", P, body)))
        mock.wait_requests(1, timeout=bound(10), path=P)
        p = subprocess.Popen(
            [kit_node, str(NODE_DIR / "kit_client.mjs"), str(kit_dist), base_url(s), "openai-chat"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=NODE_DIR,
            env=kit_env({"KIT_PROMPT": "after the limit", "KIT_MAX_RETRIES": "5"}))
        try:
            wait_until(lambda: ph.metric(s, "sluice_ratelimited_total", limit="concurrent") >= 1,
                       bound(20), what="the kit's first attempt refused by the concurrency limit")
            mock.release(n=100)
            r = held.read_response()
            assert r.status == 200
            stdout, stderr = p.communicate(timeout=bound(60))
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, stderr.decode()[-3000:]
    finally:
        held.close()
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    assert out["error"] is None, out
    assert out["text"] == "echo: after the limit"
    att = chat_attempts(out)
    statuses = [a["status"] for a in att]
    assert len(att) >= 2 and statuses[-1] == 200 and set(statuses[:-1]) == {429}, statuses
    assert_each_attempt_signed_afresh(att)
    refused = ph.metric(s, "sluice_ratelimited_total", limit="concurrent")
    assert refused == len(att) - 1, (refused, statuses)
    assert rejected(s, "signature_replay") == 0
    assert [r["json"]["messages"][-1]["content"] for r in mock.requests(path=P)] == \
        ["held", "after the limit"]


def test_without_the_kit_the_sdk_retry_is_a_replay(sluice_factory, mock, kit_node, kit_dist):
    """The control: headers signed once and handed to the SDK. The first
    attempt passes auth (the upstream answers 429); the SDK's retry carries
    the same nonce and sluice refuses it."""
    s = ph.start(sluice_factory, mock)
    mock.script(UPSTREAM_429, "normal")
    out = run_kit(kit_node, kit_dist, base_url(s), "naive-chat")
    att = chat_attempts(out)
    assert [a["status"] for a in att] == [429, 401], att
    assert att[0]["nonce"] == att[1]["nonce"]
    assert out["error"]["status"] == 401 and out["error"]["code"] == "signature_replay", out
    assert [r["status"] for r in mock.requests(path=P)] == [429]  # the retry never got upstream
    assert rejected(s, "signature_replay") == 1


# ---- Kotlin: the signer compiled with Debian's kotlinc and run ----------------------------

KOTLIN = CLIENTS / "kotlin" / "src"
KT_SIGNER = KOTLIN / "main" / "kotlin" / "dev" / "sluice" / "client" / "SluiceSigner.kt"
KT_INTERCEPTOR = KOTLIN / "main" / "kotlin" / "dev" / "sluice" / "client" / "SluiceSigningInterceptor.kt"
KT_HARNESS = KOTLIN / "test" / "kotlin" / "dev" / "sluice" / "client" / "VectorCheck.kt"


@pytest.mark.timeout(240)
def test_kotlin_signer_reproduces_the_vectors(tmp_path):
    kotlinc, java = shutil.which("kotlinc"), shutil.which("java")
    if not kotlinc or not java:
        pytest.skip("kotlinc/java not installed (Debian package kotlin; scripts/deps.sh installs it)")
    jar = tmp_path / "vectors.jar"
    p = subprocess.run([kotlinc, str(KT_SIGNER), str(KT_HARNESS), "-include-runtime", "-d", str(jar)],
                       capture_output=True, timeout=bound(200))
    assert p.returncode == 0 and jar.is_file(), "kotlinc failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:]
    doc = load_vectors()
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    lines = [" ".join([b64(v["key"]), b64(v["method"]), b64(v["path"]), b64(v["timestamp"]),
                       b64(v["nonce"]), v["body_b64"]]) for v in doc["vectors"]]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n")
    p = subprocess.run([java, "-cp", str(jar), "dev.sluice.client.VectorCheckKt", str(inp)],
                       capture_output=True, timeout=bound(60))
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    out = p.stdout.decode().splitlines()
    assert len(out) == len(doc["vectors"]) + 1, out
    for v, ln in zip(doc["vectors"], out):
        canon_b64, sig = ln.split(" ")
        assert base64.b64decode(canon_b64).decode() == v["canonical"], v["name"]
        assert sig == v["signature"], v["name"]
    fresh = out[-1].split(" ")
    assert fresh[0] == "fresh" and abs(int(fresh[1]) - time.time()) < 30
    assert re.fullmatch(r"[0-9a-f]{32}", fresh[2]), fresh


# ---- source checks for what cannot run here -------------------------------------------------
#
# Each checker returns a list of problems; each is also run on a broken copy
# of its file and must find the break (a checker that passes anything proves
# nothing).

HEADERS = ("X-Sluice-Timestamp", "X-Sluice-Nonce", "X-Sluice-Signature")


def _func_body(src, start_pat):
    """The text of the brace block that follows the first match of start_pat."""
    m = re.search(start_pat, src)
    if not m:
        return None
    i = src.index("{", m.end() - 1 if src[m.end() - 1] == "{" else m.end())
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return src[i:j + 1]
    return None


def swift_signer_problems(src):
    probs = []
    m = re.search(r"func canonical\(method: String, pathWithQuery: String, timestamp: String, "
                  r"nonce: String, bodySha256Hex: String\) -> String \{\s*return \[([^\]]*)\]"
                  r"\.joined\(separator: \"([^\"]*)\"\)", src)
    if not m:
        probs.append("canonical(): not the five parameters joined by a separator")
    else:
        if [x.strip() for x in m.group(1).split(",")] != \
                ["method", "pathWithQuery", "timestamp", "nonce", "bodySha256Hex"]:
            probs.append("canonical(): field order %r" % m.group(1))
        if m.group(2) != "\\n":
            probs.append("canonical(): separator %r is not \\n" % m.group(2))
    if 'hexDigits = Array("0123456789abcdef".utf8)' not in src:
        probs.append("hex is not lowercase")
    if "hex(SHA256.hash(data: body))" not in src:
        probs.append("the body hash is not hex(SHA-256(body))")
    if "SymmetricKey(data: Data(signingKey.utf8))" not in src:
        probs.append("the HMAC key is not the signing key's UTF-8 text")
    if "HMAC<SHA256>.authenticationCode(for: Data(c.utf8), using: key)" not in src:
        probs.append("the HMAC is not HMAC-SHA256 over the canonical string's UTF-8")
    if not re.search(r"hex\(\(0\.\.<16\)\.map \{ _ in UInt8\.random", src):
        probs.append("the nonce is not 16 random bytes in hex")
    for name, h in zip(("headerTimestamp", "headerNonce", "headerSignature"), HEADERS):
        if 'public static let %s = "%s"' % (name, h) not in src:
            probs.append("header %s is not %s" % (name, h))
    return probs


def swift_session_problems(src):
    probs = []
    for fn in ("public func data(for request: URLRequest)", "public func bytes(for request: URLRequest)"):
        body = _func_body(src, re.escape(fn))
        loop = body and _func_body(body, r"while true")
        if not loop or "let signed = try SluiceSigner.signed(request, credentials: creds)" not in loop \
                or "let creds = try await tokens.credentials()" not in loop:
            probs.append("%s: does not sign inside its retry loop" % fn)
        elif "retryDelay(" not in loop:
            probs.append("%s: no retry in the loop" % fn)
    signed = _func_body(src, r"public static func signed\(")
    if not signed or "httpBodyStream" not in signed:
        probs.append("signed(): a streamed body is not refused")
    for h in ("headerTimestamp", "headerNonce", "headerSignature"):
        if not signed or "forHTTPHeaderField: %s)" % h not in signed:
            probs.append("signed(): does not set %s" % h)
    return probs


def kotlin_interceptor_problems(src):
    probs = []
    body = _func_body(src, r"override fun intercept\(chain: Interceptor\.Chain\): Response \{")
    if not body or "sign(request, creds)" not in body or "chain.proceed(signed)" not in body:
        probs.append("intercept(): does not sign the request it proceeds with")
    sign = _func_body(src, r"private fun sign\(request: Request, creds: SluiceCredentials\): Request \{")
    if not sign or "SluiceSigner.sign(creds.signingKey, request.method, pathWithQuery, bytes, clock())" not in sign:
        probs.append("sign(): not a fresh SluiceSigner.sign per attempt")
    if not sign or 'url.encodedPath + (url.encodedQuery?.let { "?$it" } ?: "")' not in sign:
        probs.append("sign(): the path is not OkHttp's encoded path + query")
    if not sign or "bytes.toRequestBody(body.contentType())" not in sign:
        probs.append("sign(): the bytes sent are not the bytes hashed")
    for h in ("HEADER_TIMESTAMP", "HEADER_NONCE", "HEADER_SIGNATURE"):
        if not sign or ".header(SluiceSigner.%s, sig." % h not in sign:
            probs.append("sign(): does not set %s" % h)
    return probs


def arkts_http_problems(src):
    probs = []
    if "from '@kit.NetworkKit'" not in src:
        probs.append("does not use @ohos.net.http (NetworkKit)")
    req = _func_body(src, r"async request\(method: string, pathWithQuery: string, body: string\)")
    loop = req and _func_body(req, r"for \(let attempt = 0; ; attempt\+\+\)")
    if not loop or "await this.signedHeaders(method, pathWithQuery, bytes)" not in loop:
        probs.append("request(): does not sign inside its retry loop")
    if not req or "const bytes = this.crypto.utf8(body);" not in req or "extraData: method === 'GET' ? undefined : payload" not in req:
        probs.append("request(): the bytes sent are not the bytes hashed")
    sh = _func_body(src, r"async signedHeaders\(")
    for h in ("SLUICE_HEADER_TIMESTAMP", "SLUICE_HEADER_NONCE", "SLUICE_HEADER_SIGNATURE"):
        if not sh or "h[%s] = sig." % h not in sh:
            probs.append("signedHeaders(): does not set %s" % h)
    if not sh or "sluiceSign(this.crypto, tok.signingKey" not in sh:
        probs.append("signedHeaders(): not a fresh sluiceSign")
    return probs


def _read(p):
    return p.read_text(encoding="utf-8")


SWIFT = CLIENTS / "swift" / "Sources" / "SluiceKit"

CHECKS = [
    # (file, checker, breakages: (old, new) replacements a checker must catch)
    (SWIFT / "SluiceSigner.swift", swift_signer_problems, [
        ("[method, pathWithQuery, timestamp, nonce, bodySha256Hex]",
         "[method, pathWithQuery, nonce, timestamp, bodySha256Hex]"),
        ('.joined(separator: "\\n")', '.joined(separator: "\\r\\n")'),
        ("SymmetricKey(data: Data(signingKey.utf8))", "SymmetricKey(data: hexDecode(signingKey))"),
        ('"0123456789abcdef"', '"0123456789ABCDEF"'),
        ('"X-Sluice-Nonce"', '"X-Sluice-Nonce-Id"'),
    ]),
    (SWIFT / "SluiceURLSession.swift", swift_session_problems, [
        ("        var attempt = 0\n        while true {\n            let creds = try await tokens.credentials()\n"
         "            let signed = try SluiceSigner.signed(request, credentials: creds) // fresh per attempt\n"
         "            let (data,",
         "        var attempt = 0\n        let creds = try await tokens.credentials()\n"
         "        let signed = try SluiceSigner.signed(request, credentials: creds)\n"
         "        while true {\n            let (data,"),
    ]),
    (KT_INTERCEPTOR, kotlin_interceptor_problems, [
        ("chain.proceed(signed)", "chain.proceed(request)"),
        ('url.encodedPath + (url.encodedQuery?.let { "?$it" } ?: "")', "url.encodedPath"),
    ]),
    (CLIENTS / "arkts" / "SluiceHttp.ets", arkts_http_problems, [
        ("      const header = await this.signedHeaders(method, pathWithQuery, bytes); // fresh each attempt\n",
         ""),
    ]),
]


@pytest.mark.parametrize("path,checker,breaks", CHECKS, ids=[c[0].name for c in CHECKS])
def test_source_of_kits_that_cannot_run_here(path, checker, breaks):
    src = _read(path)
    assert checker(src) == [], "%s: %s" % (path.name, checker(src))
    for old, new in breaks:
        assert old in src, "%s: the breakage %r no longer applies: update the test" % (path.name, old)
        if path.name == "SluiceHttp.ets" and new == "":
            broken = src.replace(old, "").replace(
                "    const out = new SluiceResponse();\n",
                "    const out = new SluiceResponse();\n" + old)  # signed once, before the loop
        else:
            broken = src.replace(old, new, 1)
        assert checker(broken), "%s: the checker missed %r -> %r" % (path.name, old, new)


# ---- ArkTS: the core is the TypeScript core; the retry rule runs under Node ----------------


def _code_after_header(text):
    """A file without its leading comment block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("//") or not lines[i].strip()):
        i += 1
    return "\n".join(lines[i:])


def test_arkts_core_is_the_tested_typescript_core():
    ts = _code_after_header(_read(CLIENTS / "typescript" / "src" / "sluice-sign.ts"))
    ets = _code_after_header(_read(CLIENTS / "arkts" / "SluiceSign.ets"))
    assert ts.startswith("export const SLUICE_HEADER_TIMESTAMP")
    assert ets == ts, "clients/arkts/SluiceSign.ets differs from clients/typescript/src/sluice-sign.ts"
    # within ArkTS's rules: no any/unknown, no destructuring, no var
    assert not re.search(r"\b(any|unknown|var)\b|const \{|const \[|let \{|let \[", ets), \
        "SluiceSign.ets uses something ArkTS forbids"


def test_arkts_retry_rule_compiled_and_run(kit_node, tmp_path):
    src = tmp_path / "SluiceRetry.ts"
    shutil.copyfile(CLIENTS / "arkts" / "SluiceRetry.ets", src)
    tsc = NODE_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    p = subprocess.run([kit_node, str(tsc), "--strict", "--target", "ES2022", "--module", "ES2022",
                        "--outDir", str(tmp_path / "out"), str(src)], capture_output=True, timeout=bound(120))
    assert p.returncode == 0, "tsc failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:]
    (tmp_path / "out" / "package.json").write_text('{"type": "module"}\n')
    cases = [
        [429, {"Retry-After": "0"}, 0],
        [429, {"retry-after": "2"}, 0],
        [429, {"Retry-After-Ms": "250", "Retry-After": "9"}, 0],
        [503, {}, 2],
        [400, {}, 0],
        [401, {}, 0],
        [503, {"x-should-retry": "false"}, 0],
        [400, {"X-Should-Retry": "true", "retry-after": "1"}, 0],
        [429, {"Retry-After": "120"}, 0],
        [500, {}, 10],
    ]
    script = ("import { sluiceRetryDelayMs } from %s;\n"
              "const cases = %s;\n"
              "console.log(JSON.stringify(cases.map(([s, h, a]) => sluiceRetryDelayMs(s, h, a))));\n"
              % (json.dumps((tmp_path / "out" / "SluiceRetry.js").as_uri()), json.dumps(cases)))
    p = subprocess.run([kit_node, "--input-type=module", "-e", script], capture_output=True,
                       timeout=bound(30))
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    got = json.loads(p.stdout)
    assert got[0] == 0 and got[1] == 2000 and got[2] == 250
    assert 1500 <= got[3] <= 2000  # 0.5 s doubled twice, jittered down by at most 25 %
    assert got[4] == -1 and got[5] == -1 and got[6] == -1
    assert got[7] == 1000
    assert 375 <= got[8] <= 500  # a Retry-After past 60 s: the default backoff instead
    assert 6000 <= got[9] <= 8000  # capped at 8 s


@pytest.fixture(scope="session")
def ark_dist(kit_node, tmp_path_factory):
    """clients/arkts's SluiceSign, SluiceRetry and SluiceHttp compiled as
    TypeScript, the platform imports pointed at Node stand-ins
    (node/ark_stub_network.ts: `http` over fetch; node/ark_stub_crypto.ts:
    never constructed, the test passes WebCrypto)."""
    d = tmp_path_factory.mktemp("ark")
    src = d / "src"
    src.mkdir()
    rewrites = [("from '@kit.NetworkKit'", "from './ark_stub_network.js'"),
                ("from './SluiceCryptoArk'", "from './ark_stub_crypto.js'"),
                ("from './SluiceSign'", "from './SluiceSign.js'"),
                ("from './SluiceRetry'", "from './SluiceRetry.js'")]
    for name in ("SluiceSign", "SluiceRetry", "SluiceHttp"):
        text = _read(CLIENTS / "arkts" / (name + ".ets"))
        for old, new in rewrites:
            text = text.replace(old, new)
        (src / (name + ".ts")).write_text(text, encoding="utf-8")
    for stub in ("ark_stub_network.ts", "ark_stub_crypto.ts"):
        shutil.copyfile(NODE_DIR / stub, src / stub)
    out = d / "out"
    tsc = NODE_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    p = subprocess.run([kit_node, str(tsc), "--strict", "--target", "ES2022", "--module", "ES2022",
                        "--moduleResolution", "bundler", "--lib", "ES2022,DOM", "--outDir", str(out)]
                       + sorted(str(f) for f in src.glob("*.ts")),
                       capture_output=True, timeout=bound(120))
    assert p.returncode == 0, "tsc failed on the ArkTS kit:\n%s" % (p.stdout + p.stderr).decode()[-3000:]
    (out / "package.json").write_text('{"type": "module"}\n')
    return out


def run_ark(node, ark, kit, s, prompt, env=None):
    argv = [node, str(NODE_DIR / "ark_client.mjs"), str(ark), str(kit), base_url(s), prompt]
    p = subprocess.run(argv, capture_output=True, timeout=bound(60), cwd=NODE_DIR, env=kit_env(env))
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_arkts_http_client_retries_a_429_signed_again(sluice_factory, mock, kit_node, kit_dist, ark_dist):
    """SluiceHttpClient itself (over the stand-in `http`) against the real
    binary: a plain call, then an upstream 429 and its own retry — two
    attempts, two nonces, both reaching the upstream, no replay."""
    s = ph.start(sluice_factory, mock)
    out = run_ark(kit_node, ark_dist, kit_dist, s, "ark plain")
    assert out["status"] == 200 and out["attempts"] == 1, out
    assert json.loads(out["body"])["choices"][0]["message"]["content"] == "echo: ark plain"
    mock.script(UPSTREAM_429, "normal")
    out = run_ark(kit_node, ark_dist, kit_dist, s, "ark retry")
    assert out["status"] == 200 and out["attempts"] == 2, out
    assert [a["status"] for a in out["seen"]] == [429, 200]
    assert_each_attempt_signed_afresh(out["seen"])
    assert out["seen"][0]["body_bytes"] == out["seen"][1]["body_bytes"] > 0
    assert out["mints"] == 1
    assert [r["status"] for r in mock.requests(path=P)] == [200, 429, 200]
    assert rejected(s, "signature_replay") == 0
    # the retry stops at maxRetries: three 429s with maxRetries 2 end in the third
    mock.script(UPSTREAM_429, UPSTREAM_429, UPSTREAM_429, "normal")
    out = run_ark(kit_node, ark_dist, kit_dist, s, "ark gives up")
    assert out["status"] == 429 and out["attempts"] == 3, out
    assert rejected(s, "signature_replay") == 0


# ---- Kotlin: the interceptor in a real OkHttp against the real binary ------------------------

OKHTTP_JARS = ("/usr/share/java/okhttp.jar", "/usr/share/java/okio.jar")
KT_CHECK = KOTLIN / "test" / "kotlin" / "dev" / "sluice" / "client" / "InterceptorCheck.kt"

# The kit is written for OkHttp 4 (Kotlin properties); Debian 12 has OkHttp 3
# (Java getters). These spell the same calls the OkHttp 3 way; nothing else
# in the interceptor changes.
OKHTTP3_SPELLING = [
    (r"\brequest\.body\b(?!\()", "request.body()"),
    (r"\brequest\.url\b(?!\()", "request.url()"),
    (r"\brequest\.method\b(?!\()", "request.method()"),
    (r"\burl\.encodedPath\b(?!\()", "url.encodedPath()"),
    (r"\burl\.encodedQuery\b(?!\()", "url.encodedQuery()"),
    (r"\bresponse\.code\b(?!\()", "response.code()"),
    (r"import okhttp3\.RequestBody\.Companion\.toRequestBody", "import okhttp3.RequestBody"),
    (r"bytes\.toRequestBody\(body\.contentType\(\)\)", "RequestBody.create(body.contentType(), bytes)"),
]


@pytest.fixture(scope="session")
def kotlin_okhttp_jar(tmp_path_factory):
    kotlinc, java = shutil.which("kotlinc"), shutil.which("java")
    if not kotlinc or not java or not all(os.path.isfile(j) for j in OKHTTP_JARS):
        pytest.skip("kotlinc/java/OkHttp not installed (Debian packages kotlin, libokhttp-java; "
                    "scripts/deps.sh installs them)")
    d = tmp_path_factory.mktemp("kt-okhttp")
    src = _read(KT_INTERCEPTOR)
    for pat, rep in OKHTTP3_SPELLING:
        src, n = re.subn(pat, rep, src)
        assert n >= 1, "the OkHttp 3 spelling %r no longer applies: update the test" % pat
    (d / "SluiceSigningInterceptor.kt").write_text(src, encoding="utf-8")
    jar = d / "check.jar"
    p = subprocess.run([kotlinc, "-cp", ":".join(OKHTTP_JARS), str(KT_SIGNER),
                        str(d / "SluiceSigningInterceptor.kt"), str(KT_CHECK),
                        "-include-runtime", "-d", str(jar)], capture_output=True, timeout=bound(200))
    assert p.returncode == 0 and jar.is_file(), "kotlinc failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:]
    return java, ":".join((str(jar),) + OKHTTP_JARS)


@pytest.mark.timeout(120)
def test_kotlin_interceptor_in_okhttp_retries_a_429_signed_again(sluice_factory, mock, kotlin_okhttp_jar):
    java, cp = kotlin_okhttp_jar
    s = ph.start(sluice_factory, mock)
    mock.script(UPSTREAM_429, UPSTREAM_429, "normal")
    p = subprocess.run([java, "-cp", cp, "dev.sluice.client.InterceptorCheckKt", base_url(s), ph.CLIENT_ID,
                        ph.CLIENT_SECRET, "alice", "from okhttp", "3"],
                       capture_output=True, timeout=bound(60))
    assert p.returncode == 0, (p.stdout + p.stderr).decode()[-3000:]
    lines = p.stdout.decode().splitlines()
    attempts = [ln.split(" ") for ln in lines if ln.startswith("attempt ")]
    final = [ln for ln in lines if ln.startswith("final ")]
    assert [a[1] for a in attempts] == ["429", "429", "200"], lines
    assert_each_attempt_signed_afresh([{"nonce": a[2]} for a in attempts])
    assert final and final[0].startswith("final 200 ") and "echo: from okhttp" in final[0], lines
    assert "mints 1" in lines
    assert [r["status"] for r in mock.requests(path=P)] == [429, 429, 200]
    assert rejected(s, "signature_replay") == 0
    assert ph.metric(s, "sluice_requests_total", code="4xx") == 2
