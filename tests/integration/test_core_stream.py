"""
test_core_stream.py — SSE relay without buffering (issue 2, part 5): the
client's stream headers, every event passing through unchanged and reaching
the client before the upstream sends the next one (proved with the mock's
gate, not with timing), cancellation of the upstream when the client goes
away, truncation turned into an error event, pings before the first event,
and backpressure toward a client that does not read.
"""

import json
import time

import pytest

import helpers
from helpers import bound, chat_body, mock_upstream, wait_until


def data_events(events):
    return [e for e in events if e.data is not None]


def content_of(events):
    out = ""
    for e in data_events(events):
        if e.is_done:
            continue
        d = e.json()
        for ch in d.get("choices", []):
            out += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
    return out


def upstream_errors(sluice):
    return sluice.metrics().value("sluice_upstream_errors_total", upstream="main")


def test_stream_headers_and_all_events(sluice, mock):
    mock.script({"events": 5})
    with sluice.client() as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("stream me", stream=True))
        assert r.status == 200
        assert (r.header("Content-Type") or "").split(";")[0].strip() == "text/event-stream"
        assert r.header("Cache-Control") == "no-cache"
        assert r.header("X-Accel-Buffering") == "no"
        assert r.chunked and r.header("Content-Length") is None
        events = data_events(list(evs))
        assert r.complete  # the terminating chunk, then the connection goes on
    assert events[-1].is_done
    assert len(events) == 5 + 1 + 1
    assert content_of(events) == mock_upstream.reply_text("stream me", 5)
    chunks = [e.json() for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["stop"]
    (req,) = mock.requests()
    assert req["json"]["model"] == "Qwen2.5-7B-Instruct" and req["json"]["stream"] is True


def test_events_pass_byte_for_byte(sluice, mock):
    raw = [
        'data: {"a": 1}\n\n',
        ": upstream comment\n\n",
        "event: note\ndata: line one\ndata: line two\n\n",
        "id: 42\ndata: {\"b\": [1, 2, 3]}\n\n",
        "data: [DONE]\n\n",
    ]
    mock.script({"raw": raw})
    with sluice.client() as c:
        c.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
        r = c.read_head()
        body = b"".join(c.iter_body(r))
    assert r.status == 200 and r.complete
    assert body == "".join(raw).encode()


# lead: the mock's writes end on an event boundary, or each carries an event
# and the first 12 bytes of the next (gate_lead), whose rest waits for the
# release: sluice relays the complete event while its splitter holds part of
# the next one.
@pytest.mark.parametrize("lead", [0, 12], ids=["whole", "next_begun"])
def test_each_event_reaches_client_before_the_next_is_sent(sluice, mock, lead):
    mock.script({"gate": True, "events": 3, "gate_lead": lead})
    total = 3 + 1 + 1  # content events, the finish event, [DONE]
    with sluice.client(timeout=bound(5)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("gated", stream=True))
        assert r.status == 200
        evs = (e for e in evs if e.data is not None)
        got = [next(evs)]  # the mock sends event 1, then waits for a release
        (req,) = mock.requests()
        assert req["events_sent"] == 1
        # sluice asks the upstream for usage (rate limits) and drops that
        # usage-only chunk, which the client did not ask for: one more release
        usage = json.loads(req["body"]).get("stream_options", {}).get("include_usage")
        sent = 1
        for i in range(1, total):
            assert mock.requests()[0]["events_sent"] == sent  # the next is not sent yet
            assert mock.release(request=req["id"]) == 1
            sent += 1
            if usage and sent == total:  # the usage chunk went out; sluice dropped it
                assert mock.release(request=req["id"]) == 1
                sent += 1
            got.append(next(evs))
        assert got[-1].is_done
        assert list(evs) == []
    assert content_of(got) == mock_upstream.reply_text("gated", 3)


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("where", ["mid_stream", "before_first_byte", "after_headers", "non_stream"])
def test_client_disconnect_cancels_upstream_within_1s(sluice, mock, how, where):
    beh = {
        "mid_stream": {"gate": True},
        "before_first_byte": {"stall_first_byte": True},
        "after_headers": {"stall_after_headers": True},
        "non_stream": {"stall_first_byte": True},
    }[where]
    mock.script(beh)
    c = sluice.client()
    c.send_request("POST", "/v1/chat/completions", chat_body(stream=(where != "non_stream")))
    if where == "mid_stream":
        r = c.read_head()
        next(e for e in c.events(r) if e.data is not None)
    else:
        mock.wait_requests(1)
        if where == "after_headers":
            r = c.read_head()
            assert r.status == 200
    (req,) = mock.requests()
    t_gone = time.monotonic()
    c.abort() if how == "reset" else c.close()
    conn = wait_until(
        lambda: next((x for x in mock.connections() if x["id"] == req["conn"] and x["closed"]), None),
        timeout=bound(3),
        what="the upstream connection to close",
    )
    assert conn["closed"] - t_gone < 1.0 * helpers.TIME_SCALE, "upstream closed %.2fs after the client" % (
        conn["closed"] - t_gone
    )
    assert mock.requests()[0]["outcome"] == "peer_closed"
    assert sluice.request("GET", "/healthz").status == 200


@pytest.mark.parametrize(
    "beh,sent",
    [
        ({"cut_after": 2}, 2),
        ({"cut_after": 0}, 0),
        ({"cut_after": 3, "cut_partial": True}, 3),
        ({"cut_after": 2, "cut_rst": True}, None),
        ({"no_done": True, "no_finish": True}, 4),  # a finished choice and no [DONE]: test_clients_stream
    ],
    ids=["cut", "cut_at_once", "cut_mid_event", "reset", "no_done"],
)
def test_truncated_stream_ends_with_error_event(sluice, mock, beh, sent):
    before = upstream_errors(sluice)
    mock.script(beh)
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("cut me", stream=True))
        if r.status != 200:
            # Nothing was relayed yet when the upstream went away (the head and
            # the close came together): then a plain 502 is the honest answer.
            assert sent in (0, None), r
            r.body = b"".join(c.iter_body(r))
            helpers.assert_error(r, 502, "upstream_error")
            wait_until(lambda: upstream_errors(sluice) >= before + 1, bound(3), what="upstream error counted")
            return
        events = data_events(list(evs))
    assert events, "no error event at all"
    assert not any(e.is_done for e in events), "a [DONE] after a truncated stream"
    last = events[-1].json()
    assert isinstance(last.get("error"), dict), events[-1]
    assert last["error"]["code"] == "upstream_truncated"
    assert isinstance(last["error"].get("message"), str) and last["error"]["message"]
    relayed = events[:-1]
    if sent is not None:
        assert len(relayed) == sent  # every complete event before the cut was relayed
    want = mock_upstream.reply_text("cut me", 4)
    assert want.startswith(content_of(relayed))
    wait_until(lambda: upstream_errors(sluice) >= before + 1, bound(3), what="upstream error counted")
    # and sluice goes on serving
    assert sluice.chat().status == 200


def test_pings_before_first_event(sluice_factory, mock):
    s = sluice_factory({"sse": {"ping_interval": "200ms"}})
    # The mock holds event 1 until the client has had 3 pings (gate_head),
    # then sends the rest 0.6 s apart: pings while the upstream has sent
    # nothing, none once an event came.
    mock.script({"gate": True, "gate_head": True, "events": 2, "delay": 0.6})
    with s.client(timeout=bound(5)) as c:
        t_send = time.monotonic()
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        assert r.status == 200
        pings = []
        for e in evs:
            assert e.comments == ["ping"] and e.data is None, e
            pings.append(e)
            if len(pings) == 3:
                break
        (req,) = mock.requests()
        assert req["events_sent"] == 0
        assert mock.release(n=100, request=req["id"]) == 1
        rest = list(evs)
    first_data = next(i for i, e in enumerate(rest) if e.data is not None)
    pings += rest[:first_data]
    assert all(e.comments == ["ping"] and e.data is None for e in pings), pings
    # Not too often: sluice pinged only between the request and the first
    # event, on a timer that never fires early nor catches up (EV_PERSIST),
    # so at most that span / 200 ms + 1; load only makes the span longer.
    span = rest[first_data].t - t_send
    assert len(pings) <= span / 0.2 + 1, (len(pings), span, [round(e.t - t_send, 2) for e in pings])
    # after the first event, no more pings (the stream is alive by itself)
    assert all(e.data is not None for e in rest[first_data:]), rest[first_data:]
    assert rest[-1].is_done


def test_no_pings_when_off(sluice_factory, mock):
    s = sluice_factory({"sse": {"ping_interval": 0}})
    mock.script({"stall_after_headers": 0.6})
    with s.client() as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    assert all(e.data is not None for e in events) and events[-1].is_done


@pytest.mark.parametrize(
    "beh",
    [{"eol": "\r\n"}, {"chunk_split": 5}, {"chunk_split": 3, "split_delay": 0.01}, {"coalesce": True}, {"usage": True}],
    ids=["crlf", "split", "split_slow", "coalesced", "usage"],
)
def test_framing_variants_relay_intact(sluice, mock, beh):
    mock.script(dict(beh, events=6))
    # usage reaches the client when it asked for it (sluice strips only the
    # usage it asked the upstream for on its own behalf)
    extra = {"stream_options": {"include_usage": True}} if beh.get("usage") else {}
    with sluice.client() as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("variant", stream=True, **extra))
        events = data_events(list(evs))
    assert r.complete and events[-1].is_done
    assert content_of(events) == mock_upstream.reply_text("variant", 6)
    if beh.get("usage"):
        assert events[-2].json()["usage"]["completion_tokens"] == 6


def test_many_events_in_order(sluice, mock):
    mock.script({"events": 2000})
    with sluice.client() as c:
        events = data_events(list(c.stream("POST", "/v1/chat/completions", chat_body("many", stream=True))[1]))
    assert len(events) == 2002 and events[-1].is_done
    assert content_of(events) == mock_upstream.reply_text("many", 2000)


def test_completions_stream(sluice, mock):
    with sluice.client() as c:
        r, evs = c.stream("POST", "/v1/completions", {"model": "chat-model", "prompt": "p", "stream": True})
        events = data_events(list(evs))
    assert r.header("X-Accel-Buffering") == "no"
    assert events[-1].is_done and content_of(events) == mock_upstream.reply_text("p", 4)


def test_two_streams_do_not_mix(sluice, mock):
    mock.script({"gate": True, "text": "first stream"}, {"gate": True, "text": "second one!!"})
    a, b = sluice.client(), sluice.client()
    try:
        ra, ea = a.stream("POST", "/v1/chat/completions", chat_body("a", stream=True))
        next(ea)
        rb, eb = b.stream("POST", "/v1/chat/completions", chat_body("b", stream=True))
        next(eb)
        reqs = mock.requests()
        ids = {q["json"]["messages"][0]["content"]: q["id"] for q in reqs}
        mock.release(n=100, request=ids["b"])
        rest_b = list(eb)
        mock.release(n=100, request=ids["a"])
        rest_a = list(ea)
    finally:
        a.close()
        b.close()
    assert rest_b[-1].is_done and rest_a[-1].is_done
    # first events were read above; compare the rest of each text
    assert "second one!!".endswith(content_of(rest_b)) and content_of(rest_b)
    assert "first stream".endswith(content_of(rest_a)) and content_of(rest_a)


def test_event_over_max_event_bytes_fails_the_stream(sluice_factory, mock):
    s = sluice_factory({"sse": {"max_event_bytes": "16k"}})
    mock.script({"pad": 40000, "events": 2})
    with s.client() as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        events = data_events(list(evs))
    assert not any(e.is_done for e in events)
    assert events and "error" in events[-1].json()


def _tcp_queues(local_port, remote_port):
    """(send queue, receive queue) in bytes of the loopback TCP socket
    local_port -> remote_port, from /proc/net/tcp (no ss needed)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            lp, rp = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)
            if lp == local_port and rp == remote_port and f[3] == "01":  # established
                tx, rx = f[4].split(":")
                return int(tx, 16), int(rx, 16)
    raise AssertionError("no socket %d -> %d in /proc/net/tcp" % (local_port, remote_port))


BACKPRESSURE_BUFFER = 256 * 1024  # sse.buffer_bytes, set below
UPSTREAM_READ_HWM = 64 * 1024  # gateway/upstream.c: the upstream read watermark


@pytest.mark.timeout(180)
def test_slow_client_backpressure(sluice_factory, mock):
    """A client that stops reading stops the upstream reads: the mock cannot
    send the whole stream, and what sluice itself holds stays within what the
    design promises (sse.buffer_bytes toward the client, plus one upstream
    read past it); when the client reads again, everything arrives."""
    sluice = sluice_factory({"sse": {"buffer_bytes": BACKPRESSURE_BUFFER}})
    n, pad = 900, 64 * 1024  # ~59 MB in all
    mock.script({"events": n, "pad": pad})
    c = sluice.client(timeout=bound(10), rcvbuf=64 * 1024)
    try:
        c.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
        r = c.read_head()
        assert r.status == 200
        # Stop reading. Wait until the upstream side stops making progress.
        samples = []

        def stalled():
            samples.append(mock.requests()[0]["events_sent"])
            return len(samples) >= 5 and samples[-1] == samples[-5]

        wait_until(stalled, bound(30), interval=0.2, what="the upstream to be held back")
        (conn,) = mock.connections()
        sent = mock.requests()[0]["events_sent"]
        assert sent < n, "the whole stream went out while the client read nothing"
        # What sluice read from the upstream, less what it handed to the
        # kernel toward the client (what the client read, what waits in the
        # client's receive queue and in sluice's send queue), is what sluice
        # holds itself. The kernel's own socket buffers (sized by tcp_rmem /
        # tcp_wmem autotuning) are not sluice's to bound, so they are
        # measured and taken out rather than allowed for.
        up_in = sluice.metrics().value("sluice_bytes_total", direction="upstream_in")
        port = c.sock.getsockname()[1]
        sluice_port = c.sock.getpeername()[1]
        _, client_rx = _tcp_queues(port, sluice_port)
        sluice_tx, _ = _tcp_queues(sluice_port, port)
        head_max = 1024  # the response head the client read (read_head)
        held = up_in - (len(c.buf) + client_rx + sluice_tx)
        promise = BACKPRESSURE_BUFFER + UPSTREAM_READ_HWM + 16 * 1024 + head_max
        assert held <= promise, (held, promise, up_in, len(c.buf), client_rx, sluice_tx)
        # And sluice stopped reading with its buffer full (it pauses past
        # the high-water mark), not because the kernel alone held it back.
        assert held >= BACKPRESSURE_BUFFER // 2, (held, up_in, client_rx, sluice_tx)
        events = data_events(list(c.events(r)))
    finally:
        c.close()
    assert len(events) == n + 2 and events[-1].is_done
    assert content_of(events) == mock_upstream.reply_text("hello", n)
