"""
test_fallback_template.py — the template tier through the real binary
(issue 6, tier 4): when no model can answer, the configured text comes back
with status 200 and X-Sluice-Fallback: template in exactly the shape the
client asked for (chat.completion JSON, an SSE stream of chunks ending in
[DONE] with the usage chunk when asked, the same for /v1/completions), its
text chosen by Accept-Language among fallback.template.texts; the official
openai npm client parses all of them. Without the tier the client gets the
proxy's own 503; embeddings never get a template.
"""

import json
import shutil
import subprocess

import pytest

import fallback_helpers as fh
import helpers
from helpers import bound

NODE_DIR = helpers.ROOT / "tests" / "integration" / "node"
TEXTS = {"en": fh.EN_TEXT, "fr": fh.FR_TEXT, "zh-Hant": "網路不太順暢，請稍後再試。"}


def start_down(sluice_factory, mock, **chain):
    """sluice whose only model server answers 503 to everything."""
    mock.set_default({"status": 503})
    return sluice_factory(overrides=fh.chain(texts=TEXTS, **chain), upstream=mock)


def test_json_template_for_chat_and_completions(sluice_factory, mock):
    s = start_down(sluice_factory, mock)
    m0 = fh.Metrics(s)
    r = s.chat("hello")
    j = fh.assert_template_json(r)
    assert j["id"] == "chatcmpl-" + r.header("X-Request-Id"), (j["id"], r.header("X-Request-Id"))
    assert r.header("X-Sluice-Request-Id") is None  # no queue configured
    r = s.request("POST", "/v1/completions", {"model": "chat-model", "prompt": "hi"})
    fh.assert_template_json(r, api="completions")
    # One attempt each (retries are off here), each answered by the template.
    assert [q["path"] for q in mock.requests()] == [fh.CHAT, "/v1/completions"]
    assert m0.delta("sluice_fallback_total", tier="template") == 2
    assert m0.delta("sluice_upstream_errors_total", upstream="main", kind="status_5xx") == 2
    # The client saw 200s: that is what the requests counter records.
    m1 = s.metrics()
    for route in ("chat_completions", "completions"):
        assert fh.route_requests(m1, route, "2xx") - fh.route_requests(m0.m, route, "2xx") == 1
        assert fh.route_requests(m1, route, "5xx") == 0


LANG_CASES = [
    (None, fh.DEFAULT_TEXT),
    ("en", fh.EN_TEXT),
    ("en-US,en;q=0.9", fh.EN_TEXT),  # en-US falls back to en
    ("de;q=1, fr;q=0.9, en;q=0.8", fh.FR_TEXT),  # by q-value, unknown de skipped
    ("en;q=0.5, fr", fh.FR_TEXT),  # q=1 by default beats 0.5
    ("fr;q=0, en;q=0.1", fh.EN_TEXT),  # q=0 excluded
    ("zh-Hant-TW", TEXTS["zh-Hant"]),  # a subtag dropped
    ("EN-gb", fh.EN_TEXT),  # case-insensitive
    ("de, *", fh.DEFAULT_TEXT),  # * is the default text
    ("ja", fh.DEFAULT_TEXT),
    (";;;garbage,,", fh.DEFAULT_TEXT),  # malformed items skipped
]


def test_accept_language_picks_the_text(sluice_factory, mock):
    s = start_down(sluice_factory, mock)
    for lang, want in LANG_CASES:
        h = {"Accept-Language": lang} if lang is not None else None
        fh.assert_template_json(s.chat("hi", headers=h), text=want)
        r, evs = fh.stream(s, helpers.chat_body("hi", stream=True), h)
        fh.assert_template_events(r, evs, text=want)


def test_sse_template_shapes(sluice_factory, mock):
    s = start_down(sluice_factory, mock)
    # stream without usage
    r, evs = fh.stream(s, helpers.chat_body("hi", stream=True))
    assert r.header("Cache-Control") == "no-cache"
    datas = fh.assert_template_events(r, evs)
    assert len(datas) == 3, datas  # role, content, finish
    # with stream_options.include_usage: the usage chunk, choices empty
    r, evs = fh.stream(s, helpers.chat_body("hi", stream=True, stream_options={"include_usage": True}),
                       {"Accept-Language": "en"})
    datas = fh.assert_template_events(r, evs, text=fh.EN_TEXT, usage=True)
    assert len(datas) == 4, datas
    # /v1/completions streamed: text_completion chunks
    r, evs = fh.stream(s, {"model": "chat-model", "prompt": "hi", "stream": True}, path="/v1/completions")
    fh.assert_template_events(r, evs, api="completions")
    # An alias: the client's model name comes back, not the served one.
    fh.assert_template_json(s.chat("hi", model="plain-model"), model="plain-model")


def test_dead_server_gets_template_fast(sluice_factory):
    """Connect refused (the whole pool down) is a failure like a 5xx."""
    s = sluice_factory(overrides=fh.chain(texts=TEXTS), upstream=fh.dead_url())
    for _ in range(8):  # past the breaker's 5 failures too
        with s.client() as c:
            t = helpers.time.monotonic()
            r = c.request("POST", fh.CHAT, helpers.chat_body("x"), {"Accept-Language": "fr"})
            assert helpers.time.monotonic() - t < bound(1.0)
        fh.assert_template_json(r, text=fh.FR_TEXT)
    m = s.metrics()
    assert m.value("sluice_fallback_total", tier="template") == 8
    assert m.value("sluice_upstream_errors_total", upstream="main", kind="connect") == 5
    assert m.value("sluice_upstream_errors_total", upstream="main", kind="unavailable") == 3


def test_without_template_the_client_gets_the_error(sluice_factory, mock):
    s = start_down(sluice_factory, mock, template=False)
    r = s.chat("hi")
    assert r.status == 503 and r.header("X-Sluice-Fallback") is None, r
    assert r.json()["error"]["message"] == "mock status 503"  # the upstream's own answer, relayed


def test_embeddings_never_get_a_template(sluice_factory, mock):
    s = start_down(sluice_factory, mock)
    r = s.request("POST", "/v1/embeddings", {"model": "embed-model", "input": "x"})
    assert r.status == 503 and r.header("X-Sluice-Fallback") is None, r
    assert len(mock.requests()) == 1


def test_reload_changes_the_text(sluice_factory, mock):
    s = start_down(sluice_factory, mock)
    fh.assert_template_json(s.chat("a", headers={"Accept-Language": "en"}), text=fh.EN_TEXT)
    conf = helpers.deep_merge(s.conf, {"fallback": {"template": {"texts": {"en": "Back soon."}}}})
    s.reload(conf)
    helpers.wait_until(
        lambda: s.chat("b", headers={"Accept-Language": "en"}).json()["choices"][0]["message"]["content"]
        == "Back soon.",
        bound(5), what="the reloaded template text")
    assert fh.metric(s, "sluice_config_reloads_total", result="ok") == 1


# ---- the official openai npm client ---------------------------------------------------


@pytest.fixture(scope="module")
def openai_node():
    exe = shutil.which("node")
    if not exe or not shutil.which("npm"):
        pytest.skip("node/npm not installed (needed for the openai npm client tests)")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        p = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:])
    return exe


def run_node(node, s, mode, lang=None):
    argv = [node, str(NODE_DIR / "fallback_client.mjs"), "http://%s:%d/v1" % (s.host, s.port), mode]
    if lang:
        argv.append(lang)
    p = subprocess.run(argv, capture_output=True, timeout=bound(60), cwd=NODE_DIR)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_openai_npm_client_parses_every_template_shape(sluice_factory, mock, openai_node):
    s = start_down(sluice_factory, mock)
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    r = run_node(openai_node, s, "chat")
    assert r == {"fallback": "template", "object": "chat.completion", "text": fh.DEFAULT_TEXT,
                 "role": "assistant", "finish": "stop", "usage": zero}, r
    r = run_node(openai_node, s, "stream", "en-GB")
    assert r["fallback"] == "template" and r["text"] == fh.EN_TEXT, r
    assert r["finish"] == ["stop"] and r["usage"] is None, r
    assert set(r["objects"]) == {"chat.completion.chunk"} and r["chunks"] == 3, r
    r = run_node(openai_node, s, "stream-usage")
    assert r["text"] == fh.DEFAULT_TEXT and r["usage"] == zero and r["chunks"] == 4, r
    r = run_node(openai_node, s, "completion", "fr")
    assert r == {"fallback": "template", "object": "text_completion", "text": fh.FR_TEXT,
                 "finish": "stop"}, r
    r = run_node(openai_node, s, "completion-stream")
    assert r["fallback"] == "template" and r["text"] == fh.DEFAULT_TEXT, r
    assert r["finish"] == ["stop"] and set(r["objects"]) == {"text_completion"}, r
    assert fh.metric(s, "sluice_fallback_total", tier="template") == 5
