"""
test_core_tls.py — TLS on both sides (issue 2, parts 2-3) with certificates
made by the test (openssl CLI): a TLS listener serving plain and streamed
requests, and https:// upstreams verified against a CA file — certificate,
host name and SNI — where a wrong CA or a wrong name fails with 502 and
nothing reaches the upstream's HTTP layer.
"""

import pytest

import helpers
from helpers import assert_error, bound, chat_body, client_tls, free_port, raw_exchange


@pytest.fixture
def tls_sluice(sluice_factory, mock, tls_files):
    crt, key = tls_files.server
    conf = helpers.base_conf(free_port(), free_port(), mock.url)
    conf["listen"].append({"address": "127.0.0.1:%d" % free_port(), "tls": {"cert": str(crt), "key": str(key)}})
    return sluice_factory(conf=conf)


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1"])
def test_tls_listener_serves_requests_and_streams(tls_sluice, mock, tls_files, name):
    ctx = client_tls(tls_files.ca_cert)
    with tls_sluice.client(tls=ctx, server_hostname=name, listener=1) as c:
        assert c.sock.version() in ("TLSv1.2", "TLSv1.3")
        r = c.request("POST", "/v1/chat/completions", chat_body("over tls"))
        assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: over tls"
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("tls stream", stream=True))
        events = [e for e in evs if e.data]
        assert r.header("Content-Type").startswith("text/event-stream") and events[-1].is_done
        assert c.request("GET", "/healthz").status == 200
    # the plain listener still works beside it
    assert tls_sluice.chat().status == 200


def test_tls_listener_gate_event_before_next(tls_sluice, mock, tls_files):
    mock.script({"gate": True, "events": 2})
    ctx = client_tls(tls_files.ca_cert)
    with tls_sluice.client(tls=ctx, server_hostname="localhost", listener=1, timeout=bound(5)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        evs = (e for e in evs if e.data)
        next(evs)
        (req,) = mock.requests()
        assert req["events_sent"] == 1
        mock.release(request=req["id"])
        next(evs)
        mock.release(n=10)
        assert [e for e in evs][-1].is_done


def test_tls_listener_refuses_plain_http(tls_sluice, mock):
    host, port = tls_sluice.listener(1)
    res = raw_exchange(host, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=bound(3))
    assert res.closed
    assert b"200 OK" not in res.data
    assert mock.bytes_received() == 0
    assert tls_sluice.chat().status == 200


def https_upstream(sluice_factory, mock_factory, tls_files, ca, cert=None, host="127.0.0.1"):
    m = mock_factory("tlsmock", tls=cert or tls_files.server)
    ups = {"servers": [{"url": "https://%s:%d" % (host, m.port)}]}
    if ca is not None:
        ups["tls"] = {"ca_file": str(ca)}
    s = sluice_factory({"upstreams": {"main": ups}}, upstream=m)
    return s, m


def test_https_upstream_with_ca_file(sluice_factory, mock_factory, tls_files):
    s, m = https_upstream(sluice_factory, mock_factory, tls_files, tls_files.ca_cert)
    r = s.chat("to https")
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: to https"
    with s.client() as c:
        events = [e for e in c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1] if e.data]
    assert events[-1].is_done
    conns = m.connections()
    assert conns and all(c["tls"] and c["tls_error"] is None for c in conns)
    assert m.requests()[0]["json"]["model"] == "Qwen2.5-7B-Instruct"


def test_https_upstream_sends_sni(sluice_factory, mock_factory, tls_files):
    s, m = https_upstream(sluice_factory, mock_factory, tls_files, tls_files.ca_cert, host="localhost")
    assert s.chat().status == 200
    assert [c["sni"] for c in m.connections()] == ["localhost"]


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_host", "system_store"])
def test_https_upstream_verification_failures_502(sluice_factory, mock_factory, tls_files, case):
    if case == "wrong_ca":
        s, m = https_upstream(sluice_factory, mock_factory, tls_files, tls_files.other_ca_cert)
    elif case == "wrong_host":
        s, m = https_upstream(sluice_factory, mock_factory, tls_files, tls_files.ca_cert, cert=tls_files.wrong_host)
    else:  # no ca_file: the system store, which does not know the test CA
        s, m = https_upstream(sluice_factory, mock_factory, tls_files, None)
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    assert_error(s.chat(stream=True), 502, "upstream_error", "server_error")
    assert m.requests() == []  # no HTTP byte went over an unverified channel
