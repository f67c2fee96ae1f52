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
