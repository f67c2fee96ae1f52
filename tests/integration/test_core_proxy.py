"""
test_core_proxy.py — non-streamed proxying (issue 2, parts 3-4): the alias
is rewritten in the body the upstream gets and nothing else changes, the
client's Authorization never reaches the upstream while the conf's API key
does, hop-by-hop headers stop at sluice, and upstream answers (2xx and
errors) come back unchanged.
"""

import json
import threading

import pytest

import helpers
from helpers import UPSTREAM_KEY, chat_body, header_values


def test_chat_non_stream_alias_rewritten(sluice, mock):
    body = chat_body("hello there", temperature=0.25, max_tokens=17, n=1, user_field={"a": [1, 2]})
    r = sluice.request("POST", "/v1/chat/completions", body)
    assert r.status == 200, r
    assert (r.header("Content-Type") or "").startswith("application/json")
    b = r.json()
    assert b["object"] == "chat.completion"
    assert b["choices"][0]["message"]["content"] == "echo: hello there"
    (req,) = mock.requests()
    assert req["method"] == "POST" and req["path"] == "/v1/chat/completions"
    want = dict(body, model="Qwen2.5-7B-Instruct")
    assert req["json"] == want  # only the model changed
    assert len(header_values(req["headers"], "Host")) == 1


def test_model_without_alias_is_sent_as_is(sluice, mock):
    assert sluice.chat(model="plain-model").status == 200
    assert mock.requests()[0]["json"]["model"] == "plain-model"


def test_completions_and_embeddings(sluice, mock):
    r = sluice.request("POST", "/v1/completions", {"model": "chat-model", "prompt": "complete me"})
    assert r.status == 200 and r.json()["choices"][0]["text"] == "echo: complete me"
    r = sluice.request("POST", "/v1/embeddings", {"model": "embed-model", "input": ["a", "b"]})
    assert r.status == 200 and len(r.json()["data"]) == 2
    reqs = mock.requests()
    assert [(q["path"], q["json"]["model"]) for q in reqs] == [
        ("/v1/completions", "Qwen2.5-7B-Instruct"),
        ("/v1/embeddings", "mock-embed"),
    ]
    assert reqs[1]["json"]["input"] == ["a", "b"]


@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
def test_client_authorization_replaced_by_upstream_key(sluice, mock, name):
    secret = "client-secret-7d1e9"
    r = sluice.chat(headers=[(name, "Bearer " + secret)])
    assert r.status == 200
    (req,) = mock.requests()
    assert header_values(req["headers"], "Authorization") == ["Bearer " + UPSTREAM_KEY]
    assert secret not in json.dumps(req["headers"])


def test_two_client_authorizations_never_forwarded(sluice, mock):
    r = sluice.chat(headers=[("Authorization", "Bearer one-7d1e9"), ("Authorization", "Bearer two-7d1e9")])
    if r.status == 200:
        (req,) = mock.requests()
        assert header_values(req["headers"], "Authorization") == ["Bearer " + UPSTREAM_KEY]
    else:
        assert r.status == 400 and mock.requests() == []
    assert "7d1e9" not in json.dumps(mock.requests())


def test_no_api_key_env_sends_no_authorization(sluice_factory, mock):
    s = sluice_factory({"upstreams": {"main": {"api_key_env": None}}})
    assert s.chat(headers={"Authorization": "Bearer client-secret"}).status == 200
    (req,) = mock.requests()
    assert header_values(req["headers"], "Authorization") == []
    assert "client-secret" not in json.dumps(req["headers"])


def test_hop_by_hop_headers_not_forwarded(sluice, mock):
    hdrs = [
        ("Connection", "keep-alive, X-Hop-Private"),
        ("X-Hop-Private", "secret-hop"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Proxy-Authorization", "Basic cHJveHk6cHc="),
        ("Upgrade", "websocket"),
        ("X-End-To-End", "kept"),
    ]
    r = sluice.chat(headers=hdrs)
    # gateway/http1.h: Upgrade is a hop-by-hop header that sluice drops, and
    # the request is served as plain HTTP/1.1 (no 400/501).
    assert r.status == 200, (r.status, r.body[:200])
    (req,) = mock.requests()
    names = {n.lower() for n, _ in req["headers"]}
    for hop in ("x-hop-private", "keep-alive", "te", "proxy-authorization", "upgrade"):
        assert hop not in names, req["headers"]
    assert "secret-hop" not in json.dumps(req["headers"])


def test_large_body_forwarded_intact(sluice_factory, mock):
    # no per-message limit here (filters.input.max_chars is 8000 by default)
    sluice = sluice_factory({"filters": {"input": {"max_chars": 0}}}, upstream=mock)
    prompt = "".join("word%d " % i for i in range(60000))  # ~530 KB, under the 1 MiB default
    r = sluice.chat(prompt)
    assert r.status == 200
    assert r.json()["choices"][0]["message"]["content"] == "echo: " + prompt
    assert mock.requests()[0]["json"]["messages"][0]["content"] == prompt


def test_chunked_client_body_is_forwarded(sluice, mock):
    body = json.dumps(chat_body("chunked prompt")).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    with sluice.client() as c:
        c.send_request("POST", "/v1/chat/completions", None,
                       [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")])
        c.send(chunks + b"0\r\n\r\n")
        r = c.read_response()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: chunked prompt"
    assert mock.requests()[0]["json"]["model"] == "Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("status", [400, 404, 422, 429, 500])
def test_upstream_error_status_and_body_pass_through(sluice, mock, status):
    body = {"error": {"message": "upstream says no %d" % status, "type": "upstream_type", "code": "u%d" % status}}
    mock.script({"status": status, "body": body, "retry_after": 3})
    r = sluice.chat()
    assert r.status == status
    assert r.json() == body
    if status == 429:
        assert r.header("Retry-After") == "3"


def test_503_passthrough_with_retry_after(sluice, mock):
    body = {"error": {"message": "overloaded", "type": "server_error", "code": "busy"}}
    mock.script({"status": 503, "retry_after": 7, "body": body})
    r = sluice.chat(stream=True)
    assert r.status == 503
    assert r.header("Retry-After") == "7"
    assert r.json() == body


def test_parallel_requests_do_not_mix(sluice, mock):
    results = {}

    def one(i):
        try:
            r = sluice.chat("prompt-%d" % i)
            results[i] = (r.status, r.json()["choices"][0]["message"]["content"])
        except Exception as e:  # reported below
            results[i] = ("error", repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(helpers.bound(30))
    assert results == {i: (200, "echo: prompt-%d" % i) for i in range(24)}
    assert len(mock.requests()) == 24
