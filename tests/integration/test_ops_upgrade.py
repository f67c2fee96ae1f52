"""
test_ops_upgrade.py — the SIGUSR2 binary upgrade (issue 13, item 3;
gateway/upgrade.c, docs/ops.md): the running process starts its binary
again with the listening sockets inherited; once the new process is ready
the old one drains and exits. Under load (a loop of requests on fresh
connections plus SSE streams held open through the mock) no request fails
and no stream breaks, and afterwards the new pid serves. A new binary that
fails to start leaves the old one serving (and a later upgrade still works).

Each test runs a copy of the binary from its tmp dir, so that it can be
replaced, as a package upgrade replaces /usr/sbin/sluice.
"""

import os
import re
import shutil
import signal
import threading

import pytest

from helpers import bound, chat_body, wait_until
from test_ops_notify import NotifySocket


def own_binary(s, tmp_path):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "sluice"
    shutil.copy2(s.bin, exe)
    s.bin = str(exe)
    return exe


def started_pids(s):
    return [int(p) for p in re.findall(r"sluice started: .*, pid (\d+)", s.stderr_text())]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def stop_pid(pid):
    """SIGTERM the new process (not our child: its parent was the old one)."""
    if not gone(pid):
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: gone(pid), bound(15), what="pid %d to exit" % pid)


@pytest.mark.timeout(120)
def test_upgrade_under_load_loses_nothing(sluice_factory, mock, tmp_path):
    nsock = NotifySocket()
    s = sluice_factory({"shutdown_timeout": "30s"}, env=nsock.env, start=False)
    exe = own_binary(s, tmp_path)
    s.start()
    old = s.p.proc.pid
    assert started_pids(s) == [old]
    new = None
    try:
        # Four streams held open by the mock through the old process.
        mock.script(*[{"gate": True, "events": 3}] * 4)
        clients, streams = [], []
        for i in range(4):
            c = s.client(timeout=bound(30))
            clients.append(c)
            r, evs = c.stream("POST", "/v1/chat/completions", chat_body("s%d" % i, stream=True))
            assert r.status == 200
            evs = (e for e in evs if e.data is not None)
            streams.append([next(evs)])
            streams[-1].append(evs)
        held = [q["id"] for q in mock.wait_requests(4)]

        # A loop of requests, each on a fresh connection, all along.
        stop = threading.Event()
        ok, failed = [], []

        def load():
            while not stop.is_set():
                try:
                    r = s.chat("loop")
                    (ok if r.status == 200 else failed).append(r.status)
                except Exception as e:  # a refused or reset connection is a failure
                    failed.append(repr(e))

        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: len(ok) >= 20, bound(10), what="load before the upgrade")

        os.utime(exe)  # "a new binary": the same path, run again
        s.p.signal(signal.SIGUSR2)
        wait_until(lambda: len(started_pids(s)) == 2, bound(20), what="the new process to start")
        new = started_pids(s)[1]
        assert new != old
        wait_until(lambda: "is ready; draining this one" in s.stderr_text(), bound(10),
                   what="the old process to hear the new one is ready")
        assert s.alive()  # draining: the streams are still open
        n_at_swap = len(ok)
        wait_until(lambda: len(ok) >= n_at_swap + 20, bound(10), what="load during the drain")

        # The streams through the old process finish, whole.
        for rid in held:
            mock.release(n=100, request=rid)
        for c, st in zip(clients, streams):
            first, rest = st[0], list(st[1])
            got = [first] + rest
            assert got[-1].is_done and len(got) == 3 + 2, [e.data for e in got]
            c.close()
        assert s.wait_exit(bound(10)) == 0  # the old one is gone
        n_after_old = len(ok)
        wait_until(lambda: len(ok) >= n_after_old + 20, bound(10), what="load on the new pid")
        stop.set()
        for t in threads:
            t.join(bound(10))
        assert not failed, failed[:5]
        assert len(ok) >= n_after_old + 20
        # Served by the new pid now: the old one has exited, the listener answers.
        assert not gone(new) and gone(old)
        assert s.chat("after").status == 200

        # systemd's side: MAINPID from the new process, no STOPPING from either.
        got = nsock.drain()
        texts = [t for _, t in got]
        assert ("%d" % new, "MAINPID=%d\nREADY=1" % new) in [(str(p), t) for p, t in got], got
        assert "STOPPING=1" not in texts, texts
    finally:
        if new:
            stop_pid(new)
        nsock.close()


def test_failed_upgrade_keeps_the_old_one_serving(sluice_factory, mock, tmp_path):
    s = sluice_factory(start=False)
    exe = own_binary(s, tmp_path)
    s.start()
    pid = s.p.proc.pid
    real = tmp_path / "sluice.real"
    shutil.copy2(exe, real)
    script = tmp_path / "bin" / "sluice.new"
    script.write_text("#!/bin/sh\necho 'broken build' >&2\nexit 1\n")
    script.chmod(0o755)
    os.replace(script, exe)  # as a package replaces the file

    s.p.signal(signal.SIGUSR2)
    wait_until(lambda: "upgrade failed" in s.stderr_text(), bound(10), what="the failure logged")
    err = s.stderr_text()
    assert re.search(r"upgrade failed: .*sluice exited before it was ready \(exit status 1\)", err), err[-800:]
    assert s.alive() and s.chat("still here").status == 200
    assert started_pids(s) == [pid]
    assert s.admin("GET", "/readyz").status == 200

    # fixed binary, second try: the state of the failed one is gone
    os.replace(real, exe)
    s.p.signal(signal.SIGUSR2)
    wait_until(lambda: len(started_pids(s)) == 2, bound(20), what="the new process")
    new = started_pids(s)[1]
    try:
        assert s.wait_exit(bound(10)) == 0  # idle: the old one exits at once
        assert s.chat("new one").status == 200
    finally:
        stop_pid(new)


def test_upgrade_refused_while_one_is_under_way_is_logged(sluice_factory, mock, tmp_path):
    s = sluice_factory(start=False)
    exe = own_binary(s, tmp_path)
    # a "new binary" that takes its time and then fails: the second USR2
    # arrives while the first is still starting
    hold = tmp_path / "hold"
    script = tmp_path / "bin" / "sluice.new"
    s.start()
    script.write_text("#!/bin/sh\nwhile [ ! -e %s ]; do sleep 0.05; done\nexit 3\n" % hold)
    script.chmod(0o755)
    os.replace(script, exe)
    s.p.signal(signal.SIGUSR2)
    wait_until(lambda: "upgrade: started" in s.stderr_text(), bound(10), what="the first upgrade")
    s.p.signal(signal.SIGUSR2)
    wait_until(lambda: "upgrade refused: an upgrade is already under way" in s.stderr_text(),
               bound(10), what="the second refused")
    hold.touch()
    wait_until(lambda: "exit status 3" in s.stderr_text(), bound(10), what="the first one failing")
    assert s.chat("fine").status == 200


def test_upgrade_refused_with_a_supervised_model_server(sluice_factory, mock, tmp_path):
    # The new process would start a second model server on the same port:
    # refused, logged, nothing started, the old one serves on.
    from test_fallback_supervise import ready, sup_conf

    from helpers import free_port

    s = sluice_factory(sup_conf(free_port(), mock.url))
    wait_until(lambda: ready(s), bound(20), what="the supervised server in service")
    s.p.signal(signal.SIGUSR2)
    wait_until(lambda: "upgrade refused: upstreams.local.command" in s.stderr_text(), bound(5),
               what="the refusal logged")
    assert "upgrade: started" not in s.stderr_text()
    assert started_pids(s) == [s.p.proc.pid]
    assert s.alive() and s.chat("still").status == 200
