"""
test_cache.py — the response cache through the real binary (issue 18, the
gateway side: gateway/hook_cache.c over cache/).

What a hit must be: the second identical request never reaches the mock
(counted there) and carries the same answer, in the shape it asked for (JSON
or SSE, whichever shape the answer was stored from), with X-Sluice-Cache and
Age; bob never gets alice's answer; Cache-Control no-store / no-cache; TTL
expiry (polled with a deadline); two instances share answers through Redis;
Redis down is a miss, never an error; a hit still counts for rate limits;
output filters run on the replayed text; metrics by model; and what is not
the model's clean answer (an error, a cut stream) is not stored.
"""

import json
import os
import shutil
import subprocess

import pytest

import helpers
import policy_helpers as ph
from helpers import bound, chat_body, wait_until

CHAT = "/v1/chat/completions"
NODE_DIR = helpers.ROOT / "tests" / "integration" / "node"


def global_cache(**over):
    c = {"enabled": True, "scope": "global"}
    c.update(over)
    return {"cache": c}


def ask(s, prompt="what is sluice?", stream=False, headers=None, **extra):
    extra.setdefault("temperature", 0)
    r = s.request("POST", CHAT, chat_body(prompt, stream=stream, **extra), headers or {},
                  timeout=bound(10))
    assert r.status == 200, r
    return r


def payloads(r):
    """The data payloads of an SSE body, in order."""
    text = r.body.decode()
    out = []
    for block in text.split("\n\n"):
        data = [ln[6:] for ln in block.split("\n") if ln.startswith("data: ")]
        if data:
            out.append("\n".join(data))
    return out


def answer(r):
    """(text, finish reasons, usage) of a JSON or SSE answer."""
    if (r.header("Content-Type") or "").startswith("text/event-stream"):
        ps = payloads(r)
        assert ps and ps[-1] == "[DONE]", ps[-3:]
        text, fin, usage = "", [], None
        for p in ps[:-1]:
            c = json.loads(p)
            assert c["object"] == "chat.completion.chunk"
            for ch in c.get("choices", []):
                text += (ch.get("delta") or {}).get("content") or ""
                if ch.get("finish_reason"):
                    fin.append(ch["finish_reason"])
            if c.get("usage"):
                usage = c["usage"]
        return text, fin, usage
    j = r.json()
    assert j["object"] == "chat.completion"
    return (j["choices"][0]["message"]["content"], [c["finish_reason"] for c in j["choices"]],
            j.get("usage"))


def upstream_chats(mock):
    return [q for q in mock.requests() if q["path"] == CHAT]


def metric(s, name, **labels):
    return s.metrics().value(name, **labels)


# ---- exact hits ---------------------------------------------------------------------


def test_second_identical_request_never_reaches_the_upstream(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache())
    a = ask(s)
    assert a.header("X-Sluice-Cache") == "miss"
    assert a.header("Age") is None
    b = ask(s)
    assert b.header("X-Sluice-Cache") == "hit"
    assert b.header("Age") is not None and 0 <= int(b.header("Age")) <= bound(5)
    assert len(upstream_chats(mock)) == 1
    assert answer(a) == answer(b)
    assert answer(b)[0] == mock_upstream_text("what is sluice?")
    # the stored id, created and model are replayed (Age says how old it is)
    ja, jb = a.json(), b.json()
    assert [ja[k] for k in ("id", "created", "model", "usage")] == \
        [jb[k] for k in ("id", "created", "model", "usage")]
    # whitespace is normalised in the key; another temperature-0 question is a miss
    assert ask(s, "what   is sluice? ").header("X-Sluice-Cache") == "hit"
    assert ask(s, "something else").header("X-Sluice-Cache") == "miss"
    assert len(upstream_chats(mock)) == 2
    m = s.metrics()
    assert m.value("sluice_cache_requests_total", model="chat-model", result="hit") == 2
    assert m.value("sluice_cache_requests_total", model="chat-model", result="miss") == 2
    assert m.value("sluice_cache_stores_total", model="chat-model", result="stored") == 2
    assert m.value("sluice_cache_entries", model="chat-model") == 2


def mock_upstream_text(prompt):
    return helpers.mock_upstream.reply_text(prompt)


def test_json_answer_replayed_as_sse_and_back(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache())
    a = ask(s, "json first")
    b = ask(s, "json first", stream=True, stream_options={"include_usage": True})
    assert b.header("X-Sluice-Cache") == "hit"
    assert b.header("Content-Type").startswith("text/event-stream")
    ta, fa, ua = answer(a)
    tb, fb, ub = answer(b)
    assert (tb, fb) == (ta, fa)
    assert ub == ua and ua["total_tokens"] > 0  # include_usage: the stored usage, last chunk
    c = ask(s, "json first", stream=True)  # no include_usage: no usage chunk
    assert answer(c)[2] is None and answer(c)[0] == ta
    # and an answer stored from a stream is served as JSON
    d = ask(s, "stream first", stream=True, stream_options={"include_usage": True})
    assert d.header("X-Sluice-Cache") == "miss"
    e = ask(s, "stream first")
    assert e.header("X-Sluice-Cache") == "hit"
    assert e.header("Content-Type").startswith("application/json")
    assert answer(e) == answer(d)
    assert len(upstream_chats(mock)) == 2


# ---- scope, Cache-Control, TTL ------------------------------------------------------------


def test_user_scope_bob_never_gets_alices_answer(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, {"auth": {"signing": {"required": False}},
                                        "cache": {"enabled": True}})
    alice, bob = ph.mint("alice"), ph.mint("bob")
    body = chat_body("my calendar?", temperature=0)
    mock.script({"text": "alice has a dentist at 3"}, {"text": "bob is free"})
    a1 = ph.as_user(s, alice, body)
    b1 = ph.as_user(s, bob, body)
    a2 = ph.as_user(s, alice, body)
    b2 = ph.as_user(s, bob, body)
    assert [r.header("X-Sluice-Cache") for r in (a1, b1, a2, b2)] == ["miss", "miss", "hit", "hit"]
    assert answer(a1)[0] == answer(a2)[0] == "alice has a dentist at 3"
    assert answer(b1)[0] == answer(b2)[0] == "bob is free"
    assert len(upstream_chats(mock)) == 2


def test_cache_control_no_store_and_no_cache(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache())
    mock.script({"text": "first"}, {"text": "second"}, {"text": "third"})
    a = ask(s, headers={"Cache-Control": "no-store"})
    assert (a.header("X-Sluice-Cache"), answer(a)[0]) == ("bypass", "first")
    b = ask(s)  # no-store wrote nothing
    assert (b.header("X-Sluice-Cache"), answer(b)[0]) == ("miss", "second")
    c = ask(s, headers={"Cache-Control": "no-cache"})  # skips the lookup, stores the fresh one
    assert (c.header("X-Sluice-Cache"), answer(c)[0]) == ("bypass", "third")
    d = ask(s)
    assert (d.header("X-Sluice-Cache"), answer(d)[0]) == ("hit", "third")
    e = ask(s, headers={"Cache-Control": "no-store"})  # a stored answer is not read either
    assert e.header("X-Sluice-Cache") == "bypass"
    assert len(upstream_chats(mock)) == 4
    m = s.metrics()
    assert m.value("sluice_cache_bypass_total", model="chat-model", reason="no_store") == 2
    assert m.value("sluice_cache_bypass_total", model="chat-model", reason="no_cache") == 1


def test_temperature_above_the_bound_bypasses(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache())
    for _ in range(2):
        assert ask(s, temperature=0.7).header("X-Sluice-Cache") == "bypass"
    r = s.request("POST", CHAT, chat_body("no temperature"), {}, timeout=bound(10))
    assert r.header("X-Sluice-Cache") == "bypass"  # absent = 1
    assert len(upstream_chats(mock)) == 3


def test_ttl_expiry(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache(ttl="1s"))
    assert ask(s).header("X-Sluice-Cache") == "miss"
    assert ask(s).header("X-Sluice-Cache") == "hit"
    # polled with a deadline: every hit on the way leaves the mock alone
    wait_until(lambda: ask(s).header("X-Sluice-Cache") == "miss", bound(5), interval=0.1,
               what="the entry to expire")
    assert len(upstream_chats(mock)) == 2
    assert ask(s).header("X-Sluice-Cache") == "hit"  # the fresh answer was stored again


# ---- what is not stored ------------------------------------------------------------------------


def test_errors_and_cut_streams_are_not_stored(sluice_factory, mock):
    s = sluice_factory(overrides=global_cache())
    mock.script({"status": 500}, {"no_done": True, "no_finish": True})  # cut: no finish, no [DONE]
    r = s.request("POST", CHAT, chat_body("q", temperature=0), timeout=bound(10))
    assert r.status == 500
    r = s.request("POST", CHAT, chat_body("q", stream=True, temperature=0), timeout=bound(10))
    assert r.status == 200 and "[DONE]" not in payloads(r)
    c = ask(s, "q")
    assert c.header("X-Sluice-Cache") == "miss"
    assert ask(s, "q").header("X-Sluice-Cache") == "hit"
    assert len(upstream_chats(mock)) == 3
    m = s.metrics()
    assert m.value("sluice_cache_stores_total", model="chat-model", result="stored") == 1


# ---- Redis --------------------------------------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path):
    if not shutil.which("redis-server"):
        pytest.skip("redis-server not installed")
    r = helpers.RedisServer(tmp_path / "redis")
    yield r
    r.stop()


def test_two_instances_share_hits_through_redis(sluice_factory, mock, redis_server):
    over = dict(global_cache(), redis={"url": ph.redis_url(redis_server)})
    a = sluice_factory(overrides=over, name="a")
    b = sluice_factory(overrides=over, name="b")
    ra = ask(a, "shared question")
    assert ra.header("X-Sluice-Cache") == "miss"
    # the store is fire and forget (the answer goes out first): wait for the
    # entry in Redis, not on b, whose misses would reach the mock
    wait_until(lambda: redis_server.cmd("KEYS", "sluice:cache:*"), bound(5),
               what="a's answer in Redis")
    assert ask(b, "shared question").header("X-Sluice-Cache") == "hit"
    rb = ask(b, "shared question", stream=True)
    assert rb.header("X-Sluice-Cache") == "hit"
    assert answer(rb)[0] == answer(ra)[0]
    assert len(upstream_chats(mock)) == 1
    keys = redis_server.cmd("KEYS", "sluice:cache:*")
    assert len(keys) == 1


def test_redis_down_is_a_miss_never_an_error(sluice_factory, mock):
    dead = "redis://127.0.0.1:%d/0" % helpers.free_port()
    s = sluice_factory(overrides=dict(global_cache(), redis={"url": dead, "timeout": "200ms"}))
    for _ in range(3):
        r = ask(s)
        assert r.header("X-Sluice-Cache") == "miss"
        assert answer(r)[0] == mock_upstream_text("what is sluice?")
    assert len(upstream_chats(mock)) == 3
    m = s.metrics()
    assert m.value("sluice_cache_store_errors_total", op="get") >= 3


# ---- the other hooks around a hit ------------------------------------------------------------


def test_a_hit_still_counts_for_rate_limits(sluice_factory, mock):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"requests_per_minute": 2}},
                    extra={"cache": {"enabled": True}})
    tok = ph.mint("carol")
    body = chat_body("limited", temperature=0)
    r1, r2, r3 = (ph.as_user(s, tok, body) for _ in range(3))
    assert (r1.status, r1.header("X-Sluice-Cache")) == (200, "miss")
    assert (r2.status, r2.header("X-Sluice-Cache")) == (200, "hit")
    assert r2.header("X-RateLimit-Remaining") == "0"
    helpers.assert_error(r3, 429, "rate_limit_exceeded", "rate_limit_error")
    assert len(upstream_chats(mock)) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_output_filters_run_on_the_replayed_text(sluice_factory, mock, tmp_path, stream):
    wf = ph.word_file(tmp_path / "words.txt", ["badword"])
    s = sluice_factory(overrides=dict(global_cache(),
                                      filters={"words": [{"file": wf, "action": "mask"}],
                                               "output": True}))
    mock.set_default({"text": "this has badword inside"})
    a = ask(s, "tell me", stream=stream)
    b = ask(s, "tell me", stream=stream)
    assert (a.header("X-Sluice-Cache"), b.header("X-Sluice-Cache")) == ("miss", "hit")
    assert answer(a)[0] == answer(b)[0] == "this has *** inside"
    assert len(upstream_chats(mock)) == 1
    # the other shape goes through the filters too
    c = ask(s, "tell me", stream=not stream)
    assert c.header("X-Sluice-Cache") == "hit" and answer(c)[0] == "this has *** inside"


def test_models_without_cache_are_not_cached(sluice_factory, mock):
    s = sluice_factory(overrides={"cache": {"enabled": False, "scope": "global"},
                                  "models": {"plain-model": {"cache": {"enabled": "on"}}}})
    for _ in range(2):
        assert ask(s, model="chat-model").header("X-Sluice-Cache") == "bypass"
    assert ask(s, model="plain-model").header("X-Sluice-Cache") == "miss"
    assert ask(s, model="plain-model").header("X-Sluice-Cache") == "hit"
    assert len(upstream_chats(mock)) == 3
    m = s.metrics()
    assert m.value("sluice_cache_bypass_total", model="chat-model", reason="off") == 2
    assert m.value("sluice_cache_requests_total", model="plain-model", result="hit") == 1


# ---- the official openai npm client ----------------------------------------------------------


@pytest.fixture(scope="module")
def openai_node():
    node = shutil.which("node")
    if not node:
        pytest.skip("node not installed")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        p = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci failed:\n%s" % (p.stdout + p.stderr).decode()[-3000:])
    return node


def node_ask(node, s, mode, prompt):
    p = subprocess.run([node, str(NODE_DIR / "cache_client.mjs"),
                        "http://%s:%d/v1" % (s.host, s.port), mode, prompt],
                       capture_output=True, timeout=bound(60), cwd=NODE_DIR)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_openai_npm_client_reads_every_replay(sluice_factory, mock, openai_node):
    s = sluice_factory(overrides=global_cache())
    first = node_ask(openai_node, s, "json", "from node")
    assert first["cache"] == "miss"
    want = mock_upstream_text("from node")
    assert first["text"] == want and first["finish"] == ["stop"]
    for mode in ("stream", "stream_usage", "helper", "json"):
        got = node_ask(openai_node, s, mode, "from node")
        assert got["text"] == want, (mode, got)
        assert got["finish"] == ["stop"], (mode, got)
        if mode != "helper":
            assert got["cache"] == "hit", (mode, got)
        if mode in ("stream_usage", "json"):
            assert got["usage"] == first["usage"], (mode, got)
        if mode == "stream":
            assert got["usage"] is None
    # a stream stored, read back as JSON
    st = node_ask(openai_node, s, "stream_usage", "streamed first")
    assert st["cache"] == "miss"
    js = node_ask(openai_node, s, "json", "streamed first")
    assert js["cache"] == "hit" and js["text"] == st["text"] and js["usage"] == st["usage"]
    assert len(upstream_chats(mock)) == 2


# ---- the semantic cache ---------------------------------------------------------------------------


def semantic_cache(**sem):
    c = {"enabled": True, "embed_model": "embed-model"}
    c.update(sem)
    return global_cache(semantic=c)


def active_conns(s):
    """connections.active of every upstream server in /admin/state: the
    connections handed out (gw_upstream_get) and not yet given back."""
    r = s.admin("GET", "/admin/state")
    assert r.status == 200, r
    return [sv["connections"]["active"] for p in r.json()["pools"] for sv in p.get("servers", [])]


def unit(cos):
    """An 8-dim unit vector at cosine `cos` from e1."""
    return [cos, (1 - cos * cos) ** 0.5, 0, 0, 0, 0, 0, 0]


def test_semantic_hits_and_misses_around_the_threshold(sluice_factory, mock):
    s = sluice_factory(overrides=semantic_cache())
    mock.script({"embedding": unit(1.0)}, {"text": "reset it under Settings"},
                {"embedding": unit(0.97)},  # above 0.95: the stored answer
                {"embedding": unit(0.93)}, {"text": "something else"})  # below: upstream
    a = ask(s, "how do I reset my password?")
    assert (a.header("X-Sluice-Cache"), answer(a)[0]) == ("miss", "reset it under Settings")
    b = ask(s, "how can I reset my password")
    assert (b.header("X-Sluice-Cache"), answer(b)[0]) == ("hit", "reset it under Settings")
    c = ask(s, "how do I change my avatar?")
    assert (c.header("X-Sluice-Cache"), answer(c)[0]) == ("miss", "something else")
    reqs = mock.requests()
    assert [q["path"] for q in reqs] == ["/v1/embeddings", CHAT, "/v1/embeddings",
                                         "/v1/embeddings", CHAT]
    emb = reqs[0]["json"]
    assert emb["model"] == "mock-embed"  # the embed model's served name
    assert emb["input"] == "how do I reset my password?"
    m = s.metrics()
    assert m.value("sluice_cache_semantic_lookups_total", model="chat-model", result="hit") == 1
    assert m.value("sluice_cache_semantic_lookups_total", model="chat-model", result="miss") == 2
    assert m.value("sluice_cache_semantic_entries") == 2
    # an exact repeat never needs the embeddings call
    assert ask(s, "how do I reset my password?").header("X-Sluice-Cache") == "hit"
    assert len(mock.requests()) == 5
    # the three embeddings calls and two chats gave their connections back
    act = active_conns(s)
    assert act and all(a == 0 for a in act), act


def test_semantic_embedding_past_its_deadline_goes_upstream(sluice_factory, mock):
    s = sluice_factory(overrides=semantic_cache(deadline="50ms"))
    mock.script({"stall_first_byte": 2, "embedding": unit(1.0)}, {"text": "fresh"})
    r = ask(s, "slow embeddings")
    assert (r.header("X-Sluice-Cache"), answer(r)[0]) == ("miss", "fresh")
    assert [q["path"] for q in mock.requests()] == ["/v1/embeddings", CHAT]
    chat = [q for q in mock.requests() if q["path"] == CHAT][0]
    emb = [q for q in mock.requests() if q["path"] == "/v1/embeddings"][0]
    # the chat request left ~50 ms after the embeddings call, not after its 2 s stall
    assert chat["t"] - emb["t"] < bound(1.0)
    # the abandoned embeddings call's connection is no longer counted as in use
    act = active_conns(s)
    assert act and all(a == 0 for a in act), act


def test_conf_check_names_a_missing_embed_model(sluice_factory, sluice_bin):
    s = sluice_factory(overrides=semantic_cache(embed_model="no-such-model"), start=False)
    env = dict(os.environ, **{helpers.UPSTREAM_KEY_ENV: helpers.UPSTREAM_KEY})
    p = subprocess.run([sluice_bin, "-t", "-c", str(s.conf_path)], capture_output=True,
                       timeout=bound(10), env=env)
    assert p.returncode == 1
    assert b'cache.semantic.embed_model: no model named "no-such-model"' in p.stderr + p.stdout


@pytest.mark.parametrize("stream,charge", [(False, True), (True, True), (False, False)])
def test_a_hit_charges_the_token_budget_its_stored_usage(sluice_factory, mock, stream, charge):
    day = 100000
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": day}, "max_tokens": 4096},
                    extra={"cache": {"enabled": True, "charge_tokens": charge}})
    alice = ph.mint("alice")
    prompt = "one two three"
    usage = len(prompt.split()) + 4  # the mock's total_tokens
    body = chat_body(prompt, stream=stream, max_tokens=100, temperature=0)
    rems, kinds = [], []
    for _ in range(3):
        r = ph.as_user(s, alice, body)
        assert r.status == 200
        assert answer(r)[0] == helpers.mock_upstream.reply_text(prompt)
        if stream:  # the usage chunk sluice asked for is not shown
            assert answer(r)[2] is None
        rems.append(int(r.header("X-RateLimit-Remaining")))
        kinds.append(r.header("X-Sluice-Cache"))
    assert kinds == ["miss", "hit", "hit"]
    assert len(upstream_chats(mock)) == 1
    # each reading = full - what earlier requests used - this one's reservation
    assert usage - 1 <= rems[0] - rems[1] <= usage, rems
    if charge:
        assert usage - 1 <= rems[1] - rems[2] <= usage, rems
    else:
        assert -1 <= rems[1] - rems[2] <= 0, rems


def test_semantic_entries_shared_through_redis(sluice_factory, mock, redis_server):
    over = dict(semantic_cache(), redis={"url": ph.redis_url(redis_server)})
    a = sluice_factory(overrides=over, name="a")
    b = sluice_factory(overrides=over, name="b")
    mock.script({"embedding": unit(1.0)}, {"text": "reset it under Settings"},
                {"embedding": unit(0.97)})
    ra = ask(a, "how do I reset my password?")
    assert (ra.header("X-Sluice-Cache"), answer(ra)[0]) == ("miss", "reset it under Settings")
    # the answer and the vector are stored after the answer went out: wait
    # for both (the answer's key and the stream), then for b's tail of it
    wait_until(lambda: len(redis_server.cmd("KEYS", "sluice:cache:*")) == 2, bound(5),
               what="a's answer and vector in Redis")
    wait_until(lambda: metric(b, "sluice_cache_semantic_entries") == 1, bound(5),
               what="b's index to load a's vector")
    rb = ask(b, "how can I reset my password")
    assert (rb.header("X-Sluice-Cache"), answer(rb)[0]) == ("hit", "reset it under Settings")
    assert [q["path"] for q in mock.requests()] == ["/v1/embeddings", CHAT, "/v1/embeddings"]


def test_a_template_answer_is_not_stored(sluice_factory, mock):
    s = sluice_factory(overrides=dict(global_cache(), fallback={"template": {"enabled": True}}))
    mock.script({"status": 503})
    r = ask(s, "down now")
    assert r.header("X-Sluice-Fallback") == "template"
    r = ask(s, "down now")
    assert r.header("X-Sluice-Cache") == "miss" and r.header("X-Sluice-Fallback") is None
    assert answer(r)[0] == mock_upstream_text("down now")
    assert ask(s, "down now").header("X-Sluice-Cache") == "hit"
    assert len(upstream_chats(mock)) == 2
