"""
test_core_syscalls.py — the system calls of a kept-alive JSON request
(docs/gateway.md, "System calls and wake-ups per request"), counted by
strace attached to the worker: one recv and one sendmsg per side, two
epoll_waits, nothing else per request (no read that only says EAGAIN, no
ioctl(FIONREAD), no epoll_ctl, no read(2) or writev(2) of a socket). A
change that adds a call to every request fails here before any benchmark
sees it.

The upstream is a socket server of the test's own that answers each request
with one send (head and body together), so the counts are sluice's alone.
"""

import json
import re
import shutil
import signal
import socket
import subprocess

import pytest

import helpers
from helpers import bound, chat_body

ANSWER = json.dumps(
    {
        "id": "chatcmpl-sys",
        "object": "chat.completion",
        "created": 0,
        "model": "Qwen2.5-7B-Instruct",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()
REPLY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
) + ANSWER


def read_message(sock, buf):
    """One HTTP/1.1 message with a Content-Length body from sock (buf: bytes
    already read); returns (message, the bytes after it), or (None, b"") at EOF."""
    while b"\r\n\r\n" not in buf:
        b = sock.recv(65536)
        if not b:
            return None, b""
        buf += b
    head, rest = buf.split(b"\r\n\r\n", 1)
    n = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    while len(rest) < n:
        b = sock.recv(65536)
        if not b:
            return None, b""
        rest += b
    return head + b"\r\n\r\n" + rest[:n], rest[n:]


class OneSendUpstream:
    """Keep-alive HTTP/1.1 server: every request answered with REPLY in one send."""

    def __init__(self):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", helpers.free_port()))
        self.ls.listen(8)
        self.url = "http://127.0.0.1:%d" % self.ls.getsockname()[1]
        helpers.accept_each(self.ls, self._serve)

    def _serve(self, c):
        buf = b""
        with c:
            while True:
                msg, buf = read_message(c, buf)
                if msg is None:
                    return
                c.sendall(REPLY)

    def close(self):
        self.ls.close()


def strace_counts(path):
    """strace -c's summary: {syscall: (calls, errors)}."""
    out = {}
    for ln in open(path):
        f = ln.split()
        if len(f) >= 5 and f[3].isdigit() and f[-1] not in ("total", "syscall"):
            out[f[-1]] = (int(f[3]), int(f[4]) if len(f) == 6 else 0)
    return out


@pytest.fixture
def strace():
    path = shutil.which("strace")
    if not path:
        pytest.skip("strace not installed")
    return path


def test_kept_alive_request_costs_four_calls_and_two_waits(sluice_factory, strace, tmp_path):
    up = OneSendUpstream()
    s = sluice_factory(
        {"workers": 1, "log": {"access": "off", "level": "warn"}}, upstream=up.url
    )
    body = json.dumps(chat_body("count my calls")).encode()
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    n = 200
    c = socket.create_connection((s.host, s.port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    try:
        for _ in range(5):  # the upstream connection opens, caches warm
            c.sendall(req)
            msg, buf = read_message(c, buf)
            assert msg is not None and msg.startswith(b"HTTP/1.1 200") and msg.endswith(ANSWER)
        out, log = tmp_path / "strace.out", tmp_path / "strace.log"
        with open(log, "w") as err:
            tr = subprocess.Popen([strace, "-f", "-c", "-o", str(out), "-p", str(s.p.proc.pid)], stderr=err)
        try:
            # "Process N attached with M threads": every thread at once
            helpers.wait_until(lambda: "attached" in log.read_text(), bound(10), what="strace attached")
            for _ in range(n):
                c.sendall(req)
                msg, buf = read_message(c, buf)
                assert msg is not None and msg.startswith(b"HTTP/1.1 200") and msg.endswith(ANSWER)
        finally:
            tr.send_signal(signal.SIGINT)
            tr.wait(bound(10))
    finally:
        c.close()
        up.close()
    calls = strace_counts(out)
    per = {k: v[0] / n for k, v in calls.items()}
    failed = {k: v[1] for k, v in calls.items() if v[1]}
    # one recv of the request, one of the answer; one sendmsg each way
    assert 1.99 <= per.get("recvfrom", 0) <= 2.02, calls
    assert 1.99 <= per.get("sendmsg", 0) <= 2.02, calls
    # two sleeps: for the request and for the answer (the worker's tick may add a few)
    assert 1.99 <= per.get("epoll_wait", 0) <= 2.1, calls
    # nothing else per request: no read(2) of a socket, no FIONREAD, no
    # interest changes, no other write; at most a few calls for the tick
    for k in ("read", "ioctl", "epoll_ctl", "write", "writev", "sendto", "readv"):
        assert per.get(k, 0) <= 0.03, (k, calls)
    # the allocator's calls apart (an ASan build maps its own memory: ~0.15
    # mmap a request here, 0 without it)
    mem = ("mmap", "munmap", "madvise", "mprotect", "brk")
    assert sum(v[0] for k, v in calls.items() if k not in mem) / n <= 6.1, calls
    assert sum(v[0] for k, v in calls.items() if k in mem) / n <= 0.5, calls
    # no call that found nothing to read (EAGAIN)
    assert sum(failed.values()) <= 2, failed
