"""
test_fallback_supervise.py — a local model server that sluice starts and
supervises from conf (issue 6, part 3: `upstreams.<name>.command`): it gets
no traffic until its health check (GET /v1/models) answers, it is restarted
with backoff when it dies (traffic meanwhile goes down the chain), a reload
may not change the command, and it is stopped with sluice.
"""
import os
import signal
import time

import helpers
from helpers import bound, chat_body, wait_until

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MOCK = os.path.join(ROOT, "tests", "mock_upstream.py")


def ready(s):
    r = helpers.request("127.0.0.1", s.admin_port, "GET", "/readyz")
    return r.json()["upstreams"]["local"]["in_service"] == 1


def pid_listening(port):
    """The pid of the process listening on port (from /proc), or None."""
    want = ":%04X" % port
    inodes = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[1].endswith(want) and parts[3] == "0A":
                inodes.add(parts[9])
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def sup_conf(port, mock_url):
    return {
        "upstreams": {
            "main": {"servers": [{"url": mock_url}]},
            "local": {
                "servers": [{"url": "http://127.0.0.1:%d" % port}],
                "command": ["/usr/bin/python3", MOCK, "--port", str(port), "--name", "supervised"],
            },
        },
        "models": {"small": {"upstream": "local"}},
        "fallback": {"local": {"upstream": "local"}, "template": {"enabled": True}},
    }


def test_supervised_server_starts_restarts_and_stops(sluice_factory, mock):
    port = helpers.free_port()
    s = sluice_factory(sup_conf(port, mock.url), upstream=mock)
    # no traffic before its health check passes; then it serves
    wait_until(lambda: ready(s), bound(15), what="the supervised server healthy")
    r = s.request("POST", "/v1/chat/completions", chat_body("hi", model="small"))
    assert r.status == 200 and r.header("X-Sluice-Fallback") is None
    first = pid_listening(port)
    assert first, "nothing listens where the command should"
    # it dies: out of service at once (the chain answers), then restarted
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not ready(s), bound(5), what="the dead server out of service")
    r = s.request("POST", "/v1/chat/completions", chat_body("hi", model="small"))
    assert r.status == 200 and r.header("X-Sluice-Fallback") == "template"
    wait_until(lambda: ready(s), bound(20), what="the server restarted and healthy")
    second = pid_listening(port)
    assert second and second != first
    text = s.metrics_text()
    assert 'sluice_supervised_restarts_total{upstream="local"} 1' in text, text
    assert 'sluice_supervised_up{upstream="local"} 1' in text
    # a reload that changes the command is refused; the server keeps running
    conf = helpers.deep_merge(s.conf, {})
    conf["upstreams"]["local"]["command"] = ["/bin/true"]
    old = s.conf
    s.reload(conf)
    s.conf = old
    wait_until(lambda: "command: changed; needs a restart" in s.p.tail(), bound(5),
               what="the reload refused")
    assert pid_listening(port) == second
    # sluice stops it on the way out
    s.term()
    assert s.wait_exit(bound(15)) == 0
    deadline = time.monotonic() + bound(5)
    while pid_listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the child's exit after sluice's own
    assert pid_listening(port) is None
