"""
test_clients_stream.py — how a stream ends (issue 12, item 5). A server that
closes cleanly without `data: [DONE]` after every choice has its
finish_reason sent a complete answer: sluice ends it with [DONE] (counted in
sluice_stream_done_added_total) so the SDKs do not throw. A choice without
a finish_reason still makes it a truncation with its error event.
"""

import json

import helpers
from helpers import bound, chat_body


def done_added(sluice):
    return sluice.metrics().value("sluice_stream_done_added_total") or 0


def truncated(sluice):
    return sluice.metrics().value("sluice_upstream_errors_total", upstream="main", kind="truncated") or 0


def stream(sluice, body):
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", body)
        assert r.status == 200
        return [e for e in evs if e.data is not None]


def test_finished_stream_without_done_gets_done(sluice, mock):
    mock.script({"no_done": True, "events": 3})
    evs = stream(sluice, chat_body("finish me", stream=True))
    assert evs[-1].is_done, evs[-1]
    assert sum(e.is_done for e in evs) == 1
    body = [e.json() for e in evs[:-1]]
    assert not any("error" in b for b in body), body
    assert body[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(body) == 3 + 1  # three contents, the finish chunk
    assert done_added(sluice) == 1
    assert truncated(sluice) == 0


def test_unfinished_choice_keeps_the_error(sluice, mock):
    # n = 2 and only choice 0 finished: the answer is not complete.
    c0 = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
          "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                      {"index": 1, "delta": {"content": "b"}, "finish_reason": None}]}
    c1 = dict(c0, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
    raw = ["data: %s\n\n" % json.dumps(c0), "data: %s\n\n" % json.dumps(c1)]
    mock.script({"raw": raw, "no_done": True})
    body = chat_body("two", stream=True)
    body["n"] = 2
    evs = stream(sluice, body)
    assert not any(e.is_done for e in evs)
    assert evs[-1].json()["error"]["code"] == "upstream_truncated"
    assert len(evs) == 3
    assert done_added(sluice) == 0
    helpers.wait_until(lambda: truncated(sluice) == 1, bound(3), what="truncation counted")


def test_two_finished_choices_complete(sluice, mock):
    chunks = [{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": k, "delta": {}, "finish_reason": "length"}]} for k in (1, 0)]
    mock.script({"raw": ["data: %s\n\n" % json.dumps(c) for c in chunks], "no_done": True})
    body = chat_body("two", stream=True)
    body["n"] = 2
    evs = stream(sluice, body)
    assert [e.is_done for e in evs] == [False, False, True]
    assert done_added(sluice) == 1


def test_responses_stream_relays_event_lines_and_ends_clean(sluice, mock):
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/responses",
                          {"model": "chat-model", "input": "resp", "stream": True})
        assert r.status == 200
        evs = [e for e in evs if e.data is not None]
    kinds = [e.json()["type"] for e in evs]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_text.delta") == 4
    assert not any(e.is_done for e in evs)  # that API has no [DONE]: none is added
    assert done_added(sluice) == 0 and truncated(sluice) == 0


def test_responses_stream_without_its_last_event_is_truncated(sluice, mock):
    mock.script({"no_finish": True})
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/responses",
                          {"model": "chat-model", "input": "resp", "stream": True})
        evs = [e for e in evs if e.data is not None]
    assert evs[-1].json()["error"]["code"] == "upstream_truncated"
    helpers.wait_until(lambda: truncated(sluice) == 1, bound(3), what="truncation counted")


def test_responses_cancel_and_unknown_method(sluice, mock):
    r = sluice.request("POST", "/v1/responses", {"model": "chat-model", "input": "x"})
    assert r.status == 200
    rid = r.json()["id"]
    r = sluice.request("POST", "/v1/responses/%s/cancel" % rid)
    assert r.status == 200 and r.json()["status"] == "cancelled"
    assert mock.requests()[-1]["method"] == "POST" and mock.requests()[-1]["path"].endswith("/cancel")
    r = sluice.request("PUT", "/v1/responses/%s" % rid, {"x": 1})
    helpers.assert_error(r, 405, "method_not_allowed")
    assert r.header("Allow") == "GET, HEAD, POST, DELETE"
