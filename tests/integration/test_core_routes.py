"""
test_core_routes.py — sluice's routes and its OpenAI-style error answers
(issue 2, parts 4 and 6): health on both listeners, /v1/models from the conf,
404 / 405 / 400 shapes, and that none of these errors reach the upstream.
"""

import pytest

from helpers import assert_error, chat_body, request


def test_health_and_ready_on_both_listeners(sluice):
    for port in (sluice.port, sluice.admin_port):
        for path in ("/healthz", "/readyz"):
            r = request("127.0.0.1", port, "GET", path)
            assert r.status == 200, (port, path, r)


def test_metrics_only_on_admin(sluice):
    r = sluice.admin("GET", "/metrics")
    assert r.status == 200
    assert (r.header("Content-Type") or "").startswith("text/plain")
    assert b"sluice_" in r.body
    assert_error(sluice.request("GET", "/metrics"), 404, "not_found")


def test_models_lists_conf_names(sluice, mock):
    r = sluice.request("GET", "/v1/models")
    assert r.status == 200
    b = r.json()
    assert b["object"] == "list"
    ids = sorted(m["id"] for m in b["data"])
    assert ids == ["chat-model", "embed-model", "plain-model"]
    assert all(m["object"] == "model" for m in b["data"])
    # served names (aliases) are not shown, and the upstream is not asked
    assert b"Qwen2.5" not in r.body
    assert mock.requests() == []


def test_retrieve_model(sluice, mock):
    """GET /v1/models/{id} (the SDK's models.retrieve): the model, or 404."""
    r = sluice.request("GET", "/v1/models/chat-model")
    assert r.status == 200
    assert r.json() == {"id": "chat-model", "object": "model", "created": 0, "owned_by": "sluice"}
    assert_error(sluice.request("GET", "/v1/models/extra"), 404, "model_not_found")
    assert mock.requests() == []


def test_unknown_path_404(sluice, mock):
    for method, path in (("GET", "/"), ("POST", "/v1/chat"), ("GET", "/v1/chat/completions/x"),
                         ("POST", "/v2/chat/completions"), ("GET", "/v1/model")):
        body = chat_body() if method == "POST" else None
        assert_error(sluice.request(method, path, body), 404, "not_found")
    assert mock.requests() == []


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/completions", "POST"),
        ("GET", "/v1/embeddings", "POST"),
        ("POST", "/v1/models", "GET"),
    ],
)
def test_wrong_method_405_with_allow(sluice, mock, method, path, allow):
    body = chat_body() if method in ("POST", "PUT") else None
    r = sluice.request(method, path, body)
    assert_error(r, 405, "method_not_allowed")
    allowed = [a.strip() for a in (r.header("Allow") or "").split(",")]
    assert allow in allowed, r.headers
    assert mock.requests() == []


def test_unknown_model_404(sluice, mock):
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        r = sluice.request("POST", route, {"model": "no-such-model", "messages": [], "prompt": "x", "input": "x"})
        e = assert_error(r, 404, "model_not_found")
        assert "no-such-model" in e["message"]
    # served names are not client names
    assert_error(sluice.chat(model="Qwen2.5-7B-Instruct"), 404, "model_not_found")
    assert mock.requests() == []


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"{\"model\": \"chat-model\"", b"\xff\xfe{}", b"{} trailing"],
    ids=["garbage", "empty", "truncated", "not_utf8", "trailing"],
)
def test_body_not_json_400(sluice, mock, body):
    r = sluice.request("POST", "/v1/chat/completions", body)
    assert_error(r, 400, "invalid_json")
    assert mock.requests() == []


@pytest.mark.parametrize("body", [b"[1,2]", b'"string"', b"42"], ids=["array", "string", "number"])
def test_body_not_an_object_400(sluice, mock, body):
    r = sluice.request("POST", "/v1/chat/completions", body)
    assert r.status == 400
    assert r.json()["error"]["code"] in ("invalid_json", "missing_model")
    assert mock.requests() == []


@pytest.mark.parametrize(
    "body",
    [{"messages": [{"role": "user", "content": "x"}]}, {"model": None}, {"model": 7}, {"model": ""}],
    ids=["absent", "null", "number", "empty"],
)
def test_missing_model_400(sluice, mock, body):
    assert_error(sluice.request("POST", "/v1/chat/completions", body), 400, "missing_model")
    assert mock.requests() == []


def test_errors_keep_the_connection_usable(sluice, mock):
    """An application error (404, 405, 400 on the body) is an ordinary answer:
    the client's connection stays open for the next request."""
    with sluice.client() as c:
        assert c.request("GET", "/nope").status == 404
        assert c.request("GET", "/v1/chat/completions").status == 405
        assert c.request("POST", "/v1/chat/completions", b"{bad").status == 400
        assert c.request("POST", "/v1/chat/completions", chat_body(model="nope")).status == 404
        r = c.request("POST", "/v1/chat/completions", chat_body("still here"))
        assert r.status == 200 and not r.closed
        assert r.json()["choices"][0]["message"]["content"] == "echo: still here"
