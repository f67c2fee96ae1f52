"""
test_clients_template.py — the template answers in the shape the client
asked for (issue 12, item 6): JSON modes get a JSON object as content
(fallback.template.json, or {"error":"unavailable","message":...}), `n`
gets n choices (streamed too), and a request that requires tools gets a 503
with Retry-After instead of prose that would end its tool loop.
"""

import json
import os
import subprocess

import fallback_helpers as fh
import helpers

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def down(sluice_factory, mock, **tmpl):
    mock.set_default({"status": 503})
    conf = fh.chain()
    conf["fallback"]["template"].update(tmpl)
    return sluice_factory(overrides=conf, upstream=mock)


def chat(s, **extra):
    body = helpers.chat_body("shape", **extra)
    return s.request("POST", fh.CHAT, json.dumps(body).encode(), {"Content-Type": "application/json"})


def test_json_modes_get_a_json_object(sluice_factory, mock):
    s = down(sluice_factory, mock)
    for rf in ({"type": "json_object"},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        r = chat(s, response_format=rf)
        assert r.status == 200 and r.header("X-Sluice-Fallback") == "template"
        content = json.loads(r.body)["choices"][0]["message"]["content"]
        obj = json.loads(content)
        assert obj["error"] == "unavailable" and obj["message"], obj
    # Plain text mode: the configured prose, unchanged.
    r = chat(s, response_format={"type": "text"})
    assert json.loads(r.body)["choices"][0]["message"]["content"] == fh.DEFAULT_TEXT


def test_json_mode_content_is_configurable_and_streams(sluice_factory, mock):
    s = down(sluice_factory, mock, json='{"status": "retry_later", "items": []}')
    r = chat(s, response_format={"type": "json_object"}, stream=True)
    assert r.status == 200
    evs = helpers.SSEParser().feed(r.body)
    text = "".join(e.json()["choices"][0]["delta"].get("content", "") for e in evs
                   if e.data and not e.is_done)
    assert json.loads(text) == {"status": "retry_later", "items": []}
    assert evs[-1].is_done


def test_n_choices(sluice_factory, mock):
    s = down(sluice_factory, mock)
    r = chat(s, n=3)
    choices = json.loads(r.body)["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["message"]["content"] == fh.DEFAULT_TEXT and c["finish_reason"] == "stop"
               for c in choices)
    r = chat(s, n=2, stream=True)
    evs = [e for e in helpers.SSEParser().feed(r.body) if e.data and not e.is_done]
    finished = sorted(e.json()["choices"][0]["index"] for e in evs
                      if e.json()["choices"][0]["finish_reason"] == "stop")
    assert finished == [0, 1]


def test_required_tools_get_503_with_retry_after(sluice_factory, mock):
    s = down(sluice_factory, mock)
    m0 = fh.Metrics(s)
    for tc in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = chat(s, tools=TOOLS, tool_choice=tc)
        helpers.assert_error(r, 503, "upstream_unavailable")
        assert int(r.header("Retry-After")) >= 1
        assert r.header("X-Sluice-Fallback") is None
    # "auto" tools: a text answer is a valid answer.
    r = chat(s, tools=TOOLS, tool_choice="auto")
    assert r.status == 200 and r.header("X-Sluice-Fallback") == "template"
    assert m0.delta("sluice_fallback_total", tier="template") == 1


def test_bad_template_json_is_a_conf_error(sluice_factory, mock, tmp_path):
    conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), mock.url)
    conf = helpers.deep_merge(conf, {"fallback": {"template": {"json": "[1, 2]"}}})
    s = sluice_factory(conf=conf, start=False)
    env = dict(os.environ, **{helpers.UPSTREAM_KEY_ENV: "test-key"})
    p = subprocess.run([s.bin, "-t", "-c", str(s.conf_path)], capture_output=True, timeout=20, env=env)
    assert p.returncode == 1
    assert b"fallback.template.json: not a JSON object" in p.stdout + p.stderr


def test_required_tools_still_queued(sluice_factory, mock, tmp_path):
    # The queue takes the request (stored, resent later); the client gets
    # the 503 with Retry-After and the id to poll.
    q = {"enabled": True, "store": "journal", "dir": str(tmp_path / "queue"), "backoff": "30s",
         "backoff_max": "60s", "lease": "2s", "max_attempts": 3}
    mock.set_default({"status": 503})
    conf = fh.chain(queue=q)
    s = sluice_factory(overrides=conf, upstream=mock)
    r = chat(s, tools=TOOLS, tool_choice="required")
    helpers.assert_error(r, 503, "upstream_unavailable")
    assert int(r.header("Retry-After")) >= 1
    qid = r.header("X-Sluice-Request-Id")
    assert qid and qid.startswith("q"), r.headers if hasattr(r, "headers") else qid
    r = s.request("GET", "/v1/requests/" + qid)
    assert r.status == 202 and r.json()["status"] == "pending"
