"""
test_ratelimit_tokens.py — token budgets and the max_tokens clamp through
the real binary (issue 4, parts 2 and 3): the upstream sees min(client,
policy) and the policy maximum when the client sent none; a streamed request
whose max_tokens cannot fit the budget is refused before it starts (the
upstream gets nothing); usage settles with the upstream's usage and, when
none comes, with the streamed text's estimate (read back from the budget's
X-RateLimit-Remaining on the next request); the usage chunk sluice asks for
is never shown to a client that did not ask for it, and is shown to one
that did; a failed upstream gives the reservation back.

Budgets are read through a per-day budget (headers describe it when it is
the only limit): it refills one token every 0.864 s at 100000 a day, so
readings a moment apart differ only by what was charged.
"""

import json
import math

import pytest

import helpers
import policy_helpers as ph
from helpers import assert_error, chat_body, mock_upstream

DAY = 100000
PROMPT = "one two three"
REPLY = mock_upstream.reply_text(PROMPT, 4)  # "echo: one two three"
MOCK_USAGE = len(PROMPT.split()) + 4  # the mock's total_tokens: prompt words + events


def _remaining(r):
    lim, left, _ = ph.rl_headers(r)
    assert lim == DAY and left is not None, r.headers
    return left


def _data(events):
    return [e for e in events if e.data is not None]


def _stream(s, tok, body):
    with s.client(timeout=helpers.bound(10)) as c:
        r, evs = c.stream("POST", ph.CHAT_PATH, body, {"Authorization": tok.bearer})
        evs = _data(list(evs))
    return r, evs


def _content(events):
    out = ""
    for e in events:
        if e.is_done:
            continue
        for ch in e.json().get("choices", []):
            out += (ch.get("delta") or {}).get("content") or ""
    return out


# ---- the clamp -----------------------------------------------------------------------


@pytest.mark.parametrize("sent,field,seen", [
    ({"max_tokens": 100}, "max_tokens", 100),
    ({"max_tokens": 1000}, "max_tokens", 256),
    ({"max_tokens": 256}, "max_tokens", 256),
    ({}, "max_tokens", 256),
    ({"max_completion_tokens": 1000}, "max_completion_tokens", 256),
    ({"max_completion_tokens": 7}, "max_completion_tokens", 7),
])
def test_max_tokens_clamp(sluice_factory, mock, sent, field, seen):
    s = ph.rl_start(sluice_factory, mock, {"max_tokens": 256})
    r = ph.as_user(s, ph.mint("alice"), chat_body("clamp", **sent))
    assert r.status == 200, r
    (q,) = mock.requests()
    assert q["json"][field] == seen, q["json"]
    if field == "max_completion_tokens":
        assert "max_tokens" not in q["json"]  # one limit field, not two


def test_clamp_default_and_bad_values(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, auth=False)  # no ratelimit section: the default policy, 2048
    assert s.chat("x").status == 200
    assert s.chat("x", max_tokens=99999).status == 200
    assert [q["json"]["max_tokens"] for q in mock.requests()] == [2048, 2048]
    for bad in (0, -5, "12", 1.5):
        assert_error(s.chat("x", max_tokens=bad), 400, "invalid_parameter")
    assert len(mock.requests()) == 2


# ---- budgets ---------------------------------------------------------------------------


def test_stream_that_cannot_fit_the_budget_is_refused_before_it_starts(sluice_factory, mock):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_minute": 1000}, "max_tokens": 4096})
    alice = ph.mint("alice")
    # more than the whole budget: never fits, no Retry-After
    r = ph.as_user(s, alice, chat_body(PROMPT, stream=True, max_tokens=2000))
    e = assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert e["limit"] == "tokens_per_minute" and "max_tokens" in e["message"]
    assert r.header("Retry-After") is None
    assert (r.header("Content-Type") or "").startswith("application/json")  # not a stream
    ph.assert_upstream_untouched(mock)
    # one that fits is served and settles at what it used (the mock's
    # usage: 3 prompt words + 300 events)
    mock.script({"events": 300})
    r, evs = _stream(s, alice, chat_body(PROMPT, stream=True, max_tokens=500))
    assert r.status == 200 and evs[-1].is_done
    # what is left (~700) cannot take 900 more now: refused, and it says
    # when it would fit (1000 a minute refill 16.7 a second)
    r = ph.as_user(s, alice, chat_body(PROMPT, stream=True, max_tokens=900))
    e = assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert e["limit"] == "tokens_per_minute"
    assert 8 <= int(r.header("Retry-After")) <= 16, r.header("Retry-After")
    assert len(mock.requests()) == 1
    assert ph.metric(s, "sluice_ratelimited_total", limit="tokens_per_minute") == 2


def _budget_setup(sluice_factory, mock):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096})
    return s, ph.mint("alice")


def _reservation(first_remaining, max_tokens):
    """(reservation, prompt estimate) from the first request's Remaining."""
    res = DAY - first_remaining
    return res, res - max_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_usage_settles_with_upstream_usage(sluice_factory, mock, stream):
    s, alice = _budget_setup(sluice_factory, mock)
    body = chat_body(PROMPT, stream=stream, max_tokens=100)
    rems = []
    for _ in range(3):
        if stream:
            r, evs = _stream(s, alice, body)
            assert _content(evs) == REPLY
        else:
            r = ph.as_user(s, alice, body)
            assert r.json()["usage"]["total_tokens"] == MOCK_USAGE
        assert r.status == 200
        rems.append(_remaining(r))
    res, prompt_est = _reservation(rems[0], 100)
    assert prompt_est > 0
    # each reading = full - what earlier requests used - this one's reservation
    for a, b in zip(rems, rems[1:]):
        assert MOCK_USAGE - 1 <= a - b <= MOCK_USAGE, (rems, MOCK_USAGE)


def test_stream_without_upstream_usage_settles_on_the_text(sluice_factory, mock):
    s, alice = _budget_setup(sluice_factory, mock)
    mock.set_default({"usage": False})  # an upstream that ignores include_usage
    body = chat_body(PROMPT, stream=True, max_tokens=100)
    rems = []
    for _ in range(3):
        r, evs = _stream(s, alice, body)
        assert r.status == 200 and _content(evs) == REPLY
        assert not any("usage" in e.json() for e in evs if not e.is_done)
        rems.append(_remaining(r))
    _, prompt_est = _reservation(rems[0], 100)
    used = prompt_est + math.ceil(len(REPLY.encode()) / 4)  # ASCII: 4 bytes a token
    for a, b in zip(rems, rems[1:]):
        assert used - 1 <= a - b <= used, (rems, used, prompt_est)


# A stream's texts as JSON source: (text, counted). jansson refuses a lone
# surrogate and \u0000 (the chunk counts nothing); the others count what
# they decode to (ASCII characters, other characters).
_STREAM_TEXTS = [
    ("Hello there", True),
    ("h\\u00e9llo\\n", True),
    ("\\ud83d\\ude00!", True),
    ('\\"q\\" \\\\ \\/', True),
    ("\\ud800x", False),
    ("\\u0000", False),
    ("caf\u00e9 \u4e2d\u6587", True),
    ("\\\\ud800", True),
]


def _text_chunk(stream, text):
    return ('data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":%d,'
            '"model":"m","choices":[{"index":0,"delta":{"content":"%s"},'
            '"finish_reason":null}]}\n\n' % (stream, 1700000000 + stream, text))


def test_stream_chunks_count_as_the_tree_reads_them(sluice_factory, mock):
    """Streams without usage settle on their text's estimate; each chunk's
    text is what jansson's tree of it holds (escapes decoded, a surrogate
    pair one character, a chunk jansson refuses nothing), though after a
    stream's first chunks they are read from the worker's kept shape of
    them (ratelimit/usage_json.c), not parsed."""
    s, alice = _budget_setup(sluice_factory, mock)
    ascii = other = 0
    for text, counted in _STREAM_TEXTS:
        if counted:
            t = json.loads('"%s"' % text)
            ascii += sum(1 for ch in t if ord(ch) < 0x80)
            other += sum(1 for ch in t if ord(ch) >= 0x80)
    assert (ascii, other) == (34, 5)
    estimate = (ascii + 3) // 4 + other
    rems = []
    for k in range(4):
        role = ('data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":%d,'
                '"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"finish_reason":null}]}\n\n' % (k, 1700000000 + k))
        mock.script({"raw": [role] + [_text_chunk(k, t) for t, _ in _STREAM_TEXTS]
                     + ["data: [DONE]\n\n"]})
        r, evs = _stream(s, alice, chat_body(PROMPT, stream=True, max_tokens=100))
        assert r.status == 200 and len(evs) == len(_STREAM_TEXTS) + 2, evs
        rems.append(_remaining(r))
    _, prompt_est = _reservation(rems[0], 100)
    used = prompt_est + estimate
    for a, b in zip(rems, rems[1:]):
        assert used - 1 <= a - b <= used, (rems, used, prompt_est)


def test_events_a_filter_replaced_still_reach_the_budget(sluice_factory, mock, tmp_path):
    """The hook chain hands an event a hook before replaced on to the hooks
    after it (gw_hooks_event_rest): the filters' masked events are counted
    by the rate-limit hook after them. A chain that stopped at the first
    replacing hook would settle on the unmasked events' text only."""
    wf = ph.word_file(tmp_path / "w.txt", ["badword"])
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096},
                    extra={"filters": {"words": [{"file": wf, "action": "mask"}], "mask": "[x]",
                                       "output": True}})
    alice = ph.mint("alice")
    text = "calm badword sea, badword again, and then badword the end of it"
    mock.set_default({"usage": False, "text": text, "events": 6})
    body = chat_body(PROMPT, stream=True, max_tokens=100)
    rems, seen = [], []
    for _ in range(3):
        r, evs = _stream(s, alice, body)
        assert r.status == 200
        seen.append(_content(evs))
        rems.append(_remaining(r))
    assert "badword" not in seen[0] and seen[0].count("[x]") == 3, seen[0]
    assert seen[0] == seen[1] == seen[2]
    _, prompt_est = _reservation(rems[0], 100)
    used = prompt_est + math.ceil(len(seen[0].encode()) / 4)  # the masked text, as sent
    for a, b in zip(rems, rems[1:]):
        assert used - 1 <= a - b <= used, (rems, used, prompt_est)


def test_plain_answer_without_usage_keeps_the_reservation(sluice_factory, mock):
    s, alice = _budget_setup(sluice_factory, mock)
    mock.set_default({"usage": False})
    body = chat_body(PROMPT, max_tokens=100)
    rems = [_remaining(ph.as_user(s, alice, body)) for _ in range(3)]
    res, _ = _reservation(rems[0], 100)
    for a, b in zip(rems, rems[1:]):
        assert res - 1 <= a - b <= res, (rems, res)


def test_reused_request_state_carries_nothing_over(sluice_factory, mock):
    """A worker keeps the rate-limit states of ended requests for its next
    ones (hook_ratelimit.c): a plain answer without usage after a streamed
    one keeps its own reservation (no stream counter of the last request,
    no usage). One worker, so each request gets the last one's state."""
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096},
                    extra={"workers": 1})
    alice = ph.mint("alice")
    r, evs = _stream(s, alice, chat_body(PROMPT, stream=True, max_tokens=100))
    assert r.status == 200 and _content(evs) == REPLY
    r0 = _remaining(r)  # settles at MOCK_USAGE (the usage chunk sluice asked for)
    mock.set_default({"usage": False})
    body = chat_body(PROMPT, max_tokens=100)
    r1 = _remaining(ph.as_user(s, alice, body))  # keeps its reservation
    r2 = _remaining(ph.as_user(s, alice, body))
    res, _ = _reservation(r0, 100)
    assert MOCK_USAGE - 1 <= r0 - r1 <= MOCK_USAGE, (r0, r1)
    assert res - 1 <= r1 - r2 <= res, (r1, r2, res)
    assert s.alive()


def test_failed_upstream_gives_the_reservation_back(sluice_factory, mock):
    s, alice = _budget_setup(sluice_factory, mock)
    body = chat_body(PROMPT, max_tokens=1000)
    r0 = _remaining(ph.as_user(s, alice, body))  # settles at MOCK_USAGE
    mock.script({"status": 500}, {"status": 503})
    for _ in range(2):
        r = ph.as_user(s, alice, body)
        assert r.status >= 500, r
    r3 = _remaining(ph.as_user(s, alice, body))
    # only the first answer's usage is charged before the last reading
    assert MOCK_USAGE - 2 <= r0 - r3 <= MOCK_USAGE, (r0, r3)


# ---- the usage chunk -------------------------------------------------------------------


def test_injected_usage_chunk_is_not_shown(sluice_factory, mock):
    s, alice = _budget_setup(sluice_factory, mock)
    r, evs = _stream(s, alice, chat_body(PROMPT, stream=True))
    assert r.status == 200
    (q,) = mock.requests()
    assert q["json"]["stream_options"] == {"include_usage": True}  # sluice asked for it
    chunks = [e.json() for e in evs if not e.is_done]
    assert evs[-1].is_done
    assert all(c["choices"] for c in chunks), "a usage-only chunk reached the client"
    assert not any("usage" in c for c in chunks)
    assert _content(evs) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"


def test_usage_chunk_shown_when_the_client_asked(sluice_factory, mock):
    s, alice = _budget_setup(sluice_factory, mock)
    r, evs = _stream(s, alice, chat_body(PROMPT, stream=True, stream_options={"include_usage": True}))
    assert r.status == 200 and evs[-1].is_done
    chunks = [e.json() for e in evs if not e.is_done]
    usage = [c for c in chunks if not c["choices"]]
    assert len(usage) == 1 and chunks[-1] is usage[0], [json.dumps(c)[:80] for c in chunks]
    assert usage[0]["usage"]["total_tokens"] == MOCK_USAGE
    assert _content(evs) == REPLY


# ---- the answer's usage, read without a tree -------------------------------------------

_ODD_ANSWERS = [
    # (answer bytes, tokens settled: an int, or "res" for the reservation kept)
    ('{"usage":{"prompt_tokens":3,"completion_tokens":5,"prompt_tokens":9}}', 14),
    ('{"choices":[{"usage":{"completion_tokens":50}}],'
     '"usage":{"completion_tokens":7,"total_tokens":20}}', 20),
    ('{"usage":{"input_tokens":4,"output_tokens":6}}', 10),
    ('{"usage":{"prompt_tokens":-4,"completion_tokens":6}}', 6),
    ('{"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":-1}}', 0),
    ('{"usage":{"prompt_tokens":4,"completion_tokens":6.0}}', "res"),
    ('{"usage":{"completion_tokens":8},"usage":null}', "res"),
    ('{"usage":null,"usage":{"prompt_tokens":1,"completion_tokens":8}}', 9),
    ('{"c":"\\u0000","usage":{"prompt_tokens":1,"completion_tokens":8}}', "res"),
    ('{"c":"\\ud83d\\ude00","usage":{"prompt_tokens":2,"completion_tokens":8}}', 10),
    ('{"c":"\\ud83d","usage":{"prompt_tokens":2,"completion_tokens":8}}', "res"),
    ('{"usage":{"prompt_tokens":2,"completion_tokens":8}} trailing', "res"),
    ('{"c":"\xc0\xaf","usage":{"prompt_tokens":2,"completion_tokens":8}}', "res"),
    ('{"c":"\xc3\xa9","usage":{"prompt_tokens":2,"completion_tokens":8}}', 10),
    ('not json at all', "res"),
]


@pytest.mark.parametrize("answer,used", _ODD_ANSWERS,
                         ids=["dup_key", "nested", "responses_names", "negative", "neg_total",
                              "real", "usage_null_last", "usage_null_first", "nul_escape",
                              "surrogate_pair", "lone_surrogate", "trailing", "overlong_utf8",
                              "utf8", "not_json"])
def test_odd_answer_settles_as_the_tree_reads_it(sluice_factory, mock, answer, used):
    """A non-streamed answer's usage is read from its bytes (rl_usage_from_json):
    the tokens settled are what jansson's tree of the answer says (duplicate
    keys: the last; a nested usage: not the answer's; the Responses names;
    negatives as 0; bytes jansson refuses: no usage, the reservation kept),
    read back from the next request's Remaining. The answers are bytes
    (latin-1 strings: bytes C0 AF are an overlong '/', jansson refuses it)."""
    s, alice = _budget_setup(sluice_factory, mock)
    raw = answer.encode("latin-1")
    mock.script({"raw_response": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(raw)
                                 + answer})
    body = chat_body(PROMPT, max_tokens=100)
    r = ph.as_user(s, alice, body)
    assert r.status == 200 and r.body == raw, r  # relayed as it came
    r0 = _remaining(r)
    r1 = _remaining(ph.as_user(s, alice, body))
    res, _ = _reservation(r0, 100)
    want = res if used == "res" else used
    assert want - 1 <= r0 - r1 <= want, (r0, r1, want, res)
