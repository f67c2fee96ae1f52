"""
test_core_writers.py — writers of a client's output that nothing else
follows at once. A direct connection's output has no callback (wio.c, "No
output callback"): each writer queues what it added (gw_wio_added), so one
that did not would leave its bytes in the buffer until the next write on
that connection. These two have no next write until the client answers:

- the 100 Continue (conn.c, gw_conn_head): the client sends the body only
  once it has read it;
- the server's first SETTINGS of an h2c connection (h2.c,
  gw_h2_send_settings), to a client that has sent the bare preface and
  waits for it.

Every other writer (the answer's head and body, SSE events, the chunked
end, error replies, the upstream request) is followed by a client reading
its answer in the other suites: a lost queue call there fails them.
"""

import json
import socket
import struct

import helpers
from h2raw import PREFACE, SETTINGS, ACK, frame
from helpers import bound

BODY = json.dumps({"model": "chat-model", "messages": [{"role": "user", "content": "continue"}]}).encode()


def _read_until(s, marker, timeout):
    """Bytes read until marker is in them (or the peer closed, or timeout)."""
    return helpers.recv_until(s, lambda got: marker in got, timeout)


def _settings_acked(buf):
    """Whether the whole frames in buf include a SETTINGS ACK."""
    while len(buf) >= 9:
        m = struct.unpack(">I", b"\x00" + buf[:3])[0]
        if len(buf) < 9 + m:
            return False
        if buf[3] == SETTINGS and buf[4] & ACK:
            return True
        buf = buf[9 + m :]
    return False


def test_100_continue_comes_before_the_body(sluice, mock):
    s = socket.create_connection((sluice.host, sluice.port), timeout=bound(5))
    try:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: sluice.test\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(BODY)
        )
        # the client waits for it (curl waits 1 s, then sends anyway)
        interim = _read_until(s, b"\r\n\r\n", bound(3))
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        s.sendall(BODY)
        data = _read_until(s, b"\x00never", bound(5))  # to the close
    finally:
        s.close()
    r = helpers.parse_response_bytes(data)
    assert r.status == 200, data[:300]
    assert r.json()["choices"][0]["message"]["content"]
    assert len(mock.requests()) == 1
    assert mock.requests()[0]["json"]["messages"][0]["content"] == "continue"


def test_h2c_server_settings_without_the_clients(sluice_factory, mock):
    conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), mock.url)
    conf["listen"][0]["h2c"] = True
    s = sluice_factory(conf=conf)
    c = socket.create_connection((s.host, s.port), timeout=bound(5))
    try:
        c.sendall(PREFACE)  # no SETTINGS of ours: nothing for the server to ACK
        got = helpers.recv_until(c, lambda g: len(g) >= 9, bound(3))
        assert len(got) >= 9, "no frame from the server: %r" % got
        n = struct.unpack(">I", b"\x00" + got[:3])[0]
        ftype, flags = got[3], got[4]
        assert ftype == SETTINGS and not flags & ACK, got[:9]
        assert n % 6 == 0 and n > 0
        # the connection goes on: our SETTINGS is ACKed
        c.sendall(frame(SETTINGS, 0, 0))
        more = got[9 + n :]
        more += helpers.recv_until(c, lambda g: _settings_acked(more + g), bound(3))
        acked = _settings_acked(more)
        assert acked
    finally:
        c.close()
