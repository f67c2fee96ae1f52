"""
test_chaos_stream.py — upstreams that break and clients that leave, with the
whole chain on (issue 6, chaos tests and tier 7 "after the first byte"):

- a stream cut mid-way, a stream without [DONE], an upstream that drops the
  connection mid-stream or hangs after its headers: never retried (the mock
  sees one request), the client gets an SSE error event and no [DONE], and
  the failure is counted;
- a hang or a reset before the first byte: retried, then the template;
- a client that disconnects during a retry's backoff or while the local
  tier is answering: the retry never goes out, the local attempt is cut;
- after each: sluice holds no client connection or stream, and every
  upstream connection is closed (keepalive: 0, so none may linger).
"""

import json
import time

import fallback_helpers as fh
import helpers
from helpers import bound, mock_upstream

NO_KEEPALIVE = {"upstreams": {"main": {"keepalive": 0}}}


def chain_on(retry=None, **more):
    retry = retry or {"attempts": 3, "backoff": "10ms", "budget_percent": 100}
    return fh.merge(fh.chain(retry=retry, **more), NO_KEEPALIVE)


def stays(pred, seconds, what):
    """pred() holds for the whole span (a bounded negative check: that
    something does NOT happen cannot be waited for)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert pred(), what
        time.sleep(0.05)


def contents(evs):
    out = ""
    for e in evs:
        if e.data and e.data != "[DONE]" and "choices" in e.json():
            ch = e.json()["choices"]
            out += (ch[0]["delta"].get("content") or "") if ch else ""
    return out


def assert_error_end(r, evs, code="upstream_truncated"):
    """200 head already sent; the stream ends with one OpenAI error event,
    no [DONE], and a clean terminating chunk."""
    assert r.status == 200 and r.header("X-Sluice-Fallback") is None, r
    assert not any(e.is_done for e in evs), evs
    err = evs[-1].json()
    assert set(err) == {"error"} and err["error"]["code"] == code, err
    assert err["error"]["type"] == "server_error"
    assert r.complete, "the chunked body must still end properly"
    return err


def test_cut_mid_stream_is_not_retried(sluice_factory, mock):
    s = sluice_factory(overrides=chain_on(), upstream=mock)
    prompt = "cut me"
    pieces = mock_upstream.split_text(mock_upstream.reply_text(prompt, 6), 6)
    cases = [
        {"events": 6, "cut_after": 2},
        {"events": 6, "cut_after": 3, "cut_partial": True},  # half an event never reaches the client
        {"events": 6, "cut_after": 2, "cut_rst": True},
        {"events": 6, "no_done": True, "no_finish": True},  # a clean end, no [DONE], no finish_reason
    ]
    for i, beh in enumerate(cases):
        m0 = fh.Metrics(s)
        mock.reset()
        mock.script(beh)
        r, evs = fh.stream(s, helpers.chat_body(prompt, stream=True))
        assert_error_end(r, evs)
        sent = beh.get("cut_after", 6)  # no_done: 6 contents, no finish chunk
        assert contents(evs) == "".join(pieces[:min(sent, 6)]), (beh, contents(evs))
        assert len(evs) == min(sent, 7) + 1, (beh, evs)
        assert len(mock.requests()) == 1, beh
        assert m0.delta("sluice_upstream_errors_total", upstream="main", kind="truncated") == 1, beh
        assert m0.delta("sluice_retries_total", upstream="main") == 0
        assert m0.delta("sluice_fallback_total", tier="template") == 0
    log = [e for e in s.access_log() if e.get("route") == "chat_completions"]
    assert len(log) == 4 and all(e.get("status") == 200 for e in log), log
    fh.assert_nothing_left(s, [mock])


def test_upstream_drops_mid_stream(sluice_factory, mock):
    s = sluice_factory(overrides=chain_on(), upstream=mock)
    mock.script({"gate": True, "events": 5})
    with s.client() as c:
        r, it = c.stream("POST", fh.CHAT, helpers.chat_body("drop", stream=True))
        first = next(it)
        assert first.json()["choices"][0]["delta"]["role"] == "assistant"
        assert mock.drop() == 1
        evs = [first] + list(it)
    assert_error_end(r, evs)
    assert len(mock.requests()) == 1
    fh.assert_nothing_left(s, [mock])


def test_hang_after_headers_ends_in_a_timeout_event(sluice_factory, mock):
    over = fh.merge(chain_on(), {"upstreams": {"main": {"timeouts": {"connect": "500ms", "first_byte": "500ms", "total": "600ms"}}}})
    s = sluice_factory(overrides=over, upstream=mock)
    mock.script({"stall_after_headers": True})
    t0 = time.monotonic()
    r, evs = fh.stream(s, helpers.chat_body("hang", stream=True))
    dt = time.monotonic() - t0
    assert_error_end(r, evs, code="upstream_timeout")
    assert 0.55 <= dt < bound(2), dt
    (q,) = mock.requests()
    mock.wait_request_state(q["id"], lambda x: x["outcome"] == "peer_closed")
    assert fh.metric(s, "sluice_upstream_errors_total", upstream="main", kind="total_timeout") == 1
    fh.assert_nothing_left(s, [mock])


def test_hang_before_first_byte_retried_then_template(sluice_factory, mock):
    over = fh.merge(chain_on(retry={"attempts": 1, "backoff": "10ms"}),
                    {"upstreams": {"main": {"timeouts": {"first_byte": "300ms"}}}})
    s = sluice_factory(overrides=over, upstream=mock)
    mock.set_default({"stall_first_byte": True})
    for stream in (False, True):
        mock.reset()
        mock.set_default({"stall_first_byte": True})
        t0 = time.monotonic()
        if stream:
            r, evs = fh.stream(s, helpers.chat_body("hang", stream=True))
            fh.assert_template_events(r, evs)
        else:
            fh.assert_template_json(s.chat("hang"))
        dt = time.monotonic() - t0
        assert 0.6 <= dt < bound(1.5), dt
        reqs = mock.requests()
        assert len(reqs) == 2 and reqs[0]["body"] == reqs[1]["body"]
        for q in reqs:
            mock.wait_request_state(q["id"], lambda x: x["outcome"] == "peer_closed")
    assert fh.metric(s, "sluice_upstream_errors_total", upstream="main", kind="first_byte_timeout") == 4
    fh.assert_nothing_left(s, [mock])


def test_reset_before_first_byte_is_retried(sluice_factory, mock):
    s = sluice_factory(overrides=chain_on(), upstream=mock)
    for beh in ({"raw_response": ""}, {"raw_response": "", "cut_rst": True}):
        mock.reset()
        mock.script(beh)
        r = s.chat("reset")
        assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == mock_upstream.reply_text("reset")
        reqs = mock.requests()
        assert len(reqs) == 2 and reqs[0]["body"] == reqs[1]["body"], beh
    assert fh.metric(s, "sluice_upstream_errors_total", upstream="main", kind="reset") == 2
    assert fh.metric(s, "sluice_retries_total", upstream="main") == 2
    fh.assert_nothing_left(s, [mock])


def test_non_stream_cut_mid_body_is_retried(sluice_factory, mock):
    """A non-streamed answer is held until whole (issue 15.1): one cut after
    its head reached nobody, so it is retried and the client gets the whole
    answer of the second attempt, never a 200 with half a body."""
    s = sluice_factory(overrides=chain_on(), upstream=mock)
    mock.script({"cut_after": 1})
    with s.client() as c:
        c.send_request("POST", fh.CHAT, helpers.chat_body("half a body"))
        r = c.read_head()
        assert r.status == 200
        body = b"".join(c.iter_body(r))
        assert r.complete
        assert json.loads(body)["choices"][0]["message"]["content"] == mock_upstream.reply_text(
            "half a body")
    reqs = mock.requests()
    assert len(reqs) == 2 and reqs[0]["body"] == reqs[1]["body"]
    fh.assert_nothing_left(s, [mock])


def test_client_gone_during_retry_backoff(sluice_factory, mock):
    """The retry waits 0.5..1 s; the client leaves before: it never goes out."""
    s = sluice_factory(overrides=chain_on(retry={"attempts": 1, "backoff": "1s", "backoff_max": "2s"}),
                       upstream=mock)
    mock.script({"status": 503})
    c = s.client()
    c.send_request("POST", fh.CHAT, helpers.chat_body("leaving"))
    (q,) = mock.wait_requests(1)
    mock.wait_request_state(q["id"], lambda x: x["outcome"] == "complete")
    c.abort()
    fh.assert_nothing_left(s, [mock])
    stays(lambda: len(mock.requests()) == 1, 1.5, "the retry went out for a client that had left")
    assert s.alive()
    # and sluice still serves
    assert s.chat("still here").status == 200


def test_client_gone_during_local_attempt(sluice_factory, mock_factory):
    a = mock_factory(name="main")
    b = mock_factory(name="local")
    a.set_default({"status": 503})
    over = fh.merge(chain_on(retry={"attempts": 0}, local="local"),
                    fh.second_upstream("local", b, keepalive=0))
    s = sluice_factory(overrides=over, upstream=a)
    for beh in ({"stall_first_byte": True}, {"gate": True, "events": 4}):
        a.reset()
        b.reset()
        a.set_default({"status": 503})
        b.script(beh)
        c = s.client()
        c.send_request("POST", fh.CHAT, helpers.chat_body("local then gone", stream=True))
        if "gate" in beh:
            r = c.read_head()
            assert r.header("X-Sluice-Fallback") == "local"
            b.wait_request_state(b.wait_requests(1)[0]["id"], lambda x: x["events_sent"] == 1)
        (q,) = b.wait_requests(1)
        c.abort()
        b.wait_request_state(q["id"], lambda x: x["outcome"] == "peer_closed",
                             what="the local attempt cut when the client left")
        fh.assert_nothing_left(s, [a, b])
    assert len(a.requests()) == 1
    assert s.alive()
