"""
test_filters_stream.py — filtering streamed (and whole) answers through the
real binary (issue 5, part 5), with the mock sending exact event texts (its
`raw` behaviour) so that a banned word is split across events:

- mask: the word becomes the mask whatever the split (Latin, Chinese, a
  regex), `[DONE]` last, finish_reason untouched;
- block: nothing of the word leaves sluice, a final chunk with
  finish_reason "content_filter", then `[DONE]`, and the upstream
  connection is closed (the mock stops being read: it never sends the rest);
- no delay: with the mock's gate, each event's safe text reaches the client
  before the mock is allowed to send the next event — only the tail that
  may still become a word is held;
- non-streamed answers get the same rules.
"""

import re

import pytest

import helpers
import policy_helpers as ph
from helpers import chat_body, wait_until

WORDS = ["badword", "敏感词", "forbidden phrase"]


def _start(sluice_factory, mock, tmp_path, action="mask", extra=None):
    wf = ph.word_file(tmp_path / "words.txt", WORDS)
    f = {"words": [{"file": wf, "action": action}], "output": True}
    if extra:
        f = helpers.deep_merge(f, extra)
    return ph.start(sluice_factory, mock, {"filters": f}, auth=False)


def _stream(s, prompt="tell me"):
    with s.client(timeout=helpers.bound(10)) as c:
        r, evs = c.stream("POST", ph.CHAT_PATH, chat_body(prompt, stream=True))
        evs = [e for e in evs if e.data is not None]
    assert r.status == 200, r
    return evs


def _text(evs):
    return "".join(ph.event_text(e) for e in evs)


@pytest.mark.parametrize("pieces,want", [
    (["hello ba", "dwo", "rd and more"], "hello *** and more"),
    (["b", "a", "d", "w", "o", "r", "d"], "***"),
    (["x BAD", "WORD y"], "x *** y"),  # ASCII case folded
    (["fullwidth ｂａｄ", "ｗｏｒｄ!"], "fullwidth ***!"),
    (["这是敏", "感", "词吗"], "这是***吗"),
    (["a forbidden", " phrase here"], "a *** here"),
    (["a forbidden", " phrasebook"], "a ***book"),
    (["badwor", "k is fine"], "badwork is fine"),  # a prefix that did not complete
    (["no match at all"], "no match at all"),
])
def test_mask_word_split_across_events(sluice_factory, mock, tmp_path, pieces, want):
    s = _start(sluice_factory, mock, tmp_path)
    mock.script({"raw": ph.raw_stream(*pieces)})
    evs = _stream(s)
    assert _text(evs) == want
    assert evs[-1].is_done and sum(e.is_done for e in evs) == 1
    assert ph.finish_reasons(evs) == ["stop"]
    hits = ph.metric(s, "sluice_filter_hits_total", rule="words", action="mask")
    assert hits == (0 if want.count("***") == 0 else want.count("***"))


def test_replaced_events_small_and_past_the_stack_frame(sluice_factory, mock, tmp_path):
    """A replaced event is framed on the relay's stack up to 4 KiB and in
    one allocation past that: both give the same whole events, in order."""
    s = _start(sluice_factory, mock, tmp_path, extra={"holdback_max": 65536})
    big = "x" * 6000
    mock.script({"raw": ph.raw_stream("a badword ", big + " badword " + big, " end badword")})
    evs = _stream(s)
    assert _text(evs) == "a *** " + big + " *** " + big + " end ***"
    assert evs[-1].is_done and sum(e.is_done for e in evs) == 1
    assert ph.metric(s, "sluice_filter_hits_total", rule="words", action="mask") == 3


def test_regex_mask_across_events(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path,
               extra={"regex": [{"name": "cn_mobile", "pattern": r"1[3-9]\d{9}", "action": "mask"}]})
    mock.script({"raw": ph.raw_stream("call 138", "0013", "8000 now, not 12345678901")})
    evs = _stream(s)
    assert _text(evs) == "call *** now, not 12345678901"
    assert ph.metric(s, "sluice_filter_hits_total", rule="cn_mobile", action="mask") == 1


def test_block_split_word_ends_the_stream_and_closes_upstream(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, action="block")
    mock.script({"gate": True, "raw": ph.raw_stream("safe text ", "then ba", "dword here", "never sent",
                                                    "nor this")})
    with s.client(timeout=helpers.bound(10)) as c:
        r, it = c.stream("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        assert r.status == 200
        it = (e for e in it if e.data is not None)
        e1 = next(it)
        assert ph.event_text(e1) == "safe text "
        (q,) = mock.requests()
        mock.release(request=q["id"])
        e2 = next(it)
        assert ph.event_text(e2) == "then "  # "ba" held: it may become the word
        mock.release(request=q["id"])  # "dword here": the word completes
        rest = list(it)
        assert r.complete
    evs = [e1, e2] + rest
    text = _text(evs)
    assert text == "safe text then ", text
    assert "ba" not in text.replace("safe text then ", "")
    assert evs[-1].is_done and sum(e.is_done for e in evs) == 1
    assert ph.finish_reasons(evs) == ["content_filter"]
    final = [e.json() for e in rest if not e.is_done]
    assert final and final[-1]["choices"][0]["delta"] in ({}, {"content": ""})
    # the upstream is cancelled: its connection closed by sluice, and it
    # never got to send the events after the match
    def closed():
        conns = [cn for cn in mock.connections() if cn["requests"]]
        return conns and all(cn["closed"] is not None for cn in conns) and conns
    conns = wait_until(closed, helpers.bound(1), what="the upstream connection closed")
    assert conns[0]["closed_by"] == "peer", conns
    q = mock.requests()[0]
    assert q["events_sent"] == 3 and q["outcome"] == "peer_closed", q
    assert ph.metric(s, "sluice_filter_hits_total", rule="words", action="block") == 1
    # the next request is served normally on a new upstream connection
    mock.script({"raw": ph.raw_stream("all ", "good")})
    assert _text(_stream(s)) == "all good"


def test_safe_text_is_never_delayed(sluice_factory, mock, tmp_path):
    """Each event's text that cannot be part of a word reaches the client
    while the mock still holds the next event (the gate proves the order,
    no timing involved)."""
    s = _start(sluice_factory, mock, tmp_path,
               extra={"regex": [{"name": "cn_mobile", "pattern": r"1[3-9]\d{9}", "action": "mask"}]})
    pieces = ["The quick brown ", "fox and ba", "dword! call 13", "900001111 ok", " tail"]
    want_each = ["The quick brown ", "fox and ", "***! call ", "*** ok", " tail"]
    mock.script({"gate": True, "raw": ph.raw_stream(*pieces)})
    with s.client(timeout=helpers.bound(10)) as c:
        r, it = c.stream("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        it = (e for e in it if e.data is not None)
        got = []
        qid = None
        for i, want in enumerate(want_each):
            if i:
                mock.release(request=qid)
            e = next(it)
            if qid is None:
                qid = mock.requests()[0]["id"]
            # the mock has sent exactly i+1 events: this text came out before the next
            assert mock.requests()[0]["events_sent"] == i + 1
            assert ph.event_text(e) == want, (i, ph.event_text(e), want)
            got.append(e)
        mock.release(n=10, request=qid)
        rest = list(it)
    assert rest[-1].is_done and ph.finish_reasons(rest) == ["stop"]
    assert _text(got + rest) == "".join(want_each)


def test_held_tail_released_at_the_end(sluice_factory, mock, tmp_path):
    # a stream that ends on a possible prefix: the held text goes out
    # before the finish chunk, nothing is lost
    s = _start(sluice_factory, mock, tmp_path)
    mock.script({"raw": ph.raw_stream("ends with bad", "wor")})
    evs = _stream(s)
    assert _text(evs) == "ends with badwor"
    reasons = [(ph.event_text(e), ph.finish_reasons([e])) for e in evs if not e.is_done]
    assert reasons[-1][1] == ["stop"] and "".join(t for t, _ in reasons[:-1]).endswith("badwor")


def test_output_filtering_off(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, extra={"output": False})
    raw = ph.raw_stream("hello ba", "dword")
    mock.script({"raw": raw})
    with s.client() as c:
        c.send_request("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        r = c.read_head()
        body = b"".join(c.iter_body(r))
    assert body == "".join(raw).encode()  # byte for byte


@pytest.mark.parametrize("action,content,finish", [
    ("mask", "this has *** inside, ***", "stop"),
    ("block", "", "content_filter"),
])
def test_whole_answer_filtered(sluice_factory, mock, tmp_path, action, content, finish):
    s = _start(sluice_factory, mock, tmp_path, action=action)
    mock.script({"text": "this has BadWord inside, 敏感词"})
    r = s.chat("x")
    assert r.status == 200, r
    ch = r.json()["choices"][0]
    assert ch["message"]["content"] == content and ch["finish_reason"] == finish
    assert "BadWord" not in r.body.decode() and "敏感词" not in r.body.decode("utf-8")


def _usage_event(prompt, completion, split=False, eol="\n"):
    """The usage-only chunk; split: its JSON over two data lines (the usage
    object whole on the second), as a server may frame it."""
    head = '{"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 0, "model": "m",'
    tail = (' "choices": [], "usage": {"prompt_tokens": %d, "completion_tokens": %d,'
            ' "total_tokens": %d}}' % (prompt, completion, prompt + completion))
    if split:
        return "data: " + head + eol + "data: " + tail + eol + eol
    return "data: " + head + tail + eol + eol


@pytest.mark.parametrize("split,eol", [(False, "\n"), (True, "\n"), (True, "\r\n")])
def test_usage_behind_the_output_filter_counted_and_stripped(sluice_factory, mock, tmp_path,
                                                             split, eol):
    """The relay tells the llm hook which events hold no usage object (it
    scanned their bytes already); the usage chunk behind the output filter
    must still be counted once, stripped when the client did not ask for it,
    shown when it did, and every event timed once by the filter."""
    s = _start(sluice_factory, mock, tmp_path)
    # content with a masked word split across events, "usage": null in a
    # content chunk (not a usage object), the usage chunk last
    nullusage = ph.chunk_event("and more").replace('"choices"', '"usage": null, "choices"')
    raw = (ph.raw_stream("hello ba", "dword ", finish=None, done=False) + [nullusage] +
           ph.raw_stream(finish="stop", done=False) + [_usage_event(7, 5, split, eol)] +
           ["data: [DONE]\n\n"])
    mock.script({"raw": raw})
    evs = _stream(s)
    assert _text(evs) == "hello *** and more"
    assert evs[-1].is_done and sum(e.is_done for e in evs) == 1
    chunks = [e.json() for e in evs if not e.is_done]
    assert not any(c.get("usage") for c in chunks), chunks  # the client did not ask
    assert all(c["choices"] for c in chunks), chunks
    (q,) = mock.requests("/v1/chat/completions")
    assert q["json"]["stream_options"] == {"include_usage": True}  # sluice asked for it
    m = s.metrics()
    assert m.value("sluice_tokens_total", model="chat-model", kind="prompt") == 7
    assert m.value("sluice_tokens_total", model="chat-model", kind="completion") == 5
    # the filter saw each data event once: 3 content, finish, usage, [DONE]
    assert m.value("sluice_filter_event_seconds_count") == 6
    # a client that asked for usage gets the chunk, counted once more
    mock.script({"raw": raw})
    with s.client(timeout=helpers.bound(10)) as c:
        r, got = c.stream("POST", ph.CHAT_PATH,
                          chat_body("tell me", stream=True, stream_options={"include_usage": True}))
        got = [e for e in got if e.data is not None]
    assert r.status == 200 and got[-1].is_done
    usage = [e.json()["usage"] for e in got if not e.is_done and e.json().get("usage")]
    assert usage == [{"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}], usage
    m = s.metrics()
    assert m.value("sluice_tokens_total", model="chat-model", kind="prompt") == 14
    assert m.value("sluice_tokens_total", model="chat-model", kind="completion") == 10
    assert m.value("sluice_filter_event_seconds_count") == 12


_RE = {"regex": [{"name": "cn_mobile", "pattern": r"1[3-9]\d{9}", "action": "mask"}]}


def _whole(content, extra=""):
    return ('{ "id": "x",  "object":"chat.completion", "created": 13900001111,%s "choices": [{'
            '"index":0, "message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],'
            '"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}' % (extra, content))


def test_whole_answer_without_candidate_is_relayed_as_sent(sluice_factory, mock, tmp_path):
    # no word, no text byte a regex starts with (the phone-like number is
    # outside every string), no escape: relayed unread, byte for byte
    s = _start(sluice_factory, mock, tmp_path, extra=_RE)
    sent = _whole("all calm here, bad word", ' "forbidden": 1,')
    mock.script({"status": 200, "body": sent})
    r = s.chat("x")
    assert r.status == 200, r
    assert r.body == sent.encode()
    assert ph.metric(s, "sluice_filter_hits_total", rule="words", action="mask") in (0, None)


@pytest.mark.parametrize("content,want", [
    (r"an escaped bad\u0077ord", "an escaped ***"),  # the word only after decoding
    ("call 13900001111 now", "call *** now"),  # a regex start inside the text
    (r"call 1390000\u0031111 now", "call *** now"),  # both
])
def test_whole_answer_with_candidate_is_read(sluice_factory, mock, tmp_path, content, want):
    s = _start(sluice_factory, mock, tmp_path, extra=_RE)
    mock.script({"status": 200, "body": _whole(content)})
    r = s.chat("x")
    assert r.status == 200, r
    j = r.json()
    assert j["choices"][0]["message"]["content"] == want
    assert j["created"] == 13900001111 and j["usage"]["total_tokens"] == 3


def _read_chunks(c, nbytes):
    """The payloads of the chunked body's chunks, as framed by sluice, until
    nbytes of payload have come (the client's timeout bounds the wait)."""
    chunks, have = [], 0
    while have < nbytes:
        m = re.match(rb"([0-9a-fA-F]+)\r\n", c.buf)
        if m:
            n = int(m.group(1), 16)
            end = m.end() + n + 2
            assert n > 0, (chunks, c.buf)  # not the last chunk yet
            if len(c.buf) >= end:
                assert c.buf[end - 2:end] == b"\r\n"
                chunks.append(c.buf[m.end():end - 2])
                have += n
                c.buf = c.buf[end:]
                continue
        assert c._fill(), "connection closed"
    assert have == nbytes, chunks
    return chunks


def test_events_of_one_read_leave_in_one_chunk_unchanged(sluice_factory, mock, tmp_path):
    """The relay gathers the events of one upstream read into one chunk
    (docs/gateway.md, "One SSE event through the relay"): with the output
    filter on and changing nothing, each upstream write's complete events
    reach the client byte for byte, in one chunk, while the mock still holds
    its next write (the gate proves it: nothing complete waits for a later
    read); the start of an event the write did not complete goes out with
    the write that does."""
    s = _start(sluice_factory, mock, tmp_path)
    ev = [e.encode() for e in ph.raw_stream("one ", "two ", "three ", "four ", "five")]
    writes = [ev[0] + ev[1] + ev[2] + ev[3][:10], ev[3][10:] + ev[4], ev[5] + ev[6]]
    want = [ev[0] + ev[1] + ev[2], ev[3] + ev[4], ev[5] + ev[6]]
    mock.script({"gate": True, "raw": [w.decode() for w in writes]})
    with s.client(timeout=helpers.bound(10)) as c:
        c.send_request("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        r = c.read_head()
        assert r.status == 200 and r.chunked
        (q,) = mock.requests()
        for i, w in enumerate(want):
            assert mock.requests()[0]["events_sent"] == i + 1  # the next write is held
            assert _read_chunks(c, len(w)) == [w]
            if i + 1 < len(want):
                assert mock.release(request=q["id"]) == 1
        while b"0\r\n\r\n" not in c.buf:
            assert c._fill(), "connection closed before the last chunk"
        assert c.buf == b"0\r\n\r\n"
