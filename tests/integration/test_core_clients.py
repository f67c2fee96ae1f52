"""
test_core_clients.py — real clients through sluice (issue 2, part 8):
`curl -N` receives each event before the upstream sends the next, and the
official `openai` npm package (pinned in node/package-lock.json) works
streaming and not, and sees a truncated stream as an error, not a success.
"""

import json
import os
import select
import shutil
import subprocess
import time

import pytest

import helpers
from helpers import bound, mock_upstream

NODE_DIR = helpers.ROOT / "tests" / "integration" / "node"


@pytest.fixture(scope="session")
def curl():
    exe = shutil.which("curl")
    if not exe:
        pytest.skip("curl not installed (Debian package curl)")
    return exe


@pytest.fixture(scope="session")
def openai_node(node):
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        npm = shutil.which("npm")
        p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci in %s failed:\n%s" % (NODE_DIR, (p.stdout + p.stderr).decode()[-3000:]))
    return node


def evidence(sluice, mock):
    """What sluice and the mock saw, for a failure's message: sluice's error
    log and access log, the mock's requests (events sent, when it closed);
    "" without a mock."""
    if mock is None:
        return ""
    reqs = [{k: r.get(k) for k in ("id", "path", "status", "outcome", "events_sent", "closed", "closed_by")}
            for r in mock.requests()] if mock.p.alive() else "mock gone"
    return "\nsluice stderr:\n%s\nsluice access log:\n%s\nmock requests: %r" % (
        sluice.stderr_text()[-2000:], sluice.stdout_text()[-2000:], reqs)


def run_node(node, sluice, mode, prompt="hello from node", mock=None):
    argv = [node, str(NODE_DIR / "client.mjs"), "http://%s:%d/v1" % (sluice.host, sluice.port), mode, prompt]
    try:
        p = subprocess.run(argv, capture_output=True, timeout=bound(60), cwd=NODE_DIR)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode()[-1000:]
        pytest.fail("node did not finish in %d s; its output: %r%s" % (bound(60), out, evidence(sluice, mock)))
    assert p.returncode == 0, p.stderr.decode()[-3000:] + evidence(sluice, mock)
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    if isinstance(r, dict) and r.get("stalled"):
        pytest.fail("the stream stalled after %d chunk(s): %r%s" % (r["chunks"], r, evidence(sluice, mock)))
    return r


def test_curl_n_streams_each_event_at_once(sluice, mock, curl):
    mock.script({"gate": True, "events": 3})
    body = json.dumps(helpers.chat_body("curl me", stream=True))
    p = subprocess.Popen(
        [curl, "-sS", "-N", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", body,
         "http://%s:%d/v1/chat/completions" % (sluice.host, sluice.port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out = b""
    try:
        deadline = time.monotonic() + bound(10)
        while b"\n\n" not in out:
            left = deadline - time.monotonic()
            assert left > 0, "curl got no event: %r" % out
            r, _, _ = select.select([p.stdout], [], [], left)
            if r:
                chunk = os.read(p.stdout.fileno(), 65536)
                assert chunk, "curl ended early: %r %r" % (out, p.stderr.read())
                out += chunk
        (req,) = mock.requests()
        assert req["events_sent"] == 1  # curl shows event 1 while the mock holds event 2
        assert out.startswith(b"data: {")
        mock.release(n=100)
        rest, err = p.communicate(timeout=bound(10))
        out += rest
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    events = helpers.SSEParser().feed(out)
    assert events[-1].is_done
    text = "".join(e.json()["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == mock_upstream.reply_text("curl me", 3)


def test_curl_non_stream(sluice, mock, curl):
    p = subprocess.run(
        [curl, "-sS", "-f", "-X", "POST", "-H", "Content-Type: application/json",
         "--data-binary", json.dumps(helpers.chat_body("curl plain")),
         "http://%s:%d/v1/chat/completions" % (sluice.host, sluice.port)],
        capture_output=True, timeout=bound(20),
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["choices"][0]["message"]["content"] == "echo: curl plain"


def test_openai_node_chat(sluice, mock, openai_node):
    r = run_node(openai_node, sluice, "chat", "node says hi")
    assert r["text"] == "echo: node says hi"
    (req,) = mock.requests()
    assert req["json"]["model"] == "Qwen2.5-7B-Instruct"
    assert helpers.header_values(req["headers"], "Authorization") == ["Bearer " + helpers.UPSTREAM_KEY]


def test_openai_node_stream(sluice, mock, openai_node):
    """Each chunk reaches the client before the mock sends the next event:
    the mock's gate lets event k+1 go only once the client printed that it
    has chunk k, so a relay that held events back (batching) stalls here
    instead of passing. (Arrival times compared with the mock's delay failed
    under load: a descheduled client reads what queued meanwhile at once.)"""
    mock.script({"gate": True, "events": 5})
    argv = [openai_node, str(NODE_DIR / "client.mjs"), "http://%s:%d/v1" % (sluice.host, sluice.port),
            "stream", "node streams"]
    env = dict(os.environ, CHUNK_LINES="1")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=NODE_DIR, env=env,
                         bufsize=0)  # unbuffered: select() sees every line
    try:
        lines = []
        for k in range(1, 5 + 1 + 1 + 1):  # content, finish, usage: each lets the next event go
            line = _line_within(p, bound(10))
            assert line == "chunk %d" % k, (line, lines, evidence(sluice, mock))
            lines.append(line)
            assert mock.release(n=1) == 1, "the mock had no stream waiting at its gate"
        out, err = p.communicate(timeout=bound(20))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err.decode()[-3000:] + evidence(sluice, mock)
    r = json.loads(out.decode().strip().splitlines()[-1])
    assert r["error"] is None and not r["stalled"], r
    assert r["text"] == mock_upstream.reply_text("node streams", 5)
    assert r["chunks"] == 5 + 1 + 1  # content, finish, usage
    assert r["usage"]["completion_tokens"] == 5


def _line_within(p, timeout):
    """The next line node prints, or an AssertionError after `timeout`."""
    r, _, _ = select.select([p.stdout], [], [], timeout)
    assert r, "node printed nothing within %.0f s" % timeout
    return p.stdout.readline().decode().strip()


def test_openai_node_truncated_stream_is_an_error(sluice, mock, openai_node):
    mock.script({"cut_after": 2})
    r = run_node(openai_node, sluice, "stream", "cut", mock=mock)
    assert r["error"] is not None, "the client saw a truncated stream as a success: %r" % r
    # the client library raised on sluice's SSE error event (not on a torn socket)
    assert r["error"]["name"] == "APIError", r
    assert r["chunks"] == 2


def test_openai_node_models_completion_embeddings_error(sluice, mock, openai_node):
    assert sorted(run_node(openai_node, sluice, "models")["ids"]) == ["chat-model", "embed-model", "plain-model"]
    assert run_node(openai_node, sluice, "completion", "old style")["text"] == "echo: old style"
    assert run_node(openai_node, sluice, "embeddings") == {"n": 2, "dim": 8}
    e = run_node(openai_node, sluice, "error")["error"]
    assert e["status"] == 404 and e["code"] == "model_not_found", e
