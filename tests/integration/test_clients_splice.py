"""
test_clients_splice.py — the body sluice edits goes upstream as the
client's bytes with only the edited values spliced in (issue 16 / 21.3,
gateway/body_scan.c): the alias's model, the clamped or added max_tokens,
stream_options.include_usage; whitespace, key order, escapes and big
integers stay exactly as sent. Bodies the scanner leaves to jansson (\\v as
whitespace, deep nesting) get jansson's verdict, as before.
"""

import json

import fallback_helpers as fh
from helpers import assert_error, raw_exchange

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


def test_spliced_body_split_at_every_offset_arrives_whole(sluice, mock):
    """A usual body is spliced into a chain of the worker's spare buffer,
    which then trades places with the request's (gateway/flow.c): the
    client's request, sent as two writes split at every offset of head and
    body, reaches the upstream edited and whole, byte for byte. Each body
    is another length and text, so a spare still holding the previous
    request's bytes, or a splice read from a freed buffer, shows."""
    for k in range(1, 260):
        raw = ('{"model":"chat-model","max_tokens":7,"messages":[{"role":"user",'
               '"content":"split %d %s"}]}' % (k, "w" * (k % 37))).encode()
        head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw)).encode()
        req = head + raw
        if k >= len(req):
            break
        mock.reset()
        got = raw_exchange(sluice.host, sluice.port, None, pieces=[(req[:k], 0.002), (req[k:], 0)])
        assert got.data.startswith(b"HTTP/1.1 200 "), (k, got.data[:200])
        (up,) = mock.requests()
        assert up["body"].encode() == raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"'), k


def test_retry_resends_the_same_small_spliced_body(sluice_factory, mock):
    """A retry and the tier after it send the spliced body again: the
    buffer that took the spare's place is the request's until it ends, so
    every attempt gets the same bytes, and the next request on the same
    worker (the old buffer now the spare) gets its own."""
    over = fh.chain(retry={"attempts": 2, "backoff": "10ms", "budget_percent": 100,
                           "budget_min": 100}, template=False)
    s = sluice_factory(overrides=over, upstream=mock)
    for text in ("first", "a second, longer prompt " * 9):
        mock.reset()
        mock.script({"status": 503}, {"status": 502})
        raw = ('{ "model" : "chat-model", "max_tokens":7, "messages":[{"role":"user",'
               '"content":"%s"}] }' % text).encode()
        r = s.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
        assert r.status == 200, r.body
        reqs = mock.requests()
        assert [q["status"] for q in reqs] == [503, 502, 200]
        want = raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"')
        for q in reqs:
            assert q["body"].encode() == want, "attempt %d sent other bytes" % q["id"]


def answer_of(n):
    """A chat.completion of exactly n bytes (compact JSON)."""
    base = {"id": "chatcmpl-held", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": ""}}]}
    empty = len(json.dumps(base, separators=(",", ":")))
    base["choices"][0]["message"]["content"] = "".join(chr(97 + i % 26) for i in range(n - empty))
    b = json.dumps(base, separators=(",", ":")).encode()
    assert len(b) == n
    return b


def test_held_answer_goes_out_whole_at_every_size(sluice, mock):
    """A non-streamed answer is held until whole: up to 16 KiB in the
    request's own block, sent with its head in one add; past it in an
    evbuffer (gateway/proxy.c, gw_proxy_hold). Around the block's sizes and
    its limit, framed by Content-Length or as chunks of 1000 bytes, the
    client gets exactly the upstream's bytes with their length."""
    for n in (300, 1023, 1024, 1025, 4096, 16383, 16384, 16385, 40000):
        body = answer_of(n)
        for chunked in (False, True):
            if chunked:
                frames = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000])
                                  for i in range(0, n, 1000)) + b"0\r\n\r\n"
                head = b"Transfer-Encoding: chunked\r\n"
            else:
                frames, head = body, b"Content-Length: %d\r\n" % n
            mock.reset()
            mock.script({"raw_response": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                          + head + b"\r\n" + frames).decode("latin-1")})
            r = sluice.chat("held %d" % n)
            assert r.status == 200, (n, chunked, r.body[:200])
            assert r.body == body, (n, chunked, len(r.body))
            assert r.header("content-length") == str(n), (n, chunked)
