"""
test_mock.py — the test harness tests itself: the mock upstream's behaviours
and records, and the helpers (SSE/chunked parsing, YAML writer, Prometheus
parser, TLS material, redis fixture). None of these need sluice, so they
pass or fail on the harness alone.
"""

import base64
import json
import socket
import struct
import ssl
import subprocess
import time

import pytest

import helpers
from helpers import HTTPClient, chat_body, mock_upstream, raw_exchange


def client(mock, **kw):
    return HTTPClient("127.0.0.1", mock.port, **kw)


def post(mock, path, body, **kw):
    with client(mock) as c:
        return c.request("POST", path, body, **kw)


def content_of(events):
    out = ""
    for e in events:
        if e.data and not e.is_done:
            for ch in e.json()["choices"]:
                out += ch.get("delta", {}).get("content", "") or ch.get("text", "")
    return out


# ---- model routes ----------------------------------------------------------------


def test_chat_non_stream_echoes_model_and_prompt(mock):
    r = post(mock, "/v1/chat/completions", chat_body("what is up", model="Some-Model"))
    assert r.status == 200
    b = r.json()
    assert b["object"] == "chat.completion"
    assert b["model"] == "Some-Model"
    assert b["choices"][0]["message"] == {"role": "assistant", "content": "echo: what is up"}
    assert b["usage"]["prompt_tokens"] == 3
    assert r.header("Content-Length") == str(len(r.body))
    (req,) = mock.requests()
    assert req["json"]["messages"][0]["content"] == "what is up"
    assert req["outcome"] == "complete" and req["status"] == 200


def test_chat_stream_events_and_done(mock):
    mock.script({"events": 6})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("abc def", model="M", stream=True))
        assert r.status == 200 and r.chunked
        assert r.header("Content-Type") == "text/event-stream"
        events = list(evs)
    assert r.complete
    assert events[-1].is_done
    data = [e.json() for e in events[:-1]]
    assert len(data) == 6 + 1  # content events + the finish event
    assert all(d["model"] == "M" and d["object"] == "chat.completion.chunk" for d in data)
    assert data[0]["choices"][0]["delta"]["role"] == "assistant"
    assert data[-1]["choices"][0]["finish_reason"] == "stop"
    assert content_of(events) == mock_upstream.reply_text("abc def", 6)
    assert "usage" not in data[-1]


def test_stream_usage_on_request_and_by_script(mock):
    body = chat_body("x", stream=True, stream_options={"include_usage": True})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", body)
        events = list(evs)
    assert events[-2].json()["usage"]["completion_tokens"] == 4
    assert events[-2].json()["choices"] == []
    mock.script({"usage": False}, {"usage": True})
    with client(mock) as c:
        ev1 = list(c.stream("POST", "/v1/chat/completions", body)[1])
        ev2 = list(c.stream("POST", "/v1/chat/completions", chat_body("x", stream=True))[1])
    assert all("usage" not in e.json() for e in ev1 if not e.is_done)
    assert "usage" in ev2[-2].json()
    r = post(mock, "/v1/chat/completions", chat_body("x"))
    assert "usage" in r.json()
    mock.script({"usage": False})
    assert "usage" not in post(mock, "/v1/chat/completions", chat_body("x")).json()


def test_completions_embeddings_models(mock):
    r = post(mock, "/v1/completions", {"model": "C", "prompt": "say hi"})
    assert r.json()["choices"][0]["text"] == "echo: say hi"
    assert r.json()["model"] == "C"
    with client(mock) as c:
        evs = list(c.stream("POST", "/v1/completions", {"model": "C", "prompt": "p", "stream": True})[1])
    assert evs[-1].is_done
    assert "".join(e.json()["choices"][0]["text"] for e in evs[:-2]) == mock_upstream.reply_text("p", 4)
    e = post(mock, "/v1/embeddings", {"model": "E", "input": ["a", "b"]}).json()
    assert e["model"] == "E" and [d["index"] for d in e["data"]] == [0, 1]
    assert len(e["data"][0]["embedding"]) == 8 and e["data"][0]["embedding"] != e["data"][1]["embedding"]
    e64 = post(mock, "/v1/embeddings", {"model": "E", "input": ["a", "b"], "encoding_format": "base64"}).json()
    raw = base64.b64decode(e64["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == e["data"][0]["embedding"]
    with client(mock) as c:
        m = c.request("GET", "/v1/models").json()
    assert m["object"] == "list" and [x["id"] for x in m["data"]] == ["Qwen2.5-7B-Instruct", "mock-embed"]


def test_unknown_path_and_method(mock):
    with client(mock) as c:
        assert c.request("GET", "/nope").status == 404
        r = c.request("GET", "/v1/chat/completions")
        assert r.status == 405 and r.header("Allow") == "POST"


def test_script_order_then_default(mock):
    mock.script({"status": 503}, {"status": 429, "retry_after": 3}, default={"status": 500})
    got = [post(mock, "/v1/chat/completions", chat_body()).status for _ in range(4)]
    assert got == [503, 429, 500, 500]
    mock.reset()
    assert post(mock, "/v1/chat/completions", chat_body()).status == 200


def test_status_with_retry_after_and_body(mock):
    mock.script({"status": 503, "retry_after": 7, "body": {"error": {"message": "busy", "type": "x", "code": "y"}}})
    r = post(mock, "/v1/chat/completions", chat_body(stream=True))
    assert r.status == 503 and r.header("Retry-After") == "7"
    assert r.json() == {"error": {"message": "busy", "type": "x", "code": "y"}}
    mock.script({"status": 502, "body": "plain text"})
    assert post(mock, "/v1/chat/completions", chat_body()).body == b"plain text"


# ---- stream failures ---------------------------------------------------------------


def test_cut_after_closes_without_terminating_chunk(mock):
    mock.script({"cut_after": 2})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        events = list(evs)
    assert len(events) == 2 and not r.complete and r.closed
    (req,) = mock.requests()
    assert req["outcome"] == "cut" and req["events_sent"] == 2
    (conn,) = mock.connections()
    assert conn["closed_by"] == "mock_cut"


def test_cut_partial_and_rst(mock):
    mock.script({"cut_after": 1, "cut_partial": True})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        events = list(evs)
    assert len(events) == 1 and not r.complete
    assert r.leftover.startswith(b"data: {")  # half an event, never completed
    mock.script({"cut_after": 1, "cut_rst": True})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        list(evs)
    assert not r.complete and r.closed


def test_cut_non_stream(mock):
    mock.script({"cut_after": 0})
    with client(mock) as c:
        c.send_request("POST", "/v1/chat/completions", chat_body())
        r = c.read_head()
        with pytest.raises(helpers.ProtocolError):
            b"".join(c.iter_body(r))


def test_no_done_ends_cleanly(mock):
    mock.script({"no_done": True, "events": 2})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        events = list(evs)
        assert r.complete  # the terminating chunk came
        assert not any(e.is_done for e in events) and len(events) == 3
        # and the connection is still usable (keep-alive)
        assert c.request("POST", "/v1/chat/completions", chat_body()).status == 200
    (conn,) = mock.connections()
    assert conn["requests"] == 2


def test_stall_first_byte_then_answer(mock):
    mock.script({"stall_first_byte": 0.4})
    t0 = time.monotonic()
    r = post(mock, "/v1/chat/completions", chat_body())
    assert r.status == 200 and 0.35 <= time.monotonic() - t0 < helpers.bound(3)


def test_stall_forever_and_peer_close_is_recorded(mock):
    mock.script({"stall_first_byte": True})
    c = client(mock)
    c.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
    mock.wait_requests(1)
    assert c.wait_closed(0.3) is False  # nothing comes
    t_close = time.monotonic()
    c.close()
    (conn,) = helpers.wait_until(
        lambda: [x for x in mock.connections() if x["closed"] is not None], what="mock sees close"
    )
    assert conn["closed_by"] == "peer" and conn["peer_eof"] - t_close < 1.0
    (req,) = mock.requests()
    assert req["outcome"] == "peer_closed" and req["events_sent"] == 0


def test_stall_after_headers(mock):
    mock.script({"stall_after_headers": 0.3, "events": 1})
    with client(mock) as c:
        t0 = time.monotonic()
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        t_head = time.monotonic()
        first = next(evs)
    assert r.status == 200 and first.t - t0 >= 0.28
    assert first.t - t_head >= 0.2  # the head came well before the event


def test_gate_holds_each_event_until_release(mock):
    mock.script({"gate": True, "events": 2})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        e1 = next(evs)
        (req,) = mock.requests()
        assert req["events_sent"] == 1 and req["outcome"] == "in_progress"
        assert c.wait_closed(0.2) is False and c.buf == b""  # nothing more comes
        total = 2 + 1 + 1  # content, finish, [DONE]
        got = [e1]
        for i in range(1, total):
            assert mock.release(request=req["id"]) == 1
            got.append(next(evs))
            assert mock.requests()[0]["events_sent"] == i + 1
        assert got[-1].is_done
        assert list(evs) == [] and r.complete


def test_gate_lead_sends_the_next_events_head_with_each_event(mock):
    """gate_lead: each HTTP chunk is an event and the first 12 bytes of the
    next (so one upstream read ends mid-event); the rest comes after the
    release."""
    mock.script({"gate": True, "events": 2, "gate_lead": 12})
    body = json.dumps(chat_body(stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", mock.port), timeout=helpers.bound(5))
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    buf = b""

    def need(pred):
        nonlocal buf
        while not pred():
            data = s.recv(65536)
            assert data, buf
            buf += data

    def chunk():  # one HTTP chunk's data
        nonlocal buf
        need(lambda: b"\r\n" in buf)
        line, _, _ = buf.partition(b"\r\n")
        size, start = int(line, 16), len(line) + 2
        need(lambda: len(buf) >= start + size + 2)
        data, buf = buf[start : start + size], buf[start + size + 2 :]
        return data

    try:
        need(lambda: b"\r\n\r\n" in buf)
        buf = buf.split(b"\r\n\r\n", 1)[1]
        first = chunk()
        event1, sep, head = first.partition(b"\n\n")
        assert event1.startswith(b"data: ") and sep and head == b"data: {\"id\":", first
        (req,) = mock.requests()
        assert req["events_sent"] == 1
        assert mock.release(request=req["id"]) == 1
        second = chunk()  # the rest of event 2, the head of event 3
        event2, sep, head = (b"data: {\"id\":" + second).partition(b"\n\n")
        assert json.loads(event2[6:]) and sep and len(head) == 12, second
        assert mock.requests()[0]["events_sent"] == 2
    finally:
        mock.release(n=100)
        s.close()


def test_gate_head_holds_the_first_event_too(mock):
    mock.script({"gate": True, "gate_head": True, "events": 1})
    with client(mock) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        (req,) = mock.requests()
        assert r.status == 200 and req["events_sent"] == 0
        assert c.wait_closed(0.2) is False and c.buf == b""  # nothing comes
        assert mock.release(n=100, request=req["id"]) == 1  # the gate exists once the head is out
        events = list(evs)
    assert events[-1].is_done and mock.requests()[0]["events_sent"] == len(events) == 1 + 1 + 1


def test_release_before_gate_is_kept_as_credit(mock):
    mock.release(n=10)
    mock.script({"gate": True})
    with client(mock) as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    assert events[-1].is_done


def test_delay_between_events(mock):
    mock.script({"events": 3, "delay": 0.15})
    with client(mock) as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    assert events[-1].is_done
    # the mock's own send times (monotonic, recorded as each event is written):
    # what the client sees can bunch up when it is descheduled on a loaded machine
    (req,) = mock.requests()
    t = req["event_times"]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert len(t) == req["events_sent"] == 5 and min(gaps) >= 0.14, gaps


def test_split_coalesce_raw_eol_pad(mock):
    mock.script(
        {"chunk_split": 7},
        {"coalesce": True},
        {"raw": ["data: one\n\n", ": note\n\n", "event: x\ndata: a\ndata: b\n\n"]},
        {"eol": "\r\n"},
        {"pad": 1000, "events": 1},
    )
    for _ in range(2):
        with client(mock) as c:
            events = list(c.stream("POST", "/v1/chat/completions", chat_body("q", stream=True))[1])
        assert content_of(events) == mock_upstream.reply_text("q", 4) and events[-1].is_done
    with client(mock) as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    assert [e.data for e in events] == ["one", None, "a\nb"]
    assert events[1].comments == ["note"] and events[2].event == "x"
    with client(mock) as c:
        c.send_request("POST", "/v1/chat/completions", chat_body("q", stream=True))
        r = c.read_head()
        body = b"".join(c.iter_body(r))
    assert body.count(b"\r\n\r\n") == 6 and b"\n\n" not in body.replace(b"\r\n\r\n", b"")
    assert content_of(helpers.SSEParser().feed(body)) == mock_upstream.reply_text("q", 4)
    with client(mock) as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    assert len(events[0].json()["mock_pad"]) == 1000


def test_raw_response(mock):
    mock.script({"raw_response": "HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nhi"})
    res = raw_exchange("127.0.0.1", mock.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nContent-Length: 2\r\n\r\n{}")
    assert res.closed and res.data == b"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nhi"
    assert mock.requests()[0]["outcome"] == "cut"


def test_close_behaviour(mock):
    mock.script({"close": True})
    with client(mock) as c:
        r = c.request("POST", "/v1/chat/completions", chat_body())
        assert r.header("Connection") == "close" and r.closed


# ---- records ---------------------------------------------------------------------


def test_keepalive_records_connections_and_headers(mock):
    with client(mock) as c:
        for i in range(3):
            r = c.request("POST", "/v1/chat/completions", chat_body("n%d" % i), headers=[("X-Case", "KeepMe"), ("authorization", "Bearer z")])
            assert r.status == 200
    reqs = mock.requests()
    assert [r["json"]["messages"][0]["content"] for r in reqs] == ["n0", "n1", "n2"]
    assert len({r["conn"] for r in reqs}) == 1
    assert ["X-Case", "KeepMe"] in reqs[0]["headers"]
    assert helpers.header_values(reqs[0]["headers"], "Authorization") == ["Bearer z"]
    conns = mock.connections()
    assert len(conns) == 1 and conns[0]["requests"] == 3
    assert conns[0]["bytes_in"] > 3 * 100 and conns[0]["bytes_out"] > 0
    assert len(mock.connections(all=True)) > 1  # the control connections, hidden by default
    assert all(r["t"] <= r["t_end"] for r in reqs)


def test_chunked_request_body_and_expect(mock):
    body = json.dumps(chat_body("chunky")).encode()
    raw = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        + b"%x\r\n%s\r\n" % (5, body[:5]) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - 5, body[5:])
    )
    res = raw_exchange("127.0.0.1", mock.port, raw)
    assert res.data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    r = helpers.parse_response_bytes(res.data[len(b"HTTP/1.1 100 Continue\r\n\r\n"):])
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: chunky"
    assert res.closed


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\n{}\r\n0\r\n\r\n",
    ],
    ids=["cl_te", "two_cl", "no_host", "obs_fold", "bare_lf", "bad_chunk"],
)
def test_mock_is_strict_and_records_protocol_errors(mock, raw):
    mock.allow_protocol_errors = True
    res = raw_exchange("127.0.0.1", mock.port, raw)
    assert res.closed and res.response().status == 400
    (err,) = mock.protocol_errors()
    assert err["error"]


def test_reset_clears(mock):
    post(mock, "/v1/chat/completions", chat_body())
    mock.script({"status": 500})
    mock.reset()
    assert mock.requests() == [] and mock.connections() == []
    assert post(mock, "/v1/chat/completions", chat_body()).status == 200


def test_drop_closes_idle_connections(mock):
    with client(mock) as c:
        assert c.request("POST", "/v1/chat/completions", chat_body()).status == 200
        assert mock.drop() == 1
        assert c.wait_closed(2)


def test_mock_tls_and_sni(mock_factory, tls_files):
    m = mock_factory(tls=tls_files.server)
    ctx = helpers.client_tls(tls_files.ca_cert)
    with HTTPClient("127.0.0.1", m.port, tls=ctx, server_hostname="localhost") as c:
        assert c.request("POST", "/v1/chat/completions", chat_body("tls")).json()["choices"][0]["message"]["content"] == "echo: tls"
    (conn,) = m.connections()
    assert conn["tls"] and conn["sni"] == "localhost"
    # A client trusting another CA fails the handshake; the mock records it.
    with pytest.raises(ssl.SSLError):
        HTTPClient("127.0.0.1", m.port, tls=helpers.client_tls(tls_files.other_ca_cert))
    helpers.wait_until(lambda: any(c["tls_error"] for c in m.connections()), what="tls_error recorded")


def test_demo_mode_streams_words(mock_factory):
    m = mock_factory(demo=True)
    with client(m) as c:
        events = list(c.stream("POST", "/v1/chat/completions", chat_body("ping", model="chat-model", stream=True))[1])
    text = content_of(events)
    assert "demo upstream" in text and text.endswith("\u00abping\u00bb.")
    assert len(events) > 20 and events[-1].is_done
    (req,) = m.requests()
    t = req["event_times"][:10]  # the mock's own send times, as in test_delay_between_events
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert len(gaps) == 9 and min(gaps) >= 0.045, gaps  # 50 ms apart


def test_mock_exits_on_sigterm(mock_factory):
    m = mock_factory()
    m.p.signal(15)
    m.expect_dead = True
    assert m.p.wait(5) == 0


# ---- helpers ------------------------------------------------------------------------


def test_sse_parser_any_split_and_line_endings():
    stream = b"data: a\n\n: c\r\n\r\ndata: b1\rdata: b2\r\r" + b"event: e\r\nid: 7\r\ndata:x\r\n\r\n"
    want = [("a", []), (None, ["c"]), ("b1\nb2", []), ("x", [])]
    for cut in range(1, len(stream)):
        p = helpers.SSEParser()
        evs = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert [(e.data, e.comments) for e in evs] == want, cut
        assert evs[3].event == "e" and evs[3].id == "7"


def test_chunked_decoder_strict():
    body = b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\nX-T: 1\r\n\r\nNEXT"
    for cut in range(len(body)):
        d = helpers.ChunkedDecoder()
        out = d.feed(body[:cut]) + d.feed(body[cut:])
        assert out == b"hello!" and d.done and d.buf == b"NEXT"
    for bad in (b"0x5\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n", b"zz\r\n"):
        with pytest.raises(helpers.ProtocolError):
            helpers.ChunkedDecoder().feed(bad)


def test_parse_response_bytes_rejects_bad_framing():
    ok = helpers.parse_response_bytes(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}rest")
    assert ok.status == 404 and ok.body == b"{}" and ok.rest == b"rest"
    for bad in (
        b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
    ):
        with pytest.raises(helpers.ProtocolError):
            helpers.parse_response_bytes(bad)


def test_to_yaml_shapes():
    y = helpers.to_yaml(
        {
            "listen": [{"address": "127.0.0.1:8080"}, {"address": "0.0.0.0:8443", "tls": {"cert": "a b", "key": "k"}}],
            "workers": 2,
            "models": {"chat-model": {"upstream": "main", "name": "Qwen2.5-7B-Instruct"}},
            "flags": {"on": True, "x": "yes", "empty": [], "e2": {}},
        }
    )
    assert y == (
        "listen:\n"
        "  - address: 127.0.0.1:8080\n"
        "  - address: 0.0.0.0:8443\n"
        "    tls:\n"
        '      cert: "a b"\n'
        "      key: k\n"
        "workers: 2\n"
        "models:\n"
        "  chat-model:\n"
        "    upstream: main\n"
        "    name: Qwen2.5-7B-Instruct\n"
        "flags:\n"
        '  "on": true\n'
        '  x: "yes"\n'
        "  empty: []\n"
        "  e2: {}\n"
    )


def test_deep_merge():
    base = {"a": {"b": 1, "c": 2}, "l": [1], "d": 1}
    assert helpers.deep_merge(base, {"a": {"c": 3}, "l": [2], "d": None}) == {"a": {"b": 1, "c": 3}, "l": [2]}
    assert base == {"a": {"b": 1, "c": 2}, "l": [1], "d": 1}


def test_parse_prometheus():
    text = (
        "# HELP sluice_requests_total Requests.\n# TYPE sluice_requests_total counter\n"
        'sluice_requests_total{route="/v1/chat/completions",code="2xx"} 3\n'
        'sluice_requests_total{route="/v1/models",code="4xx"} 1\n'
        'sluice_request_duration_seconds_bucket{route="x",le="+Inf"} 4\n'
        'weird{a="q\\"uote",b="back\\\\slash"} 1.5e3 1700000000\n'
        "sluice_connections_active 2\n"
    )
    s = helpers.parse_prometheus(text)
    assert s.value("sluice_requests_total") == 4
    assert s.value("sluice_requests_total", code="2xx") == 3
    assert s.find("sluice_request_duration_seconds_bucket", le="+Inf")[0][2] == 4
    assert s.find("weird")[0][1] == {"a": 'q"uote', "b": "back\\slash"} and s.value("weird") == 1500
    assert helpers.route_is("/v1/chat/completions", "chat/completions")
    assert helpers.route_is("chat_completions", "chat/completions")
    assert not helpers.route_is("/v1/completions", "chat/completions")
    with pytest.raises(AssertionError):
        helpers.parse_prometheus("no value here\n")


def test_promtool_check(promtool):
    ok, _ = helpers.promtool_check("# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n")
    assert ok
    bad, out = helpers.promtool_check("# TYPE x_total counter\n# TYPE x_total counter\nx_total 1\n")
    assert not bad and out


def test_tls_files_verify(tls_files):
    def verify(cert, ca):
        return subprocess.run(
            ["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True
        ).returncode

    assert verify(tls_files.server[0], tls_files.ca_cert) == 0
    assert verify(tls_files.server[0], tls_files.other_ca_cert) != 0
    assert verify(tls_files.wrong_host[0], tls_files.ca_cert) == 0
    ctx = helpers.client_tls(tls_files.ca_cert)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_raw_exchange_reports_close_and_timeout():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    res = raw_exchange("127.0.0.1", port, b"hello", timeout=0.2)
    assert not res.closed and res.data == b""  # accepted by the kernel, never answered
    conn, _ = srv.accept()
    conn.close()
    srv.close()
    assert helpers.connect_refused("127.0.0.1", port)


def test_wait_until_deadline():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="the thing"):
        helpers.wait_until(lambda: False, 0.2, what="the thing")
    assert 0.2 <= time.monotonic() - t0 < 1
    assert helpers.wait_until(lambda: 5) == 5


def test_redis_fixture(redis_server):
    assert redis_server.cmd("SET", "k", "v") == "OK"
    assert redis_server.cmd("GET", "k") == "v"
    assert redis_server.cmd("INCR", "n") == 1
    assert redis_server.cmd("MGET", "k", "nope") == ["v", None]
