"""
test_upstream_log.py — every upstream failure explains itself in the error
log (issue 19): a TLS certificate for another name, an unknown CA, the system
store facing a self-signed server, a refused connection, a malformed
response and a first-byte timeout each write exactly the expected line
(server URL, cause, OpenSSL's verdict, the SNI sent, the CA used, which
deadline fired); 1,000 failing requests cost no more lines than the rate
limit allows, and those lines account for every failure; an unreachable
Redis says why.

The lines are written before the client gets its answer, so each test reads
stderr right after the response: no waiting on the log.
"""

import math
import re
import socket
import subprocess
import threading
import time

import pytest

import helpers
from helpers import assert_error, bound, free_port, wait_until

WARN = re.compile(r"^\S+Z \[warn\] (.*)$")


def warn_lines(s, contains):
    out = []
    for ln in s.stderr_text().splitlines():
        m = WARN.match(ln)
        if m and contains in m.group(1):
            out.append(m.group(1))
    return out


def tls_sluice(sluice_factory, mock_factory, cert, ca, host="127.0.0.1"):
    m = mock_factory("tlsmock", tls=cert)
    url = "https://%s:%d" % (host, m.port)
    ups = {"servers": [{"url": url}]}
    if ca is not None:
        ups["tls"] = {"ca_file": str(ca)}
    return sluice_factory({"upstreams": {"main": ups}}, upstream=m), m, url


def self_signed(d):
    """A self-signed server certificate for 127.0.0.1 (no CA above it)."""
    crt, key = d / "self.crt", d / "self.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "3", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    return crt, key


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_wrong_host_certificate(sluice_factory, mock_factory, tls_files, host):
    s, m, url = tls_sluice(sluice_factory, mock_factory, tls_files.wrong_host, tls_files.ca_cert, host)
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    if host == "127.0.0.1":
        verdict = "IP address mismatch (verify error 64, expected 127.0.0.1); SNI none (an IP address)"
    else:
        verdict = "hostname mismatch (verify error 62, expected localhost); SNI localhost"
    want = "upstream main %s: TLS certificate verify failed: %s, CA file %s" % (url, verdict, tls_files.ca_cert)
    assert warn_lines(s, "upstream main") == [want]
    assert m.requests() == []


def test_unknown_ca(sluice_factory, mock_factory, tls_files):
    s, m, url = tls_sluice(sluice_factory, mock_factory, tls_files.server, tls_files.other_ca_cert)
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    want = ("upstream main %s: TLS certificate verify failed: unable to get local issuer certificate "
            "(verify error 20); SNI none (an IP address), CA file %s" % (url, tls_files.other_ca_cert))
    assert warn_lines(s, "upstream main") == [want]


def test_system_store_and_a_self_signed_server(sluice_factory, mock_factory, tmp_path):
    s, m, url = tls_sluice(sluice_factory, mock_factory, self_signed(tmp_path), None)
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    want = ("upstream main %s: TLS certificate verify failed: self-signed certificate "
            "(verify error 18); SNI none (an IP address), CA the system store" % url)
    assert warn_lines(s, "upstream main") == [want]


def test_plain_http_server_behind_https_url(sluice_factory, mock):
    """Not TLS at all (a plain HTTP server answering the ClientHello with an
    HTTP error): OpenSSL's handshake reason."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            with c:
                c.recv(4096)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    url = "https://127.0.0.1:%d" % lsock.getsockname()[1]
    try:
        s = sluice_factory({"upstreams": {"main": {"servers": [{"url": url}]}}}, upstream=mock)
        assert_error(s.chat(), 502, "upstream_error", "server_error")
    finally:
        lsock.close()
    assert warn_lines(s, "upstream main") == [
        "upstream main %s: TLS handshake failed: wrong version number; SNI none (an IP address), "
        "CA the system store" % url
    ]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_connection_refused(sluice_factory, scheme):
    """Also for https: no TLS byte was sent, so it is a connect error."""
    url = "%s://127.0.0.1:%d" % (scheme, free_port())
    s = sluice_factory(upstream=url)
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    assert warn_lines(s, "upstream main") == ["upstream main %s: connect failed: Connection refused" % url]


def test_malformed_response(sluice_factory, mock):
    s = sluice_factory(upstream=mock)
    mock.script({"raw_response": "HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n"})
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    assert warn_lines(s, "upstream main") == ["upstream main %s: bad response: bad_content_length" % mock.url]


def test_first_byte_timeout(sluice_factory, mock):
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"first_byte": "300ms"}}}}, upstream=mock)
    mock.script({"stall_first_byte": 3})
    assert_error(s.chat(), 504, "upstream_timeout", "server_error")
    assert warn_lines(s, "upstream main") == [
        "upstream main %s: first byte timeout: no response within 300 ms of the request "
        "(timeouts.first_byte)" % mock.url
    ]


HELD = re.compile(r"\((\d+) more like this in the last \d+s\)$")
FLUSHED = re.compile(r": (\d+) more like this in the last \d+s$")


@pytest.mark.timeout(120)
def test_a_thousand_failures_cost_a_line_per_interval(sluice_factory):
    url = "http://127.0.0.1:%d" % free_port()
    interval = 1.0
    # No breaker: every request tries the server and fails.
    s = sluice_factory({"log": {"repeat_interval": "1s"},
                        "fallback": {"circuit": {"failures": 0, "failure_percent": 0}}}, upstream=url)
    t0 = time.monotonic()
    with s.client(timeout=bound(10)) as c:
        for _ in range(1000):
            r = c.request("POST", "/v1/chat/completions", helpers.chat_body())
            assert r.status == 502
    elapsed = time.monotonic() - t0
    failures = s.metrics().value("sluice_upstream_errors_total", upstream="main", kind="connect")
    assert failures == 1000

    def accounted():
        n = 0
        for ln in warn_lines(s, url):
            if ln.startswith("upstream main %s: connect failed" % url):
                m = HELD.search(ln)
                n += 1 + (int(m.group(1)) if m else 0)
            elif ln.startswith("%s connect:" % url):
                n += int(FLUSHED.search(ln).group(1))
        return n

    # Every failure is in the log, as a line or in a count (the last count
    # comes with the once-a-second flush after the interval).
    wait_until(lambda: accounted() == 1000, bound(interval + 5), what="all failures counted")
    lines = warn_lines(s, url)
    budget = 2 + math.ceil((time.monotonic() - t0) / interval)
    assert 2 <= len(lines) <= budget, (len(lines), budget, elapsed, lines)


def test_redis_unreachable_says_why(sluice_factory, mock):
    port = free_port()
    s = sluice_factory({"redis": {"url": "redis://127.0.0.1:%d" % port}}, upstream=mock)
    # Several reconnects by every worker, all under one key: one line.
    wait_until(lambda: s.metrics().value("sluice_redis_errors_total", kind="connect") >= 4, bound(10),
               what="redis reconnect attempts")
    lines = warn_lines(s, "redis 127.0.0.1:%d" % port)
    assert lines == ["redis 127.0.0.1:%d: cannot connect (Connection refused); retrying with backoff" % port]


def test_redis_auth_failure_says_why(sluice_factory, mock, redis_server):
    redis_server.cmd("CONFIG", "SET", "requirepass", "the-right-one")
    url = "redis://:wrong@127.0.0.1:%d" % redis_server.port
    s = sluice_factory({"redis": {"url": url}}, upstream=mock)
    wait_until(lambda: s.metrics().value("sluice_redis_errors_total", kind="auth") >= 3, bound(10),
               what="redis AUTH attempts")
    lines = [ln for ln in s.stderr_text().splitlines()
             if "redis 127.0.0.1:%d" % redis_server.port in ln]
    # One line per key however many attempts: the refusal, and the
    # connection given up because of it.
    addr = re.escape("127.0.0.1:%d" % redis_server.port)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\S+Z \[error\] redis %s: AUTH failed: WRONGPASS .+" % addr, lines[0]), lines
    assert re.fullmatch(r"\S+Z \[warn\] redis %s: cannot connect \(handshake failed\); retrying with "
                        r"backoff" % addr, lines[1]), lines
    assert ":wrong@" not in s.stderr_text()  # the password is never logged


def silent_server():
    """Accepts TCP connections and never says a word (a TLS handshake that
    never completes)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    held = []

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            held.append(c)

    threading.Thread(target=serve, daemon=True).start()
    return lsock, held


def test_connect_timeout_names_the_tls_handshake(sluice_factory, mock):
    lsock, held = silent_server()
    url = "https://127.0.0.1:%d" % lsock.getsockname()[1]
    try:
        s = sluice_factory({"upstreams": {"main": {"servers": [{"url": url}],
                                                   "timeouts": {"connect": "300ms"}}}}, upstream=mock)
        assert_error(s.chat(), 504, "upstream_timeout", "server_error")
    finally:
        lsock.close()
        for c in held:
            c.close()
    assert warn_lines(s, "upstream main") == [
        "upstream main %s: connect timeout: not connected (TCP and TLS handshake) within 300 ms "
        "(timeouts.connect)" % url
    ]


def test_total_timeout(sluice_factory, mock):
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"connect": "300ms", "first_byte": "400ms",
                                                            "total": "500ms"}}}},
                       upstream=mock)
    mock.script({"stall_after_headers": 3})
    r = s.chat(stream=True)  # the head went out: the stream then ends in an error event
    assert r.status == 200
    assert warn_lines(s, "upstream main") == [
        "upstream main %s: total timeout: the response took longer than 500 ms (timeouts.total)" % mock.url
    ]
