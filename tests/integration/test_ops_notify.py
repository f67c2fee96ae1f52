"""
test_ops_notify.py — sluice under Type=notify (issue 13, item 2), seen from
systemd's side: a unix datagram socket that NOTIFY_SOCKET names, as
systemd's, with SO_PASSCRED so each message's sender pid is checked.

    READY=1                          once the listeners accept
    RELOADING=1 + MONOTONIC_USEC=    on SIGHUP, then READY=1 when it is done
    STOPPING=1                       when a SIGTERM drain starts
    WATCHDOG=1                       every WATCHDOG_USEC/2 or faster

The protocol itself (common/sdnotify.c) is unit-tested in
tests/unit/test_sdnotify.c. These tests are the gateway's side: where
gateway/server.c calls it (docs/ops.md, "Wiring").
"""

import os
import signal
import socket
import struct
import time

import pytest

from helpers import bound, wait_until

class NotifySocket:
    """An abstract-namespace datagram socket like systemd's notify socket."""

    def __init__(self):
        self.name = "sluice-notify-%d-%d" % (os.getpid(), time.monotonic_ns())
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind("\0" + self.name)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.got = []  # (pid, text)

    @property
    def env(self):
        return {"NOTIFY_SOCKET": "@" + self.name, "WATCHDOG_USEC": None, "WATCHDOG_PID": None}

    def drain(self):
        """Reads every queued datagram (non-blocking)."""
        while True:
            try:
                data, anc, _, _ = self.s.recvmsg(4096, socket.CMSG_SPACE(12), socket.MSG_DONTWAIT)
            except BlockingIOError:
                return self.got
            pid = None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", cdata[:12])[0]
            self.got.append((pid, data.decode()))

    def texts(self):
        return [t for _, t in self.drain()]

    def wait_for(self, pred, timeout, what):
        wait_until(lambda: pred(self.texts()), bound(timeout), what=what)
        return self.got

    def close(self):
        self.s.close()


_never_ready = []  # set once a start brought no READY=1: later tests fail at once


def wait_ready_msg(nsock):
    """Waits for READY=1 after a start; returns the datagrams so far."""
    assert not _never_ready, "an earlier start of this module sent no READY=1"
    try:
        return nsock.wait_for(lambda t: "READY=1" in t, 2, "READY=1 at start")
    except AssertionError:
        _never_ready.append(True)
        raise


@pytest.fixture
def nsock():
    n = NotifySocket()
    yield n
    n.close()


def readyz(s):
    try:
        return s.admin("GET", "/readyz", timeout=1).status == 200
    except OSError:
        return False


def test_ready_once_listeners_accept(sluice_factory, nsock):
    s = sluice_factory(env=nsock.env)
    wait_until(lambda: readyz(s), bound(10), what="/readyz")
    got = wait_ready_msg(nsock)
    assert [t for _, t in got] == ["READY=1"]  # once, nothing before it
    assert got[0][0] == s.p.proc.pid  # from sluice itself
    with socket.create_connection((s.host, s.port), timeout=2):
        pass


def test_reload_is_bracketed_by_reloading_and_ready(sluice_factory, nsock):
    s = sluice_factory(env=nsock.env)
    wait_ready_msg(nsock)
    nsock.got.clear()
    t0 = time.monotonic_ns() // 1000
    s.reload()
    got = nsock.wait_for(lambda t: "READY=1" in t, 5, "READY=1 after the reload")
    t1 = time.monotonic_ns() // 1000
    texts = [t for _, t in got]
    assert len(texts) == 2, texts
    first = texts[0].split("\n")
    assert first[0] == "RELOADING=1"
    assert first[1].startswith("MONOTONIC_USEC=")
    usec = int(first[1].split("=", 1)[1])
    assert t0 <= usec <= t1  # CLOCK_MONOTONIC, as systemd compares it
    assert texts[1] == "READY=1"
    assert all(pid == s.p.proc.pid for pid, _ in got)


def test_refused_reload_still_ends_with_ready(sluice_factory, nsock):
    s = sluice_factory(env=nsock.env)
    wait_ready_msg(nsock)
    nsock.got.clear()
    s.write_conf_text("listen: [\n")  # broken: the old conf keeps serving
    s.p.signal(signal.SIGHUP)
    texts = [t for _, t in nsock.wait_for(lambda t: "READY=1" in t, 5, "READY=1")]
    assert texts[0].startswith("RELOADING=1\n") and texts[-1] == "READY=1", texts


def test_stopping_when_the_drain_starts(sluice_factory, nsock):
    s = sluice_factory(env=nsock.env)
    wait_ready_msg(nsock)
    s.term()
    assert s.wait_exit(bound(10)) == 0
    texts = nsock.texts()
    assert "STOPPING=1" in texts, texts
    assert texts.count("STOPPING=1") == 1


def test_watchdog_pings_within_half_the_interval(sluice_factory, nsock):
    env = dict(nsock.env, WATCHDOG_USEC="400000")  # 0.4 s: ping every <= 0.2 s
    sluice_factory(env=env)
    wait_ready_msg(nsock)
    t0 = time.monotonic()
    nsock.wait_for(lambda t: t.count("WATCHDOG=1") >= 5, 3, "five WATCHDOG=1")
    # five pings at <= 0.2 s apart take <= 1 s (stretched for slow builds,
    # plus scheduling slack); pinging only every 0.4 s would take 2 s
    assert time.monotonic() - t0 <= bound(1.0) + 0.5


def test_no_notify_socket_no_messages(sluice_factory, nsock):
    # NOTIFY_SOCKET unset (a terminal, the tests): the socket hears nothing,
    # and sluice runs and stops normally.
    s = sluice_factory(env={"NOTIFY_SOCKET": None})
    wait_until(lambda: readyz(s), bound(10), what="/readyz")
    s.reload()
    s.term()
    assert s.wait_exit(bound(10)) == 0
    assert nsock.texts() == []
