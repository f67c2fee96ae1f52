"""
fallback_helpers.py — what the black-box tests of the fallback chain and the
chaos drills (issue 6: test_fallback_*.py, test_chaos_*.py) share, on top of
helpers.py: conf overrides that turn tiers on (base_conf() turns the chain
off for the core tests), a many-clients sender on keep-alive connections,
checks of the template's JSON and SSE shapes, metric deltas, and the
"nothing left behind" check (sluice's client connections and streams back to
0, the mock's connections closed).

Stdlib only. Nothing here sleeps to synchronise: waits poll with deadlines.
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import helpers
from helpers import bound, wait_until

DEFAULT_TEXT = "我现在网络不太顺畅，稍后再试试吧。"
EN_TEXT = "The network is not stable right now, please try again shortly."
FR_TEXT = "Le réseau est instable, réessayez bientôt."
CHAT = "/v1/chat/completions"


def chain(retry=None, circuit=None, local=None, template=True, queue=None, idempotency=None,
          texts=None):
    """The `fallback:` overrides: template on or off, retry/circuit/queue
    sections merged as given. Default: no retries (tests that retry say
    so), breaker with the built-in defaults."""
    fb = {"retry": {"attempts": 0}, "template": {"enabled": bool(template)}}
    if retry is not None:
        fb["retry"] = retry
    if circuit is not None:
        fb["circuit"] = circuit
    if local is not None:
        fb["local"] = {"upstream": local}
    if texts is not None:
        fb["template"]["texts"] = texts
    if queue is not None:
        fb["queue"] = queue
    if idempotency is not None:
        fb["idempotency"] = idempotency
    return {"fallback": fb}


def second_upstream(name, mock, **extra):
    """An `upstreams:` entry for another pool (e.g. the local tier)."""
    u = {"servers": [{"url": mock if isinstance(mock, str) else mock.url}],
         "timeouts": {"connect": "2s", "first_byte": "10s", "total": "60s"}}
    u.update(extra)
    return {"upstreams": {name: u}}


def merge(*overrides):
    out = {}
    for o in overrides:
        out = helpers.deep_merge(out, o)
    return out


def dead_url():
    """http://127.0.0.1:PORT where nothing listens (connect refused)."""
    return "http://127.0.0.1:%d" % helpers.free_port()


# ---- sending -------------------------------------------------------------------------


class Sender:
    """Sends many requests from `workers` threads, each on its own keep-alive
    connection (reopened when the server closed it). Returns the responses
    in the order of `bodies`; an exception is returned in place of a
    response (status 0) so a test can count them."""

    def __init__(self, sluice, workers=8, timeout=20):
        self.s = sluice
        self.workers = workers
        self.timeout = timeout
        self.local = threading.local()

    def _client(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.s.client(timeout=self.timeout)
            self.local.c = c
        return c

    def _drop(self):
        c = getattr(self.local, "c", None)
        if c is not None:
            c.close()
        self.local.c = None

    def one(self, body, headers=None, path=CHAT):
        for attempt in range(2):
            try:
                c = self._client()
                r = c.request("POST", path, body, headers)
                if r.closed or "close" in ",".join(r.header_all("Connection")).lower():
                    self._drop()
                return r
            except (OSError, helpers.ProtocolError) as e:
                self._drop()
                if attempt == 1:
                    r = helpers.Response(0, repr(e), "1.1", [])
                    r.error = e
                    return r
        raise AssertionError("unreachable")

    def run(self, bodies, headers=None, path=CHAT):
        hs = headers if isinstance(headers, list) else [headers] * len(bodies)
        with ThreadPoolExecutor(self.workers) as ex:
            futs = [ex.submit(self.one, b, h, path) for b, h in zip(bodies, hs)]
            out = [f.result() for f in futs]
        return out


def statuses(responses):
    out = {}
    for r in responses:
        out[r.status] = out.get(r.status, 0) + 1
    return out


# ---- the template's shapes -----------------------------------------------------------


def assert_template_json(r, text=DEFAULT_TEXT, model="chat-model", api="chat"):
    """A template answer as a whole JSON document: status 200, the header,
    a chat.completion (or text_completion) with the text, usage zeros."""
    assert r.status == 200, r
    assert r.header("X-Sluice-Fallback") == "template", r.headers
    assert (r.header("Content-Type") or "").startswith("application/json"), r.headers
    j = r.json()
    assert j["object"] == ("chat.completion" if api == "chat" else "text_completion"), j
    assert isinstance(j["id"], str) and j["id"], j
    assert isinstance(j["created"], int) and j["created"] > 1600000000, j
    assert j["model"] == model, j
    (ch,) = j["choices"]
    assert ch["index"] == 0 and ch["finish_reason"] == "stop", ch
    if api == "chat":
        msg = {k: v for k, v in ch["message"].items() if v is not None}  # refusal: null
        assert msg == {"role": "assistant", "content": text}, ch
    else:
        assert ch["text"] == text, ch
    assert j["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, j
    return j


def assert_template_events(r, events, text=DEFAULT_TEXT, model="chat-model", usage=False,
                           api="chat"):
    """A template answer as an SSE stream: 200, text/event-stream, chunks
    whose deltas join to the text, the role first, finish_reason stop, the
    usage chunk when asked, then [DONE] last and nothing after it."""
    assert r.status == 200, r
    assert r.header("X-Sluice-Fallback") == "template", r.headers
    assert (r.header("Content-Type") or "").startswith("text/event-stream"), r.headers
    assert r.complete, "the stream did not end with its terminating chunk"
    assert events and events[-1].is_done, events
    datas = [e.json() for e in events[:-1]]
    want = "chat.completion.chunk" if api == "chat" else "text_completion"
    got, finishes, usages, ids = "", [], [], set()
    for d in datas:
        assert d["object"] == want and d["model"] == model, d
        ids.add(d["id"])
        if not d["choices"]:
            usages.append(d["usage"])
            continue
        (ch,) = d["choices"]
        if api == "chat":
            got += ch["delta"].get("content") or ""
        else:
            got += ch.get("text") or ""
        if ch.get("finish_reason"):
            finishes.append(ch["finish_reason"])
    assert len(ids) == 1, ids
    assert got == text, got
    assert finishes == ["stop"], finishes
    if api == "chat":
        assert datas[0]["choices"][0]["delta"].get("role") == "assistant", datas[0]
    if usage:
        assert usages == [{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}], usages
        assert datas[-1]["choices"] == [], "the usage chunk comes last before [DONE]"
    else:
        assert usages == [], usages
    return datas


def stream(sluice, body, headers=None, timeout=10, path=CHAT):
    """One streamed request on a fresh connection: (response, events)."""
    with sluice.client(timeout=timeout) as c:
        r, it = c.stream("POST", path, body, headers)
        evs = list(it)
    return r, evs


def is_template(r):
    return r.status == 200 and r.header("X-Sluice-Fallback") == "template"


# ---- metrics ----------------------------------------------------------------------------


class Metrics:
    """A snapshot of /metrics; delta(other, name, **labels) = other - self."""

    def __init__(self, sluice):
        self.s = sluice
        self.m = sluice.metrics()

    def value(self, name, **labels):
        return self.m.value(name, **labels)

    def delta(self, name, **labels):
        return self.s.metrics().value(name, **labels) - self.m.value(name, **labels)


def route_requests(samples, route, code):
    """sluice_requests_total of one route label (chat_completions,
    completions, requests, ...) and status class (2xx, 5xx, ...), from a
    parsed exposition."""
    return samples.value("sluice_requests_total", route=route, code=code)


def metric(sluice, name, **labels):
    return sluice.metrics().value(name, **labels)


# ---- nothing left behind ------------------------------------------------------------------


def assert_nothing_left(sluice, mocks=(), timeout=None):
    """sluice holds no client connection or stream, and every connection
    the mocks saw is closed (use upstreams with keepalive: 0, or wait for
    sluice's idle timeout)."""
    timeout = timeout or bound(10)
    # The admin connection reading /metrics is itself counted: 1 is "none".
    wait_until(lambda: metric(sluice, "sluice_connections_active") == 1, timeout,
               what="sluice_connections_active back to 0 (1: the /metrics request)")
    assert metric(sluice, "sluice_streams_active") == 0
    for m in mocks:
        wait_until(lambda m=m: all(c["closed"] is not None for c in m.connections()), timeout,
                   what="every connection of mock %s closed" % m.name)


def mock_ids(mock, header="X-Request-Id"):
    """The value of `header` of every model request the mock got."""
    out = []
    for r in mock.requests():
        v = helpers.header_values(r["headers"], header)
        out.append(v[0] if v else None)
    return out


def json_dumps(obj):
    return json.dumps(obj, ensure_ascii=False)
