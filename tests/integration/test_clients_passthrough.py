"""
test_clients_passthrough.py — conf `passthrough:` paths (issue 12, item 2):
other OpenAI paths a deployment needs are proxied with auth and limits
applied — routed by the body's model when it names one, else to the first
model's upstream; the body (multipart too) forwarded as it came.
"""

import json

import helpers
import policy_helpers as ph

BOUNDARY = "----sluiceboundary"
MULTIPART = ("--%s\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
             "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
             "Content-Type: audio/wav\r\n\r\nRIFF....WAVE\r\n--%s--\r\n") % (BOUNDARY, BOUNDARY, BOUNDARY)


def test_passthrough_paths_proxied_with_limits(sluice_factory, mock):
    s = sluice_factory({"passthrough": ["/v1/moderations", "/v1/audio/"],
                        "ratelimit": {"per_ip": {"requests_per_minute": 3}}}, upstream=mock)
    body = json.dumps({"model": "chat-model", "input": "x"}).encode()
    r = s.request("POST", "/v1/moderations", body, {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    assert r.json() == {"object": "mock.echo", "path": "/v1/moderations", "method": "POST",
                        "content_type": "application/json", "bytes": len(body)}
    ct = "multipart/form-data; boundary=" + BOUNDARY
    r = s.request("POST", "/v1/audio/transcriptions", MULTIPART.encode(), {"Content-Type": ct})
    assert r.status == 200, r.body
    assert r.json()["content_type"] == ct and r.json()["bytes"] == len(MULTIPART)
    reqs = mock.requests()
    assert [q["path"] for q in reqs] == ["/v1/moderations", "/v1/audio/transcriptions"]
    assert reqs[1]["body"] == MULTIPART  # untouched
    # The upstream's key, not the client's.
    auth = [v for k, v in reqs[1]["headers"] if k.lower() == "authorization"]
    assert auth == ["Bearer " + helpers.UPSTREAM_KEY], auth
    # An exact entry is exact; a prefix needs something after it.
    assert s.request("POST", "/v1/moderations/x", b"{}").status == 404
    assert s.request("POST", "/v1/audio/", b"{}").status == 404
    assert s.request("POST", "/v1/rerank", b"{}").status == 404
    # Limits apply: the third request a minute passes, the fourth does not.
    r = s.request("GET", "/v1/audio/voices")
    assert r.status == 200 and r.json()["method"] == "GET"
    r = s.request("GET", "/v1/audio/voices")
    helpers.assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert len(mock.requests()) == 3


def test_passthrough_needs_auth(sluice_factory, mock):
    s = ph.start(sluice_factory, mock, overrides={"passthrough": ["/v1/moderations"]})
    r = s.request("POST", "/v1/moderations", b'{"input":"x"}', {"Content-Type": "application/json"})
    assert r.status == 401 and r.json()["error"]["type"] == "authentication_error", r.body
    assert mock.requests() == []
