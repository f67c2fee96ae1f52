"""
test_core_upstream_feed.py — the upstream answer's head and body fed in one
pass (gateway/proxy.c, gw_proxy_head_cb), and the cases where that pass must
stop at the head or must still complete: every answer here comes in one
write of the mock (raw_response), so its head and body reach sluice in one
read.

- a 5xx that the fallback chain takes (a retry): the pass stops at the head;
  the failed attempt's body must never reach the client;
- a 5xx relayed as it is (no retry): its body follows in the same pass;
- 204 and 304: no body; the answer completes in the same pass, and bytes the
  server put after such a head are not relayed;
- 1xx interims before the real head (the parser skips them): the real head
  decides, a 5xx after a 1xx is still retried.
"""

import time

import fallback_helpers as fh
import helpers
from helpers import bound, mock_upstream

SECRET = "FAILED-ATTEMPT-BODY-5c1e"


def json_answer(status, reason, obj_text, extra=""):
    return ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (status, reason, extra, len(obj_text), obj_text))


def failed_503(lead=""):
    body = '{"error":{"message":"%s","type":"server_error"}}' % SECRET
    return lead + json_answer(503, "Service Unavailable", body)


def retry_once():
    return fh.chain(retry={"attempts": 1, "backoff": "10ms", "budget_percent": 100,
                           "budget_min": 100},
                    circuit={"failures": 0, "failure_percent": 0}, template=False)


def check_retried(s, mock, lead=""):
    for stream in (False, True):
        mock.reset()
        mock.script({"raw_response": failed_503(lead)})
        t0 = time.monotonic()
        if stream:
            r, evs = fh.stream(s, helpers.chat_body("again", stream=True))
            assert r.status == 200 and evs[-1].is_done, (r, evs)
            text = "".join(e.json()["choices"][0]["delta"].get("content") or "" for e in evs[:-1])
            raw = b"".join(e.raw if isinstance(e.raw, bytes) else e.raw.encode() for e in evs)
        else:
            r = s.request("POST", fh.CHAT, helpers.chat_body("again"))
            assert r.status == 200, r
            text = r.json()["choices"][0]["message"]["content"]
            raw = r.body
        assert time.monotonic() - t0 < bound(3)
        assert text == mock_upstream.reply_text("again")
        assert SECRET.encode() not in raw, raw[:300]
        assert len(mock.requests()) == 2  # the failed attempt, then the retry


def test_upstream_5xx_with_its_body_in_one_read_is_retried(sluice_factory, mock):
    s = sluice_factory(overrides=retry_once(), upstream=mock)
    m0 = fh.Metrics(s)
    check_retried(s, mock)
    assert m0.delta("sluice_retries_total", upstream="main") == 2
    assert m0.delta("sluice_upstream_errors_total", upstream="main", kind="status_5xx") == 2


def test_upstream_1xx_then_5xx_in_one_read_is_retried(sluice_factory, mock):
    s = sluice_factory(overrides=retry_once(), upstream=mock)
    check_retried(s, mock, lead="HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                                "Link: </x>; rel=preload\r\n\r\n")


def test_upstream_5xx_relayed_with_its_body(sluice_factory, mock):
    # No retry, no template: the upstream's own answer goes to the client,
    # its body fed on in the same pass as its head, exactly once.
    s = sluice_factory(overrides=fh.chain(template=False), upstream=mock)
    mock.script({"raw_response": failed_503()})
    r = s.request("POST", fh.CHAT, helpers.chat_body("relay"))
    assert r.status == 503, r
    assert r.json()["error"]["message"] == SECRET
    assert r.body.count(SECRET.encode()) == 1
    assert len(mock.requests()) == 1


def test_upstream_1xx_before_the_answer_in_one_read(sluice, mock):
    obj = '{"id":"x1","object":"chat.completion","choices":[]}'
    lead = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-Interim: 1\r\n\r\n"
    mock.script({"raw_response": lead + json_answer(200, "OK", obj)})
    r = sluice.request("POST", fh.CHAT, helpers.chat_body("hi"))
    assert r.status == 200, r
    assert r.body == obj.encode()
    assert r.header("X-Interim") is None  # the interim's headers are not the answer's


def test_upstream_204_304_complete_in_one_read(sluice, mock):
    # The head's pass completes a body-less answer: no wait for more input
    # (the mock keeps the connection open) nor for the close; bytes after
    # such a head are no body of it (raw_response: then the mock closes).
    for status, reason in ((204, "No Content"), (304, "Not Modified")):
        stray = "HTTP/1.1 %d %s\r\nX-Up: %d\r\n\r\nSTRAY-BYTES" % (status, reason, status)
        with sluice.client(timeout=bound(3)) as c:
            for beh in ({"status": status, "body": "", "headers": {"X-Up": status}},
                        {"raw_response": stray}):
                mock.reset()
                mock.script(beh)
                t0 = time.monotonic()
                r = c.request("POST", fh.CHAT, helpers.chat_body("nobody"))
                took = time.monotonic() - t0
                assert r.status == status, (beh, r)
                assert r.body == b"", (beh, r)
                assert r.header("X-Up") == str(status)
                assert took < bound(2), took
            # the client's connection is still good for a normal answer
            mock.reset()
            r = c.request("POST", fh.CHAT, helpers.chat_body("after"))
            assert r.status == 200, r
            assert r.json()["choices"][0]["message"]["content"] == mock_upstream.reply_text("after")
