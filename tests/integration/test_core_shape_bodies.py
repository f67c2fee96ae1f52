"""
test_core_shape_bodies.py — bodies of one JSON shape (gateway/body_scan.c's
kept shapes, docs/gateway.md "Kept shapes"): the second and later bodies are
read from the shape the first left, without a parse. What must hold: each
body is routed, aliased, clamped and filtered by its own values (a stale
span, a value not re-read or a model kept from the first body fails here),
and a body with escapes in its values (a hole may hold them) hits and is
read, routed and filtered by its decoded text, while an escape jansson
refuses (a lone surrogate, \\x) misses and is refused.
"""

import json

import helpers
import policy_helpers as ph
from helpers import assert_error, bound, wait_until

P = ph.CHAT_PATH


def _start(sluice_factory, mock, tmp_path):
    wf = ph.word_file(tmp_path / "w.txt", ["badword"])
    over = {"workers": 1,  # one thread: its shapes serve every request
            "filters": {"words": [{"file": wf, "action": "block", "name": "w"}],
                        "input": {"max_chars": 0}},
            "ratelimit": {"max_tokens": 100, "per_user": {"tokens_per_minute": 100000000}}}
    return ph.start(sluice_factory, mock, over, auth=False)


def _body(model, sys, user, max_tokens):
    # issue #16's body: the same bytes but for the values
    return ('{"model":"%s","messages":[{"role":"system","content":"%s"},'
            '{"role":"user","content":"%s"}],"max_tokens":%s}'
            % (model, sys, user, max_tokens)).encode()


def _send(s, raw):
    return s.request("POST", P, raw, {"Content-Type": "application/json"}, timeout=bound(20))


def _shape_counts(s):
    m = s.metrics()
    return (m.value("sluice_body_shape_hits_total"), m.value("sluice_body_shape_misses_total"))


def test_bodies_of_one_shape_each_by_its_own_values(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path)
    sent = [
        # the first: parsed, its shape kept; alias and clamp
        _body("chat-model", "You are a helpful assistant.", "Write about the sea.", "5000"),
        # same shape: no alias for plain-model, 7 below the cap stays, longer text
        _body("plain-model", "Be brief", "Write one sentence about the sea, please, in plain "
              "English, and then another one about the sky.", "7"),
        # same shape again: the alias again, an empty content, 12 digits clamped
        _body("chat-model", "", "x", "123456789012"),
    ]
    want = [("Qwen2.5-7B-Instruct", 100), ("plain-model", 7), ("Qwen2.5-7B-Instruct", 100)]
    for raw in sent:
        r = _send(s, raw)
        assert r.status == 200, r
    got = [q["json"] for q in mock.requests(P)]
    assert len(got) == 3
    for g, raw, (model, mt) in zip(got, sent, want):
        j = json.loads(raw)
        assert g["model"] == model, g
        assert g["max_tokens"] == mt, g
        assert g["messages"] == j["messages"], g
    # the bytes: only the model and max_tokens spliced
    q = mock.requests(P)[1]["body"].encode()
    assert q == sent[1], q
    # a banned word in a body of the same shape is blocked by its own content
    r = _send(s, _body("chat-model", "You are a helpful assistant.", "say badword now", "64"))
    e = assert_error(r, 400, "content_filter")
    assert e.get("param") == "messages[1].content", e
    # an unknown model of the same shape is refused by its own name
    r = _send(s, _body("no-such-model", "a", "b", "64"))
    assert r.status == 404, r
    # and the bodies above were answered from the shape (the worker's tick
    # adds its counts): at least the 2nd, 3rd, 4th and 5th
    wait_until(lambda: _shape_counts(s)[0] >= 4, bound(5), what="shape hits counted")
    hits, misses = _shape_counts(s)
    assert misses >= 1, (hits, misses)


def test_escapes_in_bodies_of_a_kept_shape_hit_and_are_read_decoded(sluice_factory, mock,
                                                                    tmp_path):
    # escapes in a value are a hole's bytes (SL_JHOLE_JSTR): bodies with
    # \n, \" and \u00e9 keep and hit a shape, each read by its own decoded
    # text; a banned word spelt across an escape is refused on every hit
    s = _start(sluice_factory, mock, tmp_path)
    raw = _body("chat-model", "You are a helpful assistant.\\nAnswer in plain English.",
                "Write one sentence.\\nUse the word \\\"tide\\\" and caf\\u00e9.", "64")
    for _ in range(3):
        assert _send(s, raw).status == 200
    wait_until(lambda: _shape_counts(s)[0] >= 2, bound(5), what="the escaped shape hit")
    hits0, misses0 = _shape_counts(s)
    for q in mock.requests(P):
        # only the alias spliced; the escaped bytes as the client wrote them
        assert q["body"].encode() == raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"')
        assert q["json"]["model"] == "Qwen2.5-7B-Instruct"
    for i in range(3):
        # the same shape, the word across an escape: decoded, refused
        r = _send(s, _body("chat-model", "sys\\nline %d" % i, "say bad\\u0077ord\\n now", "64"))
        e = assert_error(r, 400, "content_filter")
        assert e.get("param") == "messages[1].content", e
        r = _send(s, _body("chat-model", "bad\\u0077ord %d" % i, "hello", "64"))
        e = assert_error(r, 400, "content_filter")
        assert e.get("param") == "messages[0].content", e
    # and one with no banned word: sent as the client wrote it
    raw = _body("plain-model", "line one\\nline two", "a \\\"quoted\\\" w\\u00f6rd \\ud83d\\ude00", "7")
    r = _send(s, raw)
    assert r.status == 200, r
    q = mock.requests(P)[-1]
    assert q["body"].encode() == raw, q["body"]
    assert q["json"]["messages"][0]["content"] == "line one\nline two"
    assert q["json"]["messages"][1]["content"] == 'a "quoted" w\u00f6rd \U0001F600'
    # all of them hits: 7 bodies after the counts above
    wait_until(lambda: _shape_counts(s)[0] >= hits0 + 7, bound(5), what="seven hits counted")
    assert _shape_counts(s)[1] == misses0


def test_a_word_across_an_escape_is_masked_on_every_hit(sluice_factory, mock, tmp_path):
    wf = ph.word_file(tmp_path / "w.txt", ["badword"])
    over = {"workers": 1,
            "filters": {"words": [{"file": wf, "action": "mask"}], "mask": "[x]",
                        "input": {"max_chars": 0}}}
    s = ph.start(sluice_factory, mock, over, auth=False)
    for i in range(4):
        r = _send(s, _body("chat-model", "line\\n%d" % i, "a bad\\u0077ord\\n and caf\\u00e9", "64"))
        assert r.status == 200, r
        q = mock.requests(P)[-1]["json"]
        assert q["messages"][1]["content"] == "a [x]\n and caf\u00e9", q
        assert q["messages"][0]["content"] == "line\n%d" % i, q
    wait_until(lambda: _shape_counts(s)[0] >= 3, bound(5), what="three hits counted")


def test_words_in_and_after_non_ascii_text_are_masked_on_every_hit(sluice_factory, mock,
                                                                  tmp_path):
    # text with \u00e9 and CJK is judged without the channel when clean
    # (filters/scan.c flt_text_clean): a word spelt with é, a word after é
    # and a CJK word are still masked, and a clean text with è, é and CJK
    # goes up as the client wrote it
    wf = ph.word_file(tmp_path / "w.txt", ["badword", "caf\u00e9", "\u654f\u611f\u8bcd"])
    over = {"workers": 1,
            "filters": {"words": [{"file": wf, "action": "mask"}], "mask": "[x]",
                        "input": {"max_chars": 0}}}
    s = ph.start(sluice_factory, mock, over, auth=False)
    masked = [("the CAF\\u00e9 \\u00e8 bad\\u0077ord \\u654f\\u611f\\u8bcd",
               "the [x] \u00e8 [x] [x]"),
              # one word each, and that word is all the text has to hit
              ("the CAF\\u00e9 \\u00e8 and tea", "the [x] \u00e8 and tea"),
              ("\\u00e8 x\\u654f\\u611f\\u8bcdx", "\u00e8 x[x]x")]
    for i in range(3):
        for text, want in masked:
            r = _send(s, _body("chat-model", "line\\n%d" % i, text, "64"))
            assert r.status == 200, r
            q = mock.requests(P)[-1]["json"]
            assert q["messages"][1]["content"] == want, q
        raw = _body("chat-model", "line\\n%d" % i, "caf\\u00e8 \\u654f\\u611f x\\u00e9", "64")
        r = _send(s, raw)
        assert r.status == 200, r
        q = mock.requests(P)[-1]
        assert q["body"].encode() == raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"'), q
        assert q["json"]["messages"][1]["content"] == "caf\u00e8 \u654f\u611f x\u00e9"
    wait_until(lambda: _shape_counts(s)[0] >= 4, bound(5), what="four hits counted")


def test_bad_escapes_in_a_body_of_a_kept_shape_are_refused(sluice_factory, mock, tmp_path):
    # a lone or reversed surrogate escape, or an escape JSON has not, in a
    # body of a kept shape: no hit, jansson's refusal, nothing upstream
    s = _start(sluice_factory, mock, tmp_path)
    assert _send(s, _body("chat-model", "sys\\n", "hello", "64")).status == 200
    assert _send(s, _body("chat-model", "sys\\t", "hello again", "64")).status == 200
    wait_until(lambda: _shape_counts(s)[0] >= 1, bound(5), what="the shape hit")
    n0 = len(mock.requests(P))
    hits0 = _shape_counts(s)[0]
    for bad in ("x \\ud83d y", "x \\ude00", "\\ude00\\ud83d", "\\ud83d\\u0041", "a \\x41"):
        r = _send(s, _body("chat-model", "sys", bad, "64"))
        assert_error(r, 400, "invalid_json")
    assert len(mock.requests(P)) == n0
    # a good body of the shape still hits afterwards
    assert _send(s, _body("chat-model", "sys", "fine\\n", "64")).status == 200
    wait_until(lambda: _shape_counts(s)[0] >= hits0 + 1, bound(5), what="a hit after")
    assert _shape_counts(s)[0] == hits0 + 1


def _parts_body(sys, t1, t2, url):
    # issue #16's body as a vision client sends it: the user message as two
    # text parts and an image part
    return ('{"model":"chat-model","messages":[{"role":"system","content":"%s"},'
            '{"role":"user","content":[{"type":"text","text":"%s"},{"type":"text","text":"%s"},'
            '{"type":"image_url","image_url":{"url":"%s"}}]}],"max_tokens":64}'
            % (sys, t1, t2, url)).encode()


def _image_part(url):
    return ('{"type":"image_url","image_url":{"url":"%s"}}' % url).encode()


def test_words_in_text_parts_are_masked_and_refused_on_every_hit(sluice_factory, mock, tmp_path):
    # text parts are judged as the one text the channel reads (a word split
    # across two parts included) by the clean-text shortcut (filters/
    # request.c flt_parts_clean), on the first body (parsed) and on every
    # body read from its kept shape; the image part goes up as the client
    # wrote it
    mw = ph.word_file(tmp_path / "m.txt", ["badword"])
    bw = ph.word_file(tmp_path / "b.txt", ["forbidden"])
    over = {"workers": 1,
            "filters": {"words": [{"file": mw, "action": "mask", "name": "m"},
                                  {"file": bw, "action": "block", "name": "b"}],
                        "regex": [{"name": "phone", "pattern": r"1[3-9]\d{9}", "action": "mask"}],
                        "mask": "[x]", "input": {"max_chars": 0}}}
    s = ph.start(sluice_factory, mock, over, auth=False)
    b64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    masked = [("say bad", "word please %d", "say [x] please %d"),    # split across the parts
              ("a badword %d", " and more", "a [x] %d and more"),    # in one part
              ("call 1381", "2345678 now %d", "call [x] now %d"),    # the regex across the parts
              ("caf\\u00e9 bad", "WORD %d", "caf\u00e9 [x] %d")]     # after é, other case
    sent = 0
    for i in range(3):
        url = "data:image/png;base64,%s%d" % (b64, i) if i % 2 else \
            "https://example.com/img/sea-%d.jpg?s=a%%2Fb" % i
        for t1, t2, want in masked:  # the very first body is one of these
            t1, t2, want = (x.replace("%d", str(i)) for x in (t1, t2, want))
            raw = _parts_body("sys %d" % i, t1, t2, url)
            r = _send(s, raw)
            sent += 1
            assert r.status == 200, r
            q = mock.requests(P)[-1]
            parts = q["json"]["messages"][1]["content"]
            assert len(parts) == 3, parts
            assert parts[0]["text"] + parts[1]["text"] == want, parts
            assert parts[2] == {"type": "image_url", "image_url": {"url": url}}, parts
            assert _image_part(url) in q["body"].encode(), q["body"]
        # a block word split across the parts, and in the second part alone
        n0 = len(mock.requests(P))
        for t1, t2 in (("it is forb", "idden %d" % i), ("fine %d" % i, "FORBIDDEN")):
            r = _send(s, _parts_body("sys %d" % i, t1, t2, url))
            sent += 1
            e = assert_error(r, 400, "content_filter")
            assert e.get("param") == "messages[1].content", e
        assert len(mock.requests(P)) == n0
        # a clean body: every byte as sent (only the model aliased)
        raw = _parts_body("sys %d" % i, "Write one sentence about the sea %d," % i,
                          " in plain English.", url)
        r = _send(s, raw)
        sent += 1
        assert r.status == 200, r
        q = mock.requests(P)[-1]
        assert q["body"].encode() == raw.replace(b'"chat-model"', b'"Qwen2.5-7B-Instruct"'), q
    # every body but the first was read from the kept shape
    wait_until(lambda: _shape_counts(s)[0] >= sent - 1, bound(5), what="shape hits counted")
    assert _shape_counts(s)[0] == sent - 1
    assert ph.metric(s, "sluice_filter_hits_total", rule="b", action="block") == 6
