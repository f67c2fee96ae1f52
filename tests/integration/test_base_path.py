"""
test_base_path.py — upstream server URLs with a base path (issue 12, item
1): a hosted provider's https://host/openai/v1. A client's /v1/REST goes
upstream as BASE/REST over verified TLS (Host and SNI the upstream's own
name, the upstream's API key), for chat, streamed chat and embeddings; a
path outside /v1 is never forwarded; a supervised server's health check
asks BASE/models.
"""

import os

import pytest

import helpers
from helpers import bound, chat_body, free_port, header_values, wait_until

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MOCK = os.path.join(ROOT, "tests", "mock_upstream.py")
BASE = "/openai/v1"


@pytest.fixture
def based(sluice_factory, mock_factory, tls_files):
    m = mock_factory("provider", tls=tls_files.server, base_path=BASE)
    url = "https://localhost:%d%s" % (m.port, BASE)
    s = sluice_factory({"upstreams": {"main": {"servers": [{"url": url}],
                                               "tls": {"ca_file": str(tls_files.ca_cert)}}}},
                       upstream=m)
    return s, m


def test_chat_goes_to_the_base_path(based):
    s, m = based
    r = s.chat("under a base path")
    assert r.status == 200, r.body
    assert r.json()["choices"][0]["message"]["content"] == "echo: under a base path"
    (req,) = m.requests()
    assert req["method"] == "POST" and req["target"] == BASE + "/chat/completions"
    assert header_values(req["headers"], "Host") == ["localhost:%d" % m.port]
    assert header_values(req["headers"], "Authorization") == ["Bearer " + helpers.UPSTREAM_KEY]
    assert [c["sni"] for c in m.connections()] == ["localhost"]


def test_stream_and_embeddings_under_the_base_path(based):
    s, m = based
    with s.client() as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("streamed", stream=True))
        events = [e for e in evs if e.data]
        assert r.status == 200 and events[-1].is_done and len(events) >= 2
        r = c.request("POST", "/v1/embeddings", {"model": "embed-model", "input": "vector me"})
        assert r.status == 200 and len(r.json()["data"][0]["embedding"]) == 8
    assert [q["target"] for q in m.requests()] == [BASE + "/chat/completions", BASE + "/embeddings"]
    assert all(q["status"] == 200 for q in m.requests())


@pytest.mark.parametrize("path", ["/openai/v1/chat/completions", "/v2/chat/completions",
                                  "/chat/completions", "/v1/../openai/v1/chat/completions"])
def test_a_path_outside_v1_is_never_forwarded(based, path):
    s, m = based
    r = s.request("POST", path, chat_body())
    assert r.status in (400, 404), (r.status, r.body)
    assert r.json()["error"]["code"] in ("not_found", "bad_request")
    assert m.requests() == []
    assert s.chat().status == 200  # and the right path still works


def test_mock_answers_only_under_its_base_path(based, tls_files):
    """What a wrong mapping would get: the provider's 404, not an answer."""
    s, m = based
    r = helpers.request("127.0.0.1", m.port, "POST", "/v1/chat/completions", chat_body(),
                        tls=helpers.client_tls(tls_files.ca_cert), server_hostname="localhost")
    assert r.status == 404
    r = helpers.request("127.0.0.1", m.port, "POST", BASE + "/chat/completions", chat_body(),
                        tls=helpers.client_tls(tls_files.ca_cert), server_hostname="localhost")
    assert r.status == 200


def test_supervised_health_check_uses_the_base_path(sluice_factory, mock):
    port = free_port()
    conf = {
        "upstreams": {
            "main": {"servers": [{"url": mock.url}]},
            "local": {
                "servers": [{"url": "http://127.0.0.1:%d/api/v1" % port}],
                "command": ["/usr/bin/python3", MOCK, "--port", str(port), "--name", "supervised",
                            "--base-path", "/api/v1"],
            },
        },
        "models": {"small": {"upstream": "local"}},
    }
    s = sluice_factory(conf, upstream=mock)

    def in_service():
        r = helpers.request("127.0.0.1", s.admin_port, "GET", "/readyz")
        return r.json()["upstreams"]["local"]["in_service"] == 1

    # The mock answers 404 to /v1/models: only BASE/models makes it healthy.
    wait_until(in_service, bound(15), what="the supervised server healthy")
    r = s.chat("local", model="small")
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: local"
