"""
test_ops_signals.py — the operator's signals (issue 13, item 3; docs/ops.md):

    SIGUSR1   reopen the access and error logs (logrotate moves the file,
              then sends it): the lines after it go to a new file at the old
              path, none are lost
    SIGQUIT   graceful stop, the same as SIGTERM (exit 0 once drained)

SIGHUP is test_core_reload.py / test_ops_reload.py, SIGUSR2 test_ops_upgrade.py.
"""

import json
import os
import signal
import threading
import time

from helpers import bound, chat_body, wait_until


def lines(path):
    """The access log's chat lines (the readiness probes' /healthz are there too)."""
    try:
        with open(path) as f:
            objs = [json.loads(ln) for ln in f if ln.strip()]
    except FileNotFoundError:
        return []
    return [o for o in objs if o.get("route") == "chat_completions"]


def text(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def logged_conf(tmp_path):
    return {
        "log": {
            "access": str(tmp_path / "access.log"),
            "error": str(tmp_path / "error.log"),
            "level": "info",
        }
    }


def test_usr1_reopens_both_logs_after_a_move(sluice_factory, tmp_path):
    s = sluice_factory(logged_conf(tmp_path))
    acc, err = tmp_path / "access.log", tmp_path / "error.log"
    for i in range(5):
        assert s.chat("before %d" % i).status == 200
    wait_until(lambda: len(lines(acc)) == 5, bound(5), what="5 access lines")
    assert "sluice started" in text(err)  # the error log went to the file, not stderr
    assert "sluice started" not in s.stderr_text()

    os.rename(acc, tmp_path / "access.log.1")
    os.rename(err, tmp_path / "error.log.1")
    for i in range(3):  # still the moved file: logrotate has not signalled yet
        assert s.chat("moved %d" % i).status == 200
    wait_until(lambda: len(lines(tmp_path / "access.log.1")) == 8, bound(5), what="8 lines")
    assert not acc.exists()

    s.p.signal(signal.SIGUSR1)
    wait_until(lambda: "logs reopened" in text(err), bound(5), what="a new error.log")
    assert acc.exists()  # created at once, even before a request
    for i in range(4):
        assert s.chat("after %d" % i).status == 200
    wait_until(lambda: len(lines(acc)) == 4, bound(5), what="4 lines in the new access.log")

    old, new = lines(tmp_path / "access.log.1"), lines(acc)
    assert len(old) == 8 and len(new) == 4
    assert len({e["id"] for e in old + new}) == 12
    assert "logs reopened" not in text(tmp_path / "error.log.1")
    assert s.alive()


def test_usr1_under_load_loses_no_line(sluice_factory, tmp_path):
    s = sluice_factory(logged_conf(tmp_path))
    acc = tmp_path / "access.log"
    stop = threading.Event()
    done = []
    errors = []

    def load():
        with s.client(timeout=bound(10)) as c:
            while not stop.is_set():
                r = c.request("POST", "/v1/chat/completions", chat_body("rotate"))
                (done if r.status == 200 else errors).append(r.status)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for n in range(1, 4):  # three rotations while requests run
        wait_until(lambda: len(done) >= 20 * n, bound(10), what="requests")
        # the file about to be moved has lines of its own (requests counted
        # above may still have been written to the previous one)
        wait_until(lambda: len(lines(acc)) > 0, bound(10), what="lines in the reopened file")
        os.rename(acc, tmp_path / ("access.log.%d" % n))
        s.p.signal(signal.SIGUSR1)
        wait_until(acc.exists, bound(5), what="access.log reopened")
    wait_until(lambda: len(done) >= 80, bound(10), what="requests after the last rotation")
    wait_until(lambda: len(lines(acc)) > 0, bound(10), what="lines after the last reopen")
    stop.set()
    for t in threads:
        t.join(bound(10))
    assert not errors
    files = [acc] + [tmp_path / ("access.log.%d" % n) for n in range(1, 4)]
    wait_until(
        lambda: sum(len(lines(f)) for f in files) == len(done), bound(5), what="every line"
    )
    per_file = [len(lines(f)) for f in files]
    assert all(n > 0 for n in per_file), per_file  # each file got its share
    ids = [e["id"] for f in files for e in lines(f)]
    assert len(ids) == len(set(ids)) == len(done)


def test_usr1_with_stdout_logs_is_harmless(sluice):
    assert sluice.chat("one").status == 200
    sluice.p.signal(signal.SIGUSR1)
    wait_until(lambda: "logs reopened" in sluice.stderr_text(), bound(5), what="reopen")
    assert sluice.chat("two").status == 200
    chats = lambda: [e for e in sluice.access_log() if e.get("route") == "chat_completions"]
    wait_until(lambda: len(chats()) == 2, bound(5), what="2 access lines on stdout")
    assert sluice.alive()


def test_quit_drains_like_term(sluice_factory, mock):
    s = sluice_factory({"shutdown_timeout": "20s"})
    mock.script({"stall_first_byte": 0.5})
    out = {}

    def call():
        out["r"] = s.chat("in flight")

    t = threading.Thread(target=call)
    t.start()
    mock.wait_requests(1)
    s.p.signal(signal.SIGQUIT)
    t.join(bound(10))
    assert out["r"].status == 200
    assert s.wait_exit(bound(5)) == 0
    assert "draining" in s.stderr_text()


def conns(s):
    return s.metrics().value("sluice_connections_active")


def test_drain_serves_a_connection_that_had_not_sent_its_request_yet(sluice_factory):
    # Accepted before the drain, request bytes not there yet (a client that
    # connected a moment before SIGTERM, or before an upgrade's old process
    # stopped accepting): served, then closed; not cut as an idle keep-alive.
    s = sluice_factory({"shutdown_timeout": "20s"})
    n0 = conns(s)
    with s.client(timeout=bound(10)) as c:
        wait_until(lambda: conns(s) >= n0 + 1, bound(5), what="the connection accepted")
        s.term()
        wait_until(lambda: "draining" in s.stderr_text(), bound(5), what="the drain")
        r = c.request("POST", "/v1/chat/completions", chat_body("late"))
        assert r.status == 200, r
        assert "close" in (r.header("Connection") or "").lower()
    assert s.wait_exit(bound(5)) == 0


def test_drain_does_not_wait_long_for_a_silent_connection(sluice_factory):
    s = sluice_factory({"shutdown_timeout": "20s"})
    n0 = conns(s)
    with s.client(timeout=bound(10)):
        wait_until(lambda: conns(s) >= n0 + 1, bound(5), what="the connection accepted")
        t0 = time.monotonic()
        s.term()
        assert s.wait_exit(bound(10)) == 0  # a second of grace, not shutdown_timeout's 20 s
        assert time.monotonic() - t0 < bound(3)
