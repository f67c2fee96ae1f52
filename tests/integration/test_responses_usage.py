"""
test_responses_usage.py — token accounting for the Responses API (POST
/v1/responses; sluice relays it, docs/gateway.md "The Responses API"):

- token budgets: the reservation is the prompt estimate (instructions and
  input: a string, or items with input_text parts) + max_output_tokens, so a
  huge input is refused by a small budget like a chat prompt is; a JSON
  answer settles with its usage (input/output/total_tokens), a stream with
  response.completed's response.usage, and a stream cut before it with the
  estimate (prompt + the deltas' text), as chat's;
- sluice_tokens_total and the access log's prompt_tokens /
  completion_tokens count a Responses answer's usage (input -> prompt,
  output -> completion), stream and not; TTFT and the inter-token gaps of a
  stream are taken at its output_text.delta events, not at the done events
  that repeat the text.

Budgets are read as test_ratelimit_tokens.py reads them: through a per-day
budget's X-RateLimit-Remaining on each answer (100000 a day refills one
token every 0.864 s, so readings a moment apart differ by what was charged).
"""

import json
import math

import pytest

import helpers
import policy_helpers as ph
from helpers import bound, mock_upstream, wait_until

DAY = 100000
PATH = "/v1/responses"
MODEL = "chat-model"
PROMPT = "one two three"
REPLY = mock_upstream.reply_text(PROMPT, 4)  # "echo: one two three"
MOCK_USAGE = len(PROMPT.split()) + 4  # the mock's total_tokens: input words + events


def body(inp=PROMPT, stream=False, **kw):
    b = {"model": MODEL, "input": inp, "max_output_tokens": 100}
    if stream:
        b["stream"] = True
    b.update(kw)
    return b


def est(text):
    """rl_estimate_text_tokens for ASCII text: 4 bytes a token."""
    return (len(text.encode()) + 3) // 4


def remaining(r):
    lim, left, _ = ph.rl_headers(r)
    assert lim == DAY and left is not None, r.headers
    return left


def post(s, tok, b):
    return s.request("POST", PATH, b, {"Authorization": tok.bearer}, timeout=bound(10))


def stream(s, tok, b):
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", PATH, b, {"Authorization": tok.bearer})
        evs = [e for e in evs if e.data is not None]
    return r, evs


def deltas(evs):
    return "".join(e.json().get("delta", "") for e in evs
                   if e.json().get("type") == "response.output_text.delta")


def budget(sluice_factory, mock, **extra):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_day": DAY}, "max_tokens": 4096},
                    extra=extra or None)
    return s, ph.mint("alice")


# ---- budgets ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["string", "items"])
def test_reservation_counts_the_input(sluice_factory, mock, shape):
    """The first answer's Remaining is DAY - (prompt estimate + 100): the
    input and instructions are in it (main: 100 alone). With usage false the
    JSON answer keeps its reservation, so the next reading shows it whole."""
    s, alice = budget(sluice_factory, mock)
    mock.set_default({"usage": False})
    words = " ".join("w%03d" % i for i in range(200))  # 999 bytes
    instr = "You are terse."
    if shape == "string":
        inp, want = words, 3 + est(instr) + 4 + est(words)
    else:
        inp = [{"role": "user", "content": [{"type": "input_text", "text": words},
                                            {"type": "input_text", "text": "and more"}]},
               {"role": "user", "content": "again"}]
        want = 3 + est(instr) + 4 + est(words) + est("and more") + 4 + est("again")
    b = body(inp, instructions=instr)
    r0 = remaining(post(s, alice, b))
    r1 = remaining(post(s, alice, b))
    assert DAY - r0 == want + 100, (r0, want)
    assert want + 100 - 1 <= r0 - r1 <= want + 100, (r0, r1, want)


def test_huge_input_is_refused_by_a_small_budget(sluice_factory, mock):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"tokens_per_minute": 1000},
                                           "max_tokens": 4096})
    alice = ph.mint("alice")
    huge = "x" * 6000  # ~1500 tokens: more than the whole budget
    r = post(s, alice, body(huge))
    e = helpers.assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert e["limit"] == "tokens_per_minute"
    ph.assert_upstream_untouched(mock)
    r = post(s, alice, body([{"role": "user", "content": [{"type": "input_text", "text": huge}]}],
                            stream=True))
    helpers.assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    ph.assert_upstream_untouched(mock)
    assert post(s, alice, body("small")).status == 200


@pytest.mark.parametrize("stream_it", [False, True])
def test_settles_with_the_answers_usage(sluice_factory, mock, stream_it):
    s, alice = budget(sluice_factory, mock)
    rems = []
    for _ in range(3):
        if stream_it:
            r, evs = stream(s, alice, body(stream=True))
            assert r.status == 200 and deltas(evs) == REPLY
            assert evs[-1].json()["response"]["usage"]["total_tokens"] == MOCK_USAGE
        else:
            r = post(s, alice, body())
            assert r.status == 200 and r.json()["usage"]["total_tokens"] == MOCK_USAGE
        rems.append(remaining(r))
    assert DAY - rems[0] == 3 + 4 + est(PROMPT) + 100, rems  # prompt estimate + max_output_tokens
    for a, b in zip(rems, rems[1:]):
        assert MOCK_USAGE - 1 <= a - b <= MOCK_USAGE, (rems, MOCK_USAGE)


@pytest.mark.parametrize("stream_it", [False, True])
def test_usage_without_total_is_input_plus_output(sluice_factory, mock, stream_it):
    s, alice = budget(sluice_factory, mock)
    mock.set_default({"usage": {"input_tokens": 30, "output_tokens": 12}})
    rems = []
    for _ in range(3):
        r = stream(s, alice, body(stream=True))[0] if stream_it else post(s, alice, body())
        assert r.status == 200
        rems.append(remaining(r))
    for a, b in zip(rems, rems[1:]):
        assert 42 - 1 <= a - b <= 42, rems


def test_cut_stream_settles_on_the_text(sluice_factory, mock):
    """Cut after the created, item-added and 4 delta events: no
    response.completed, so prompt estimate + the deltas' text (main: the
    whole reservation, prompt 0 + 100)."""
    s, alice = budget(sluice_factory, mock)
    text = "a long answer of many words " * 10  # 280 bytes: 70 tokens
    mock.set_default({"text": text, "events": 4, "cut_after": 6})
    b = body(stream=True)
    rems = []
    for _ in range(3):
        r, evs = stream(s, alice, b)
        assert r.status == 200 and deltas(evs) == text
        assert not any(e.json().get("type") == "response.completed" for e in evs)
        rems.append(remaining(r))
    prompt_est = DAY - rems[0] - 100
    assert prompt_est == 3 + 4 + est(PROMPT), rems[0]
    used = prompt_est + math.ceil(len(text) / 4)
    for a, b_ in zip(rems, rems[1:]):
        assert used - 1 <= a - b_ <= used, (rems, used)


def test_filtered_stream_still_settles_with_the_usage(sluice_factory, mock, tmp_path):
    """The filters rewrite response.completed (its text); the budget hook
    after them still reads its usage."""
    wf = ph.word_file(tmp_path / "w.txt", ["badword"])
    s, alice = budget(sluice_factory, mock,
                      filters={"words": [{"file": wf, "action": "mask"}], "mask": "[x]",
                               "output": True})
    mock.set_default({"text": "calm badword sea", "events": 3})
    rems = []
    for _ in range(3):
        r, evs = stream(s, alice, body(stream=True))
        assert r.status == 200 and "badword" not in deltas(evs)
        rems.append(remaining(r))
    used = len(PROMPT.split()) + 3
    for a, b in zip(rems, rems[1:]):
        assert used - 1 <= a - b <= used, (rems, used)


# ---- metrics and the access log ---------------------------------------------------------


def tokens(s):
    m = s.metrics()
    return (m.value("sluice_tokens_total", model=MODEL, kind="prompt") or 0,
            m.value("sluice_tokens_total", model=MODEL, kind="completion") or 0)


def hist(s, name, **labels):
    m = s.metrics()
    buckets = {l["le"]: v for _, l, v in m.find(name + "_bucket", **labels)}
    return buckets, m.value(name + "_count", **labels) or 0, m.value(name + "_sum", **labels) or 0


def log_lines(s, n):
    return wait_until(lambda: (lambda l: l if len(l) >= n else None)(
        [e for e in s.access_log() if e.get("route") == "responses"]), bound(5),
        what="%d access log lines" % n)


@pytest.mark.timeout(60)
def test_tokens_metrics_and_access_log(sluice, mock):
    mock.script({"usage": {"input_tokens": 31, "output_tokens": 9, "total_tokens": 40,
                           "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens_details": {"reasoning_tokens": 0}}},
                {"usage": {"input_tokens": 17, "output_tokens": 5, "total_tokens": 22}})
    r = sluice.request("POST", PATH, body())
    assert r.status == 200 and r.json()["usage"]["input_tokens"] == 31
    rid = r.json()["id"]
    assert tokens(sluice) == (31, 9)
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", PATH, body(stream=True))
        evs = [e for e in evs if e.data is not None]
    assert r.status == 200 and evs[-1].json()["type"] == "response.completed"
    assert tokens(sluice) == (31 + 17, 9 + 5)
    lines = log_lines(sluice, 2)
    got = sorted((l["stream"], l["prompt_tokens"], l["completion_tokens"]) for l in lines)
    assert got == [(False, 31, 9), (True, 17, 5)], lines
    assert all(l["ttft"] > 0 for l in lines), lines
    # a stored response read back (GET /v1/responses/{id}) carries its usage
    # again: not counted again, no TTFT
    _, ttft_n, _ = hist(sluice, "sluice_time_to_first_token_seconds", model=MODEL, stream="false")
    got = sluice.request("GET", PATH + "/" + rid)
    assert got.status == 200 and got.json()["usage"]["input_tokens"] == 31, got
    assert tokens(sluice) == (31 + 17, 9 + 5)
    assert hist(sluice, "sluice_time_to_first_token_seconds", model=MODEL,
                stream="false")[1] == ttft_n == 1
    lines = log_lines(sluice, 3)
    assert "prompt_tokens" not in lines[2] and "ttft" not in lines[2], lines[2]
    # a stream cut before response.completed reports no usage: nothing added
    mock.script({"cut_after": 4})
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", PATH, body(stream=True))
        list(evs)
    lines = log_lines(sluice, 4)
    assert "prompt_tokens" not in lines[3], lines[3]
    assert tokens(sluice) == (48, 14)


@pytest.mark.timeout(60)
def test_stream_ttft_and_gaps_are_the_deltas(sluice, mock):
    """5 deltas 0.1 s apart, then the done events and response.completed
    (which repeat the text): TTFT once, 4 gaps, none for the done events."""
    mock.script({"events": 5, "delay": 0.1})
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", PATH, body(stream=True))
        evs = [e for e in evs if e.data is not None]
    assert r.status == 200 and len(evs) == 2 + 5 + 3
    _, count, total = hist(sluice, "sluice_time_to_first_token_seconds", model=MODEL,
                           stream="true")
    assert count == 1
    # the first delta is the third event: 2 delays after the head
    assert total >= 2 * 0.1 * 0.9, total
    buckets, gaps, gsum = hist(sluice, "sluice_inter_token_seconds", model=MODEL)
    assert gaps == 4, buckets
    assert gsum >= 4 * 0.1 * 0.9, gsum
    assert buckets["0.05"] == 0, buckets
