"""
test_metrics_llm.py — the per-model LLM metrics, the access log's new fields
and the W3C trace id, through the real binary against the mock (issue 14,
docs/metrics.md):

- a stream whose first event comes 1.5 s after its headers: one TTFT
  observation >= 1.5 s (in no bucket below 1.5), while the upstream TTFB
  (headers) stays far below it;
- the gaps between a stream's content events: one observation per event
  after the first, each at least the mock's delay;
- sluice_tokens_total equals the usage the mock sent, for a JSON answer and
  for a stream whose client did not ask for usage (sluice asks the upstream
  for it and the client still gets no usage chunk);
- a client that leaves mid-stream is counted 499 (route and model), not 4xx;
- requests by model and exact code, the answering tier (upstream, retry);
- promtool check metrics passes on the whole output;
- the access log: user (hashed by default, plain, off), model, tokens, ttft,
  tier, retries, trace id;
- a valid traceparent's trace id reaches the upstream (with sluice's own
  span id) and the access log; a malformed one is replaced by a new trace.
"""

import json
import re

import pytest

import helpers
import policy_helpers as ph
from helpers import bound, chat_body, wait_until

MODEL = "chat-model"


def hist(s, name, **labels):
    """{le: cumulative count}, count and sum of one histogram series."""
    buckets = {l["le"]: v for _, l, v in s.find(name + "_bucket", **labels)}
    return buckets, s.value(name + "_count", **labels), s.value(name + "_sum", **labels)


def stream_all(sluice, body, headers=None):
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", body, headers)
        assert r.status == 200, r
        return [e for e in evs if not e.is_comment]


def log_line(sluice, pred, what):
    return wait_until(lambda: next((e for e in sluice.access_log() if pred(e)), None), bound(5),
                      what=what)


@pytest.mark.timeout(60)
def test_ttft_is_the_first_token_not_the_headers(sluice, mock):
    mock.script({"stall_after_headers": 1.5, "events": 3})
    evs = stream_all(sluice, chat_body("slow start", stream=True))
    assert evs[-1].is_done
    s = sluice.metrics()
    buckets, count, total = hist(s, "sluice_time_to_first_token_seconds", model=MODEL,
                                 stream="true")
    assert count == 1, buckets
    assert total >= 1.5, total
    assert buckets["1"] == 0 and buckets["1.5"] == 0 and buckets["+Inf"] == 1, buckets
    # the head came at once: TTFB is what its name says, and not the TTFT
    _, tcount, tsum = hist(s, "sluice_upstream_ttfb_seconds", upstream="main")
    assert tcount == 1 and tsum < 1.0, tsum
    line = log_line(sluice, lambda e: e.get("route") == "chat_completions", "access log line")
    assert line["ttft"] >= 1.5 and line["ttfb"] < 1.0, line


@pytest.mark.timeout(60)
def test_inter_token_gaps(sluice, mock):
    mock.script({"events": 5, "delay": 0.1})
    evs = stream_all(sluice, chat_body("gaps", stream=True))
    assert evs[-1].is_done
    s = sluice.metrics()
    buckets, count, total = hist(s, "sluice_inter_token_seconds", model=MODEL)
    assert count == 4, buckets  # 5 content events: 4 gaps; usage/[DONE] not observed
    assert total >= 4 * 0.1 * 0.9, total
    assert buckets["0.05"] == 0, buckets


@pytest.mark.timeout(60)
def test_tokens_equal_the_usage_sent(sluice, mock):
    # JSON: the mock sends usage {prompt: words of the prompt, completion: events}
    mock.script({"events": 3})
    r = sluice.chat("one two three four")
    assert r.status == 200, r
    usage = r.json()["usage"]
    # a stream that did not ask for usage: sluice asks, counts, and strips it
    evs = stream_all(sluice, chat_body("five six", stream=True))
    assert evs[-1].is_done
    assert all("usage" not in e.json() for e in evs if not e.is_done), evs
    sent = mock.requests("/v1/chat/completions")
    assert sent[-1]["json"]["stream_options"] == {"include_usage": True}, sent[-1]["json"]
    s = sluice.metrics()
    prompt = s.value("sluice_tokens_total", model=MODEL, kind="prompt")
    completion = s.value("sluice_tokens_total", model=MODEL, kind="completion")
    assert prompt == usage["prompt_tokens"] + 2, (prompt, usage)
    assert completion == usage["completion_tokens"] + 4, (completion, usage)
    # a client that asked for usage gets it, counted once
    evs = stream_all(sluice, chat_body("seven", stream=True,
                                       stream_options={"include_usage": True}))
    got = [e.json()["usage"] for e in evs if not e.is_done and e.json().get("usage")]
    assert len(got) == 1, evs
    s2 = sluice.metrics()
    assert s2.value("sluice_tokens_total", model=MODEL, kind="prompt") == prompt + 1
    assert s2.value("sluice_tokens_total", model=MODEL, kind="completion") == completion + 4
    line = log_line(sluice, lambda e: e.get("route") == "chat_completions" and not e["stream"],
                    "JSON answer's line")
    assert (line["prompt_tokens"], line["completion_tokens"]) == (4, 3) == (
        usage["prompt_tokens"], usage["completion_tokens"]), line


@pytest.mark.timeout(60)
def test_abandoned_stream_is_499(sluice, mock):
    mock.script("gate")
    c = sluice.client(timeout=bound(10))
    r, evs = c.stream("POST", "/v1/chat/completions", chat_body("leave", stream=True))
    assert r.status == 200
    first = next(e for e in evs if not e.is_comment)
    assert first.json()["choices"]
    c.close()

    # The route's counter, the model's and the tier's are three adds in a
    # row on the worker that ended the request: a scrape served by another
    # worker can fall between them, so wait until all three show.
    def counted():
        s = sluice.metrics()
        return s if (s.value("sluice_requests_total", route="chat_completions", code="499")
                     and s.value("sluice_model_requests_total", model=MODEL, code="499")
                     and s.value("sluice_answer_tier_total", model=MODEL, tier="error")) else None

    s = wait_until(counted, bound(5), what="the abandoned request counted")
    assert s.value("sluice_requests_total", route="chat_completions", code="499") == 1
    assert s.value("sluice_requests_total", route="chat_completions", code="4xx") == 0
    assert s.value("sluice_model_requests_total", model=MODEL, code="499") == 1
    assert s.value("sluice_answer_tier_total", model=MODEL, tier="error") == 1
    mock.release(10)
    line = log_line(sluice, lambda e: e.get("status") == 499, "499 line")
    assert line["error"] == "client_closed" and line["model"] == MODEL


@pytest.mark.timeout(60)
def test_codes_tiers_and_promtool(sluice_factory, mock, promtool):
    sluice = sluice_factory(overrides={"fallback": {"retry": {"attempts": 1}}}, upstream=mock)
    mock.script({"status": 503}, "normal")
    assert sluice.chat("retried").status == 200  # one retry (base_conf: retry on)
    assert sluice.chat("plain").status == 200
    assert sluice.chat("x", model="nope").status == 404  # no model: not per-model
    s = sluice.metrics()
    assert s.value("sluice_model_requests_total", model=MODEL, code="200") == 2
    assert s.find("sluice_model_requests_total", model="nope") == []
    tiers = {l["tier"]: v for _, l, v in s.find("sluice_answer_tier_total", model=MODEL)}
    assert tiers.get("retry") == 1 and tiers.get("upstream") == 1, tiers
    assert sum(tiers.values()) == s.value("sluice_model_requests_total", model=MODEL)
    assert s.value("sluice_build_info") == 1
    assert s.value("sluice_config_last_reload_successful") == 1
    assert s.value("sluice_config_last_reload_success_timestamp_seconds") > 1.7e9
    assert s.value("sluice_upstream_servers", upstream="main") == 1
    assert s.value("sluice_upstream_servers_in_service", upstream="main") == 1
    assert s.value("process_open_fds") > 0
    ok, out = helpers.promtool_check(sluice.metrics_text())
    assert ok, out
    lines = [e for e in sluice.access_log() if e.get("route") == "chat_completions"]
    assert [e.get("tier") for e in lines[:2]] == ["retry", "upstream"], lines
    assert [e.get("retries") for e in lines[:2]] == [1, 0], lines


@pytest.mark.timeout(60)
def test_reload_gauges_and_state(sluice):
    t0 = sluice.metrics().value("sluice_config_last_reload_success_timestamp_seconds")
    sluice.reload()
    st = wait_until(lambda: (lambda j: j if j["reload"]["generation"] == 2 else None)(
        sluice.admin("GET", "/admin/state").json()), bound(5), what="generation 2")
    assert st["reload"]["last_result"] == "ok" and st["reload"]["last_error"] is None
    s = sluice.metrics()
    assert s.value("sluice_config_last_reload_successful") == 1
    assert s.value("sluice_config_last_reload_success_timestamp_seconds") >= t0
    sluice.write_conf_text("listen: [\n")  # not YAML: refused, the old conf serves
    sluice.p.signal(__import__("signal").SIGHUP)
    wait_until(lambda: sluice.metrics().value("sluice_config_last_reload_successful", 1) == 0,
               bound(5), what="the failed reload seen")
    st = sluice.admin("GET", "/admin/state").json()
    assert st["reload"]["last_result"] == "error" and st["reload"]["generation"] == 2
    assert isinstance(st["reload"]["last_error"], str) and st["reload"]["last_error"]
    assert sluice.chat("still serving").status == 200


@pytest.mark.timeout(60)
def test_model_series_follow_renames_on_reload(sluice_factory, mock):
    """Each reload builds a one-model table while the last one still
    serves, so malloc tends to hand out two addresses in turn; the names
    go one, two, two, one, so a name lands where the other one was. The
    worker's series cache is keyed by the model's address and its conf
    generation: a key by address alone counted a request of the new name
    in the old name's series (shown failing so)."""
    sluice = sluice_factory(overrides={"workers": 1})
    assert sluice.chat("first").status == 200
    names = ["m-one", "m-two", "m-two", "m-one", "m-one", "m-two"]
    for gen, name in enumerate(names, start=2):
        conf = dict(sluice.conf)
        conf["models"] = {name: {"upstream": "main"}}
        sluice.reload(conf)
        wait_until(lambda: sluice.admin("GET", "/admin/state").json()["reload"]["generation"] == gen,
                   bound(5), what="generation %d" % gen)
        assert sluice.chat("x", model=name).status == 200
    s = sluice.metrics()
    for name, n in ((MODEL, 1), ("m-one", 3), ("m-two", 3)):
        assert s.value("sluice_model_requests_total", model=name, code="200") == n, name
        assert s.value("sluice_answer_tier_total", model=name, tier="upstream") == n, name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["hash", "plain", "off"])
def test_access_log_user(sluice_factory, mock, mode):
    s = ph.start(sluice_factory, mock, overrides={"log": {"user": mode}})
    tok = ph.mint(sub="alice")
    assert ph.signed(s, tok).status == 200
    line = log_line(s, lambda e: e.get("route") == "chat_completions", "access log line")
    if mode == "off":
        assert "user" not in line, line
    elif mode == "plain":
        assert line["user"] == "alice", line
    else:
        assert re.fullmatch(r"[0-9a-f]{16}", line["user"]) and "alice" not in json.dumps(line)
        assert ph.signed(s, tok).status == 200
        lines = wait_until(lambda: (lambda l: l if len(l) >= 2 else None)(
            [e for e in s.access_log() if e.get("route") == "chat_completions"]), bound(5))
        assert lines[0]["user"] == lines[1]["user"]  # the same user reads the same
        other = ph.mint(sub="bob")
        assert ph.signed(s, other).status == 200
        lines = wait_until(lambda: (lambda l: l if len(l) >= 3 else None)(
            [e for e in s.access_log() if e.get("route") == "chat_completions"]), bound(5))
        assert lines[2]["user"] != lines[0]["user"]


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("given,kept", [
    ("00-%s-00f067aa0ba902b7-01" % TRACE, True),
    ("00-%s-00f067aa0ba902b7-01-extra" % TRACE, False),  # version 00 is exactly 55 chars
    ("00-%s-00f067aa0ba902b7-01" % TRACE.upper(), False),  # lowercase hex only
    ("00-%s-0000000000000000-01" % TRACE, False),  # zero parent id
    ("00-%s-00f067aa0ba902b7-01" % ("0" * 32), False),  # zero trace id
    ("ff-%s-00f067aa0ba902b7-01" % TRACE, False),  # version ff
    ("01-%s-00f067aa0ba902b7-01-more" % TRACE, True),  # a later version may add fields
    (None, False),
])
def test_trace_id_end_to_end(sluice, mock, given, kept):
    hdrs = {"traceparent": given} if given else None
    assert sluice.chat("trace", headers=hdrs).status == 200
    req = mock.requests("/v1/chat/completions")[-1]
    sent = helpers.header_values(req["headers"], "traceparent")
    assert len(sent) == 1, req["headers"]
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})", sent[0])
    assert m, sent
    assert m.group(2) != "0" * 16 and m.group(2) != "00f067aa0ba902b7"  # sluice's own span
    if kept:
        assert m.group(1) == TRACE and m.group(3) == "01"
    else:
        assert m.group(1) != TRACE and m.group(1) != "0" * 32
    line = log_line(sluice, lambda e: e.get("route") == "chat_completions", "access log line")
    assert line["trace_id"] == m.group(1), (line, sent)


@pytest.mark.timeout(120)
def test_engine_metrics_and_state(sluice_factory, mock, tmp_path):
    import subprocess

    import test_model_serving as ms

    gguf = str(tmp_path / "tiny.gguf")
    subprocess.run(["/usr/bin/python3", ms.WRITER, gguf, "--type", "F32", "--ctx", "512"],
                   check=True, capture_output=True, timeout=120)
    s = sluice_factory(ms.engine_conf(gguf), upstream=mock)
    st0 = s.admin("GET", "/admin/state").json()
    # a stream from the engine whose client did not ask for usage: counted, not shown
    with s.client(timeout=bound(30)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions",
                          chat_body("hi", model="small", stream=True, max_tokens=5,
                                    temperature=0))
        evs = [e for e in evs if e.data is not None]
    assert r.status == 200 and evs[-1].is_done
    assert all("usage" not in e.json() for e in evs[:-1]), evs
    m = s.metrics()
    completion = m.value("sluice_tokens_total", model="small", kind="completion")
    assert 0 < completion <= 5
    assert m.value("sluice_tokens_total", model="small", kind="prompt") > 0
    assert m.value("sluice_time_to_first_token_seconds_count", model="small", stream="true") == 1
    assert m.value("sluice_engine_tokens_total", upstream="local", kind="completion") >= completion
    assert m.find("sluice_engine_queue_length", upstream="local")
    assert m.value("sluice_engine_busy", upstream="local") == 0
    st = s.admin("GET", "/admin/state").json()
    e = [p for p in st["pools"] if p["name"] == "local"][0]
    assert e["kind"] == "engine" and e["engine"]["queue"] == 0 and e["engine"]["busy"] == 0
    assert e["engine"]["tokens_per_second"] > 0, (st0, st)  # tokens since the first poll
    line = next(x for x in s.access_log() if x.get("model") == "small")
    # the model's own upstream is the engine: its first tier, not the local tier
    assert line["completion_tokens"] == completion and line["tier"] == "upstream", line


@pytest.mark.timeout(60)
def test_tokens_of_a_large_json_answer(sluice, mock):
    """The usage comes after 40 KB of text, over many reads: it is read from
    the answer's tail (the answer is relayed, not gathered)."""
    mock.script({"text": "lorem ipsum " * 4000, "events": 7})
    r = sluice.chat("a b c d e f g h i")
    assert r.status == 200 and len(r.body) > 40000
    u = r.json()["usage"]
    s = sluice.metrics()
    assert s.value("sluice_tokens_total", model=MODEL, kind="prompt") == u["prompt_tokens"] == 9
    assert s.value("sluice_tokens_total", model=MODEL, kind="completion") == u[
        "completion_tokens"] == 7
    # an answer without usage adds nothing (no guessing)
    mock.script({"usage": False})
    assert sluice.chat("no usage here").status == 200
    s2 = sluice.metrics()
    assert s2.value("sluice_tokens_total", model=MODEL, kind="prompt") == 9
