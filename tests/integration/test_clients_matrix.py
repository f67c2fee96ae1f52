"""
test_clients_matrix.py — the client matrix (issue 12): the official openai
npm client (chat, stream with usage, tools, the Responses API streamed and
not, retrieve and delete) and the Vercel AI SDK (generateText with the
default model, which speaks the Responses API, and with .chat(); streamText)
through sluice against the mock upstream. Pinned versions:
node/package.json. The retries are test_clients_retry.py.
"""

import json
import shutil
import subprocess

import pytest

import helpers
import mock_upstream
from helpers import bound

NODE_DIR = helpers.ROOT / "tests" / "integration" / "node"


@pytest.fixture(scope="session")
def matrix_node(node):
    if not all((NODE_DIR / "node_modules" / m).is_dir() for m in ("openai", "ai", "@ai-sdk/openai")):
        p = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci failed:\\n%s" % (p.stdout + p.stderr).decode()[-3000:])
    return node


def run(node, sluice, mode):
    p = subprocess.run([node, str(NODE_DIR / "clients_matrix.mjs"),
                        "http://%s:%d/v1" % (sluice.host, sluice.port), mode],
                       capture_output=True, timeout=bound(60), cwd=NODE_DIR)
    out = p.stdout.decode().strip().splitlines()
    assert p.returncode == 0, (out[-1:] if out else None, p.stderr.decode()[-2000:])
    return json.loads(out[-1])


WANT = mock_upstream.reply_text("matrix", 4)


def test_openai_chat(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "chat")
    assert r["text"] == WANT and r["usage"]["total_tokens"] > 0


def test_openai_stream_with_usage(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "stream_usage")
    assert r["text"] == WANT and r["usage"]["completion_tokens"] == 4
    assert r["chunks"] == 4 + 1 + 1  # contents, the finish chunk, the usage chunk


def test_openai_tools(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "tools")
    assert r["text"] == WANT and r["finish"] == "stop"
    (req,) = mock.requests()
    assert req["json"]["tools"][0]["function"]["name"] == "f"


def test_openai_responses(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "responses")
    assert r["text"] == WANT and r["got"] == r["id"] and r["deleted"] is True
    assert [(q["method"], q["path"]) for q in mock.requests()] == [
        ("POST", "/v1/responses"), ("GET", "/v1/responses/" + r["id"]),
        ("DELETE", "/v1/responses/" + r["id"])]
    assert mock.requests()[0]["json"]["model"] == "Qwen2.5-7B-Instruct"  # routed like chat


def test_openai_responses_stream(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "responses_stream")
    assert r["text"] == WANT
    assert r["types"][0] == "response.created" and r["types"][-1] == "response.completed"
    assert r["types"].count("response.output_text.delta") == 4


def test_ai_sdk_generate_text_default_model(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "ai_generate")
    assert r["text"] == WANT
    assert [q["path"] for q in mock.requests()] == ["/v1/responses"]


def test_ai_sdk_generate_text_chat(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "ai_chat")
    assert r["text"] == WANT and r["finish"] == "stop"
    assert [q["path"] for q in mock.requests()] == ["/v1/chat/completions"]


def test_ai_sdk_stream_text(sluice, mock, matrix_node):
    r = run(matrix_node, sluice, "ai_stream")
    assert r["text"] == WANT and r["parts"] >= 2
    assert [q["path"] for q in mock.requests()] == ["/v1/responses"]


def run_lc(node, sluice, mode):
    if not (NODE_DIR / "node_modules" / "@langchain" / "openai").is_dir():
        p = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        assert p.returncode == 0, (p.stdout + p.stderr).decode()[-3000:]
    p = subprocess.run([node, str(NODE_DIR / "clients_langchain.mjs"),
                        "http://%s:%d/v1" % (sluice.host, sluice.port), mode],
                       capture_output=True, timeout=bound(60), cwd=NODE_DIR)
    out = p.stdout.decode().strip().splitlines()
    assert p.returncode == 0, (out[-1:] if out else None, p.stderr.decode()[-2000:])
    return json.loads(out[-1])


def test_langchain_invoke(sluice, mock, matrix_node):
    r = run_lc(matrix_node, sluice, "invoke")
    assert r["text"] == WANT and r["usage"]["total_tokens"] > 0
    assert [q["path"] for q in mock.requests()] == ["/v1/chat/completions"]


def test_langchain_stream(sluice, mock, matrix_node):
    r = run_lc(matrix_node, sluice, "stream")
    assert r["text"] == WANT and r["chunks"] >= 4
    assert r["usage"] and r["usage"]["output_tokens"] == 4
    (req,) = mock.requests()
    assert req["json"]["stream"] is True
