"""
test_clients_gzip.py — gzip for mobile clients (issue 12, item 10): a
non-streamed JSON answer at or above gzip.min_bytes goes gzip-encoded when
Accept-Encoding allows it (relayed answers and sluice's own); smaller ones,
clients that do not ask, and SSE streams go as they are.
"""

import gzip
import json

import helpers
from helpers import bound, chat_body


def post(sluice, body, ae):
    hdrs = {"Content-Type": "application/json"}
    if ae:
        hdrs["Accept-Encoding"] = ae
    return sluice.request("POST", "/v1/chat/completions", json.dumps(body).encode(), hdrs)


def test_big_json_answer_is_gzipped(sluice_factory, mock):
    s = sluice_factory({"gzip": {"min_bytes": "1k"}}, upstream=mock)
    mock.set_default({"text": "word " * 600})
    r = post(s, chat_body("big"), "gzip, deflate, br")
    assert r.status == 200
    assert r.header("Content-Encoding") == "gzip" and r.header("Vary") == "Accept-Encoding"
    assert int(r.header("Content-Length")) == len(r.body)
    plain = json.loads(gzip.decompress(r.body))
    assert plain["choices"][0]["message"]["content"] == "word " * 600
    assert len(r.body) * 5 < len(json.dumps(plain))  # repetitive text: a fifth or less
    # Not asked for, or refused: plain.
    for ae in (None, "identity", "gzip;q=0"):
        r = post(s, chat_body("big"), ae)
        assert r.header("Content-Encoding") is None, ae
        assert json.loads(r.body)["choices"][0]["message"]["content"] == "word " * 600
    # The upstream never got the client's Accept-Encoding.
    assert all(not any(h[0].lower() == "accept-encoding" for h in q["headers"])
               for q in mock.requests())


def test_small_answer_and_streams_stay_plain(sluice_factory, mock):
    s = sluice_factory({"gzip": {"min_bytes": "4k"}}, upstream=mock)
    r = post(s, chat_body("small"), "gzip")
    assert r.status == 200 and r.header("Content-Encoding") is None
    mock.set_default({"text": "word " * 2000})
    with s.client(timeout=bound(10)) as c:
        resp, evs = c.stream("POST", "/v1/chat/completions", chat_body("big", stream=True),
                             headers={"Accept-Encoding": "gzip"})
        evs = list(evs)
    assert resp.header("Content-Encoding") is None
    assert any(e.is_done for e in evs)


def test_sluices_own_answers_and_off_switch(sluice_factory, mock):
    models = {"m%03d-a-rather-long-model-name" % i: {"upstream": "main"} for i in range(40)}
    s = sluice_factory({"gzip": {"min_bytes": "512"}, "models": models}, upstream=mock)
    r = s.request("GET", "/v1/models", headers={"Accept-Encoding": "gzip"})
    assert r.header("Content-Encoding") == "gzip"
    assert len(json.loads(gzip.decompress(r.body))["data"]) == 43
    s2 = sluice_factory({"gzip": {"enabled": False}}, upstream=mock)
    r = s2.request("GET", "/v1/models", headers={"Accept-Encoding": "gzip"})
    assert r.header("Content-Encoding") is None
