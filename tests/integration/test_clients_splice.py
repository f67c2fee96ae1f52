"""
test_clients_splice.py — the body sluice edits goes upstream as the
client's bytes with only the edited values spliced in (issue 16 / 21.3,
gateway/body_scan.c): the alias's model, the clamped or added max_tokens,
stream_options.include_usage; whitespace, key order, escapes and big
integers stay exactly as sent. Bodies the scanner leaves to jansson (\\v as
whitespace, deep nesting) get jansson's verdict, as before.
"""

import json

from helpers import assert_error

BIG = 18446744073709551617  # 2^64 + 1: jansson alone would round it


def forward(sluice, mock, raw):
    r = sluice.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    (req,) = mock.requests()
    return req["body"].encode()


def test_alias_rewrite_keeps_every_other_byte(sluice, mock):
    raw = ('{ "seed" : %d,\n  "model":"chat-model",  "max_tokens":7,\n'
           '  "messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\ude00 \\"q\\""}] }' % BIG).encode()
    got = forward(sluice, mock, raw)
    assert got == raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"'), got


def test_escaped_model_name_is_routed_and_rewritten(sluice, mock):
    raw = b'{"model":"chat-\\u006dodel","max_tokens":7,"messages":[{"role":"user","content":"x"}]}'
    got = forward(sluice, mock, raw)
    assert got == raw.replace(b'"chat-\\u006dodel"', b'"Qwen2.5-7B-Instruct"'), got


def test_served_names_quoted_once_per_conf(sluice_factory, mock):
    """The served name's JSON text is made when the conf is built: plain,
    with a quote, a backslash, a control byte and a non-ASCII letter (the
    quoting's escape path), and one too long for the splice (the tree
    rewrites it, the other values survive). Each reaches the upstream as
    exactly that name, the plain one spliced into the client's bytes."""
    names = {"m-plain": "served-model", "m-esc": 'we"ird\\na\tm\u00e9', "m-long": "L" * 300}
    s = sluice_factory({"models": {k: {"upstream": "main", "name": v} for k, v in names.items()}})
    raw = '{"model":"%s","max_tokens":7,"messages":[{"role":"user","content":"x \\"y\\""}]}'
    for i, (k, v) in enumerate(names.items()):
        r = s.request("POST", "/v1/chat/completions", (raw % k).encode(),
                      {"Content-Type": "application/json"})
        assert r.status == 200, r.body
        body = json.loads(mock.requests()[i]["body"])
        assert body["model"] == v, (k, body["model"])
        assert body["messages"] == [{"role": "user", "content": 'x "y"'}] and body["max_tokens"] == 7
    plain = mock.requests()[0]["body"].encode()
    assert plain == (raw % "m-plain").replace('"m-plain"', '"served-model"').encode(), plain


def test_clamp_and_usage_are_spliced(sluice_factory, mock):
    s = sluice_factory({"ratelimit": {"max_tokens": 100, "per_user": {"tokens_per_minute": 1000000}}})
    # max_tokens above the cap: replaced in place; stream_options with
    # include_usage false: the value turned true where it stands
    raw = (b'{"model":"plain-model", "max_tokens": 5000 ,"stream":true,'
           b'"stream_options":{"include_usage":false},"seed":%d,'
           b'"messages":[{"role":"user","content":"hi"}]}' % BIG)
    r = s.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    (req,) = mock.requests()
    want = raw.replace(b" 5000 ", b" 100 ").replace(b'"include_usage":false', b'"include_usage":true')
    assert req["body"].encode() == want, req["body"]
    mock.reset()
    # neither present: both added before the closing brace, nothing else moves
    raw = b'{"model":"plain-model","stream":true,"messages":[{"role":"user","content":"hi"}]}\n'
    r = s.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    (req,) = mock.requests()
    body = req["body"].encode()
    assert body.startswith(raw[: raw.rindex(b"}")]), body
    added = json.loads(b"{" + body[raw.rindex(b"}") + 1 : body.rindex(b"}")] + b"}")
    assert added == {"max_tokens": 100, "stream_options": {"include_usage": True}}, body


def test_vertical_tab_is_refused_in_janssons_words(sluice, mock):
    r = sluice.request("POST", "/v1/chat/completions", b'{"model":"plain-model",\x0b"max_tokens":7}',
                       {"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_json")
    assert "line 1, column" in json.loads(r.body)["error"]["message"]
    assert mock.requests() == []


def test_deep_body_takes_the_slow_path_and_still_goes(sluice, mock):
    deep = "[" * 400 + "]" * 400
    raw = ('{"model":"plain-model","max_tokens":7,"x":%s,'
           '"messages":[{"role":"user","content":"deep"}]}' % deep).encode()
    got = forward(sluice, mock, raw)
    assert got == raw
