"""
test_ratelimit_budget_json.py — a token budget's reservation for bodies
whose prompt estimate counts "compact JSON" (ratelimit/prompt_json.c): a
Responses request's function_call items, non-text parts and tools, and a
chat request's tools and tool_calls. sluice counts them over the client's
bytes, without a JSON tree; the reservation must be to the token what the
tree gave (json_dumps' compact text estimated): blanks between tokens do
not count, "\\/" is one byte, "\\u00e9" one non-ASCII character, a
control escape six bytes. Each case is sent as indented JSON with
\\uXXXX escapes and "\\/" (what an SDK with ensure_ascii writes), then
again with longer strings (the same shape: body_scan.c's kept shape
answers it) and read back through the day budget's X-RateLimit-Remaining;
a body past the budget is refused before the upstream sees it, and a
stream that never brings its usage settles at that estimate plus its
text's. Every test here passes on the binary before the tree-less count
(6d9d6a7) too: the numbers did not move.
"""

import json

import pytest

import helpers
import policy_helpers as ph
from helpers import bound

DAY = 100000
MAX_OUT = 100


def est_text(s):
    """rl_estimate_text_tokens: ceil(ASCII bytes / 4) + one a non-ASCII character."""
    ascii = sum(1 for ch in s if ord(ch) < 0x80)
    return (ascii + 3) // 4 + (len(s) - ascii)


def est_json(v):
    """The tree's count: json_dumps(JSON_COMPACT) estimated (no reals here:
    Python writes them shorter than jansson's %.17g)."""
    return est_text(json.dumps(v, separators=(",", ":"), ensure_ascii=False))


def raw(b):
    """b as an SDK with ensure_ascii and indent writes it, '/' escaped too."""
    return json.dumps(b, indent=2, ensure_ascii=True).replace("/", "\\/").encode()


def resp_estimate(b):
    """rl_responses_prompt_tokens, in Python."""
    n = 3
    if isinstance(b.get("instructions"), str):
        n += est_text(b["instructions"])
    inp = b.get("input")
    if isinstance(inp, str):
        n += 4 + est_text(inp)
    elif isinstance(inp, list):
        for it in inp:
            n += 4
            c = it.get("content") if isinstance(it, dict) else None
            o = it.get("output") if isinstance(it, dict) else None
            if isinstance(it, dict) and "content" in it:
                if isinstance(c, str):
                    n += est_text(c)
                elif isinstance(c, list):
                    for p in c:
                        t = p.get("text") if isinstance(p, dict) else None
                        ty = p.get("type") if isinstance(p, dict) else None
                        if isinstance(t, str):
                            n += est_text(t)
                        elif ty == "input_image":
                            n += 85
                        else:
                            n += est_json(p)
            elif isinstance(o, str):
                n += est_text(o)
            else:
                n += est_json(it)
    if "tools" in b:
        n += est_json(b["tools"])
    return n


def chat_estimate(b):
    """rl_body_prompt_tokens, in Python (string contents)."""
    n = 3
    for m in b["messages"]:
        n += 4
        if isinstance(m.get("content"), str):
            n += est_text(m["content"])
        if isinstance(m.get("name"), str):
            n += est_text(m["name"])
        if isinstance(m.get("tool_calls"), (list, dict)):
            n += est_json(m["tool_calls"])
    if isinstance(b.get("tools"), (list, dict)):
        n += est_json(b["tools"])
    return n


TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather at a caf\u00e9 / harbour",
     "parameters": {"type": "object", "properties": {
         "location": {"type": "string", "description": "City, e.g. Brest \u4e2d\u6587"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
         "days": {"type": "integer", "minimum": 0, "maximum": -0}},
         "required": ["location"], "additionalProperties": False}},
]


def resp_body(words):
    return {
        "model": "chat-model",
        "instructions": "Be terse.\nQuote \"exactly\" \u2014 and\ttab.",
        "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": words},
                {"type": "input_image", "image_url": "https://x.test/a.png"},
                {"type": "input_file", "file_id": "file-\u00e9\u00e9/" + words[:20]}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"location\": \"Brest\", \"note\": \"" + words[:30] + "\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "12\u00b0C, " + words},
            {"type": "reasoning", "id": "rs_1", "summary": [
                {"type": "summary_text", "text": "ctl \u0001 " + words[:10]}]},
            {"role": "assistant", "content": "\U0001F600 " + words},
        ],
        "tools": TOOLS,
        "max_output_tokens": MAX_OUT,
    }


def chat_body(words):
    return {
        "model": "chat-model",
        "messages": [
            {"role": "system", "content": "You are terse. caf\u00e9"},
            {"role": "user", "content": words, "name": "al\u00efce"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": "{\"location\":\"Brest\\/Quimper " + words[:25] + "\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12\u00b0C " + words},
        ],
        "tools": [{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                    if k != "type"}}],
        "max_tokens": MAX_OUT,
    }


CASES = {
    "responses": ("/v1/responses", resp_body, resp_estimate),
    "chat-tools": ("/v1/chat/completions", chat_body, chat_estimate),
}


def remaining(r):
    lim, left, _ = ph.rl_headers(r)
    assert r.status == 200, (r.status, r.body[:300])
    assert lim == DAY and left is not None, r.headers
    return left


@pytest.mark.parametrize("case", sorted(CASES))
def test_budget_reserves_the_trees_estimate(sluice_factory, mock, case):
    """The reservation is the tree's estimate + the output cap, to the
    token, for the body and for one of the same shape with longer strings.
    With usage off the JSON answer keeps its reservation, so each reading
    is the previous one minus this request's reservation (a day budget
    refills one token in 0.864 s: at most one back)."""
    path, make, estimate = CASES[case]
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096})
    alice = ph.mint("alice")
    mock.set_default({"usage": False})
    h = {"Authorization": alice.bearer, "Content-Type": "application/json"}
    short = " ".join("w%02d" % i for i in range(20))
    long_ = " ".join("word%03d" % i for i in range(150))
    want = [estimate(make(short)) + MAX_OUT, estimate(make(long_)) + MAX_OUT]
    rems = []
    for b in (make(short), make(short), make(long_)):
        body = raw(b)
        assert b" \"" in body and b"\\u00e9" in body and b"\\/" in body  # blanks, escapes
        rems.append(remaining(s.request("POST", path, body, h, timeout=bound(10))))
    assert DAY - rems[0] == want[0], (rems, want)
    assert want[0] - 1 <= rems[0] - rems[1] <= want[0], (rems, want)
    assert want[1] - 1 <= rems[1] - rems[2] <= want[1], (rems, want)
    # the upstream got the client's bytes (no tree was dumped for the estimate)
    got = [r for r in mock.requests(path)]
    assert len(got) == 3


@pytest.mark.parametrize("case", sorted(CASES))
def test_budget_refuses_what_the_json_makes_too_big(sluice_factory, mock, case):
    """A budget the text alone fits but the tools' JSON does not: refused
    before the upstream sees it; one that fits both is let through."""
    path, make, estimate = CASES[case]
    b = make("short words")
    need = estimate(b) + MAX_OUT
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_minute": need - 1},
                                           "max_tokens": 4096})
    alice = ph.mint("alice")
    h = {"Authorization": alice.bearer}
    r = s.request("POST", path, raw(b), h, timeout=bound(10))
    e = helpers.assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert e["limit"] == "tokens_per_minute"
    ph.assert_upstream_untouched(mock)
    s2 = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_minute": need},
                                            "max_tokens": 4096})
    r = s2.request("POST", path, raw(b), h, timeout=bound(10))
    assert r.status == 200, (r.status, r.body[:300])


def _stream(s, path, tok, b):
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", path, raw(b), {"Authorization": tok.bearer})
        evs = [e for e in evs if e.data is not None and not e.is_done]
    text = ""
    for e in evs:
        j = e.json()
        if path == "/v1/responses":
            if j.get("type") == "response.output_text.delta":
                text += j["delta"]
        else:
            for ch in j.get("choices") or []:
                text += (ch.get("delta") or {}).get("content") or ""
    return r, evs, text


@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_without_usage_settles_on_the_estimate(sluice_factory, mock, case):
    """A stream that never brings its usage (chat: an upstream that ignores
    include_usage; Responses: cut before response.completed) settles at the
    prompt estimate + the streamed text's: each reading is the previous one
    minus exactly that, so the scan's estimate is what settles too."""
    path, make, estimate = CASES[case]
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096})
    alice = ph.mint("alice")
    if path == "/v1/responses":
        mock.set_default({"text": "a long answer of many words " * 10, "events": 4, "cut_after": 6})
    else:
        mock.set_default({"usage": False})
    b = make("some words to send")
    b["stream"] = True
    rems = []
    for _ in range(3):
        r, evs, text = _stream(s, path, alice, b)
        assert r.status == 200 and text, (r.status, evs[:3])
        assert not any("usage" in e.json() and e.json()["usage"] for e in evs
                       if path != "/v1/responses")
        rems.append(remaining(r))
    assert DAY - rems[0] == estimate(b) + MAX_OUT, (rems, estimate(b))
    used = estimate(b) + est_text(text)
    for a, b_ in zip(rems, rems[1:]):
        assert used - 1 <= a - b_ <= used, (rems, used)


def test_tools_sent_again_reserve_their_own_count(sluice_factory, mock):
    """A worker keeps the count of a tools array it walked beside the
    array's exact bytes (prompt_json.c) and counts the same bytes sent again
    from it. Two arrays of the same length whose counts differ (sixteen
    "\\u00e9" against ninety-six "z": 16 tokens against 24), sent in turn to
    one worker, each reserve their own estimate to the token, again and
    again. A kept count found by length alone, or read from the wrong slot,
    reserves the other's (8 tokens off)."""
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY},
                                           "max_tokens": 4096}, extra={"workers": 1})
    alice = ph.mint("alice")
    mock.set_default({"usage": False})
    h = {"Authorization": alice.bearer, "Content-Type": "application/json"}

    def make(word):
        b = chat_body("the same words")
        b["tools"][0]["function"]["description"] = "Weather at " + word
        return b

    e, z = make("\u00e9" * 16), make("z" * 96)
    re_, rz = raw(e), raw(z)
    assert len(re_) == len(rz) and re_ != rz
    want = {re_: chat_estimate(e) + MAX_OUT, rz: chat_estimate(z) + MAX_OUT}
    assert want[rz] - want[re_] == 8, want
    order = [re_, rz, re_, re_, rz, rz, re_, rz]
    rems = [remaining(s.request("POST", ph.CHAT_PATH, b, h, timeout=bound(10))) for b in order]
    assert DAY - rems[0] == want[order[0]], (rems, want)
    for i in range(1, len(order)):
        w = want[order[i]]
        assert w - 1 <= rems[i - 1] - rems[i] <= w, (i, rems, want)
