"""
test_obs_status_page.py — the built-in status page in a real browser
(issue 14): headless Chromium (Debian's `chromium`) loads the page bytes
embedded in the build (build/gen/status_page.c, checked equal to
gateway/www/status.html) from a stub admin listener in this test, which
answers /admin/state from a script and /metrics with counters that grow by a
fixed step per scrape. After the page's polls, the rendered DOM must show:

- the server whose breaker the state says is open, shown open with its time
  left and out of service; the closed one closed and in service; a pool
  without a server in service marked so;
- the queue depth and the oldest age, the reload generation and failure;
- TTFT p50/p95/p99 computed from the bucket increases (50 of 100 under
  0.5 s, 90 under 1 s, all under 2 s: 0.5 s, 1.5 s, 1.9 s), the 5xx share
  (10 of 100) and a request rate;
- nothing fetched but /, /admin/state and /metrics (self-contained: no
  external assets, no favicon request).

A screenshot is saved as build/test-artifacts/status_page.png. Chromium's
virtual time (--virtual-time-budget) runs the page's poll timer without the
test waiting for it in real time.
"""

import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import threading

import pytest

import helpers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAGE_SRC = os.path.join(ROOT, "gateway", "www", "status.html")


def build_dir():
    return os.environ.get("SLUICE_BUILD") or os.path.join(ROOT, "build")


def embedded_page():
    """The bytes of sl_status_page[] as the generated C source holds them."""
    path = os.path.join(build_dir(), "gen", "status_page.c")
    with open(path, encoding="ascii") as f:
        src = f.read()
    body = re.search(r"sl_status_page\[\] = \{(.*?)\};", src, re.S).group(1)
    data = bytes(int(x, 16) for x in re.findall(r"0x([0-9a-f]{2})", body))
    n = int(re.search(r"sl_status_page_len = (\d+);", src).group(1))
    assert data[n:] == b"\0" and len(data) == n + 1
    return data[:n]


STATE = {
    "object": "sluice.state",
    "version": "0.9.0-test",
    "now": 1764632400.0,
    "uptime_seconds": 93784.0,
    "started_time": 1764538616.0,
    "draining": False,
    "reload": {"generation": 3, "last_time": 1764630000.0, "last_success_time": 1764620000.0,
               "last_result": "error", "last_error": "conf.yaml:12: upstreams.main: bad url"},
    "pools": [
        {"name": "main", "kind": "servers", "balance": "round_robin", "servers_total": 2,
         "servers_in_service": 1,
         "servers": [
             {"url": "http://10.0.0.5:8000", "weight": 1, "in_service": True,
              "breaker": {"state": "closed", "open_remaining_seconds": 0,
                          "consecutive_failures": 0},
              "connections": {"active": 3, "idle": 5}, "supervised": None},
             {"url": "http://10.0.0.6:8000", "weight": 1, "in_service": False,
              "breaker": {"state": "open", "open_remaining_seconds": 12.5,
                          "consecutive_failures": 5},
              "connections": {"active": 0, "idle": 0},
              "supervised": {"up": False, "restarts": 2}}]},
        {"name": "backup", "kind": "servers", "balance": "least_conn", "servers_total": 1,
         "servers_in_service": 0,
         "servers": [
             {"url": "http://10.0.1.9:8000", "weight": 1, "in_service": False,
              "breaker": {"state": "half_open", "open_remaining_seconds": 0,
                          "consecutive_failures": 7},
              "connections": {"active": 1, "idle": 0}, "supervised": None}]},
        {"name": "local", "kind": "engine", "servers_total": 1, "servers_in_service": 1,
         "servers": [], "engine": {"queue": 2, "busy": 1, "threads": 4, "tokens_per_second": 23.5}},
    ],
    "queue": {"store": "redis", "depth": 3, "oldest_pending_seconds": 42.0, "accepted": 120,
              "delivered": 115, "dead": 2},
    "ratelimit": {"store": "memory", "mode": "redis", "keys_tracked": 17},
    "models": [{"name": "chat-model", "upstream": "main", "local": "local", "queue": True}],
}


def metrics_text(n):
    """The exposition after n scrapes: every counter grows by a fixed step."""
    lines = [
        "# TYPE sluice_requests_total counter",
        'sluice_requests_total{route="chat_completions",code="2xx"} %d' % (90 * n),
        'sluice_requests_total{route="chat_completions",code="5xx"} %d' % (10 * n),
        "# TYPE sluice_tokens_total counter",
        'sluice_tokens_total{model="chat-model",kind="prompt"} %d' % (1000 * n),
        'sluice_tokens_total{model="chat-model",kind="completion"} %d' % (500 * n),
        "# TYPE sluice_time_to_first_token_seconds histogram",
    ]
    # chat-model: per scrape 100 first tokens, split over stream="true" and
    # "false" (the page sums them): 50 <= 0.5 s, 90 <= 1 s, 100 <= 2 s.
    for stream, share in (("true", 0.6), ("false", 0.4)):
        for le, c in (("0.5", 50), ("1", 90), ("2", 100), ("+Inf", 100)):
            lines.append('sluice_time_to_first_token_seconds_bucket{model="chat-model",'
                         'stream="%s",le="%s"} %g' % (stream, le, c * share * n))
        lines.append('sluice_time_to_first_token_seconds_count{model="chat-model",stream="%s"} %g'
                     % (stream, 100 * share * n))
    lines.append("process_open_fds 12")
    return "\n".join(lines) + "\n"


class Stub:
    """A stand-in admin listener: the page at /, the scripted state and
    metrics, a 404 for anything else; every path asked for is recorded."""

    def __init__(self, page, fail_state_after=None):
        self.page = page
        self.fail_state_after = fail_state_after  # /admin/state answers 503 after this many
        self.paths = []
        self.scrapes = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                with stub.lock:
                    stub.paths.append(path)
                    if path == "/metrics":
                        stub.scrapes += 1
                        n = stub.scrapes
                if path == "/":
                    self.reply(200, "text/html; charset=utf-8", stub.page)
                elif path == "/admin/state":
                    with stub.lock:
                        k = stub.paths.count("/admin/state")
                    if stub.fail_state_after is not None and k > stub.fail_state_after:
                        self.reply(503, "application/json", b'{"error":{"message":"down",'
                                   b'"type":"server_error","code":"upstream_unavailable"}}')
                    else:
                        self.reply(200, "application/json", json.dumps(STATE).encode())
                elif path == "/metrics":
                    self.reply(200, "text/plain; version=0.0.4", metrics_text(n).encode())
                else:
                    self.reply(404, "application/json", b'{"error":{"message":"no",'
                               b'"type":"invalid_request_error","code":"not_found"}}')

            def reply(self, status, ctype, body):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class DOM(html.parser.HTMLParser):
    """Elements as (tag, attrs, text): enough to find data-* attributes and
    read an element's text."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "polyline"}

    def __init__(self, text):
        super().__init__()
        self.elems, self.stack = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elems.append(e)
        if tag not in self.VOID:
            self.stack.append(e)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for e in self.stack:
            e["text"] += data

    def find(self, **attrs):
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [e for e in self.elems if all(e["attrs"].get(k) == v for k, v in want.items())]

    def one(self, **attrs):
        found = self.find(**attrs)
        assert len(found) == 1, (attrs, found)
        return found[0]


def chromium(url, tmp_path, *extra):
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed (scripts/deps.sh installs it)"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
           "--user-data-dir=%s" % (tmp_path / "chromium-profile"),
           "--virtual-time-budget=3000"] + list(extra) + [url]
    p = subprocess.run(cmd, capture_output=True, timeout=helpers.bound(30))
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]
    return p.stdout.decode("utf-8", "replace")


@pytest.fixture
def stub():
    with open(PAGE_SRC, "rb") as f:
        src = f.read()
    page = embedded_page()
    assert page == src, "build/gen/status_page.c is not gateway/www/status.html: run make"
    s = Stub(page)
    yield s
    s.close()


@pytest.mark.timeout(60)
def test_status_page_renders_state_and_metrics(stub, tmp_path):
    url = "http://127.0.0.1:%d/?interval=250" % stub.port
    dom = DOM(chromium(url, tmp_path, "--dump-dom"))

    ps = dom.one(id="poll-status")
    assert ps["text"] == "ok", ps
    assert int(ps["attrs"]["data-polls"]) >= 3, ps

    # breakers and service as the state says
    bad = dom.one(data_server="http://10.0.0.6:8000")
    assert bad["attrs"]["data-breaker"] == "open"
    assert bad["attrs"]["data-in-service"] == "false"
    assert "open (12.5 s)" in bad["text"], bad["text"]
    assert "down, 2 restarts" in bad["text"], bad["text"]
    good = dom.one(data_server="http://10.0.0.5:8000")
    assert good["attrs"]["data-breaker"] == "closed"
    assert good["attrs"]["data-in-service"] == "true"
    assert "3 / 5" in good["text"]  # active / idle connections
    half = dom.one(data_server="http://10.0.1.9:8000")
    assert half["attrs"]["data-breaker"] == "half_open"
    assert "half-open" in half["text"]
    assert dom.one(data_pool="main")["attrs"]["data-in-service"] == "1"
    backup = dom.one(data_pool="backup")
    assert backup["attrs"]["data-in-service"] == "0"
    assert "0 / 1 in service" in backup["text"]
    eng = dom.one(data_engine="local")
    assert (eng["attrs"]["data-queue"], eng["attrs"]["data-busy"]) == ("2", "1")

    # queue, reload, header
    qd = dom.one(id="queue-depth")
    assert (qd["text"], qd["attrs"]["data-value"]) == ("3", "3")
    assert dom.one(id="queue-oldest")["text"] == "42 s"
    assert dom.one(id="reload-gen")["text"] == "3"
    assert "failed: conf.yaml:12" in dom.one(id="reload-result")["text"]
    assert dom.one(id="version")["text"] == "0.9.0-test"
    assert dom.one(id="uptime")["text"] == "26.1 h"
    assert dom.one(id="rl-keys")["text"] == "17"
    assert dom.one(id="rl-mode")["text"] == "memory, redis"

    # from /metrics: quantiles from bucket increases, the 5xx share, a rate
    row = dom.one(data_ttft_model="chat-model")
    p50, p95, p99 = (float(row["attrs"][k]) for k in ("data-p50", "data-p95", "data-p99"))
    assert abs(p50 - 0.5) < 1e-9 and abs(p95 - 1.5) < 1e-9 and abs(p99 - 1.9) < 1e-9, row
    assert "500 ms" in row["text"] and "1.5 s" in row["text"] and "1.9 s" in row["text"]
    assert abs(float(dom.one(id="err-ratio")["attrs"]["data-value"]) - 0.1) < 1e-9
    assert dom.one(id="err-ratio")["text"] == "10 %"
    assert float(dom.one(id="req-rate")["attrs"]["data-value"]) > 0
    assert dom.one(id="tok-rate")["text"] not in ("", "–")

    # self-contained: nothing but the page and its two sources was fetched
    with stub.lock:
        paths = list(stub.paths)
    assert set(paths) <= {"/", "/admin/state", "/metrics"}, paths
    assert paths.count("/admin/state") >= 3 and paths.count("/metrics") >= 3


@pytest.mark.timeout(60)
def test_status_page_screenshot(stub, tmp_path):
    out_dir = os.path.join(build_dir(), "test-artifacts")
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, "status_page.png")
    if os.path.exists(png):
        os.unlink(png)
    url = "http://127.0.0.1:%d/?interval=250" % stub.port
    chromium(url, tmp_path, "--window-size=1280,1000", "--screenshot=%s" % png)
    with open(png, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 1000), (width, height)
    assert len(data) > 20000, len(data)  # a drawn page, not a blank one
    assert stub.paths.count("/admin/state") >= 2


@pytest.mark.timeout(60)
def test_status_page_keeps_the_last_state_when_a_poll_fails(tmp_path):
    """/admin/state answers 503 after two polls: the page says it is stale,
    with the error, and keeps drawing the last state it got."""
    s = Stub(embedded_page(), fail_state_after=2)
    try:
        url = "http://127.0.0.1:%d/?interval=250" % s.port
        dom = DOM(chromium(url, tmp_path, "--dump-dom"))
    finally:
        s.close()
    ps = dom.one(id="poll-status")
    assert ps["text"].startswith("stale: /admin/state: HTTP 503"), ps
    assert ps["attrs"]["class"] == "stale"
    assert ps["attrs"]["data-polls"] == "2", ps  # the two good ones
    assert dom.one(data_server="http://10.0.0.6:8000")["attrs"]["data-breaker"] == "open"
    assert dom.one(id="queue-depth")["text"] == "3"
    assert s.paths.count("/admin/state") > 3  # it kept polling
