"""
test_clients_json.py — valid JSON is accepted (issue 12, item 7): "\\u0000"
inside a string and integers beyond 2^63 (a `seed`, a `user` id a client
made up). The client's bytes are forwarded untouched when sluice need not
change the body; errors for invalid JSON are sluice's own words, never the
JSON library's.
"""

import json

import pytest

from helpers import assert_error

BIG = 18446744073709551617  # 2^64 + 1


def forward(sluice, mock, raw):
    r = sluice.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    (req,) = mock.requests()
    return req


def test_nul_in_string_is_forwarded_untouched(sluice, mock):
    raw = b'{"model":"plain-model","max_tokens":7,"messages":[{"role":"user","content":"a\\u0000b"}]}'
    req = forward(sluice, mock, raw)
    assert req["body"].encode() == raw
    assert req["json"]["messages"][0]["content"] == "a\x00b"


def test_integer_above_2_63_is_forwarded_untouched(sluice, mock):
    raw = ('{"model":"plain-model","seed":%d,"n":1,"max_tokens":7,'
           '"messages":[{"role":"user","content":"big"}]}' % BIG).encode()
    req = forward(sluice, mock, raw)
    assert req["body"].encode() == raw
    assert req["json"]["seed"] == BIG


def test_integer_above_2_63_with_an_alias_still_routes(sluice, mock):
    # chat-model is an alias: sluice rewrites "model", the other integers stay integers.
    raw = ('{"model":"chat-model","seed":%d,"max_tokens":7,'
           '"messages":[{"role":"user","content":"big"}]}' % -BIG).encode()
    req = forward(sluice, mock, raw)
    assert req["json"]["model"] == "Qwen2.5-7B-Instruct"
    assert req["json"]["max_tokens"] == 7 and isinstance(req["json"]["max_tokens"], int)
    assert float(req["json"]["seed"]) == float(-BIG)


@pytest.mark.parametrize(
    "raw,why",
    [
        (b'{"model":"plain-model","x":1e999}', "a number is too large"),
        (b'{"model":"plain-model"', "it ends before the JSON value does"),
        (b'{"model":"plain-model"} x', "there is more after the JSON value"),
        (b'{"model":"a","model":"b"}', "an object has the same key twice"),
        (b'{"mo\\u0000del":"plain-model"}', "an object key contains"),
        (b'{"model":nope}', "its syntax is invalid"),
    ],
    ids=["overflow", "premature", "trailing", "duplicate", "nul_key", "syntax"],
)
def test_invalid_json_in_sluices_words(sluice, mock, raw, why):
    r = sluice.request("POST", "/v1/chat/completions", raw)
    assert_error(r, 400, "invalid_json")
    msg = json.loads(r.body)["error"]["message"]
    assert why in msg, msg
    assert "line 1, column" in msg, msg
    for library_word in ("JSON_ALLOW_NUL", "too big", "NUL byte in object key", "duplicate object key",
                         "'[' or '{' expected", "end of file expected", "real number overflow"):
        assert library_word not in msg, msg
    assert mock.requests() == []


def test_default_max_tokens_per_model(sluice_factory, mock):
    # Issue 12, item 9: the default added when the client sends none is the
    # model's; ratelimit.max_tokens stays the cap for what a client asks.
    sluice = sluice_factory({
        "ratelimit": {"max_tokens": 4096},
        "models": {"plain-model": {"upstream": "main", "default_max_tokens": 512},
                   "big-model": {"upstream": "main", "default_max_tokens": 100000}},
    }, upstream=mock)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    for model, sent, want in [("plain-model", None, 512), ("plain-model", 9000, 4096),
                              ("plain-model", 1000, 1000), ("big-model", None, 4096),
                              ("chat-model", None, 4096)]:
        mock.reset()
        b = dict(body, model=model)
        if sent is not None:
            b["max_tokens"] = sent
        r = sluice.request("POST", "/v1/chat/completions", json.dumps(b).encode())
        assert r.status == 200, r.body
        (req,) = mock.requests()
        assert req["json"]["max_tokens"] == want, (model, sent, req["json"])


def test_responses_max_output_tokens_capped(sluice_factory, mock):
    # The Responses API is no way around the cap: max_output_tokens is
    # clamped like max_tokens, and gets the model's default when absent.
    sluice = sluice_factory({
        "ratelimit": {"max_tokens": 4096},
        "models": {"plain-model": {"upstream": "main", "default_max_tokens": 512}},
    }, upstream=mock)
    for model, sent, want in [("plain-model", None, 512), ("plain-model", 100000, 4096),
                              ("plain-model", 1000, 1000), ("chat-model", None, 4096)]:
        mock.reset()
        b = {"model": model, "input": "hi"}
        if sent is not None:
            b["max_output_tokens"] = sent
        raw = json.dumps(b).encode()
        r = sluice.request("POST", "/v1/responses", raw, {"Content-Type": "application/json"})
        assert r.status == 200, r.body
        (req,) = mock.requests()
        assert req["json"]["max_output_tokens"] == want, (model, sent, req["json"])
        if model == "plain-model" and sent == 1000:
            assert req["body"].encode() == raw  # nothing to change: the client's bytes
    r = sluice.request("POST", "/v1/responses", b'{"model":"plain-model","input":"x","max_output_tokens":"9"}')
    assert_error(r, 400, "invalid_parameter")
