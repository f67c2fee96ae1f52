"""
test_auth_replay.py — a signed request cannot be sent twice (issue 3, part
4), through the real binary: the second copy is 401 signature_replay; 100
copies arriving at once let exactly one through; and with two sluice
instances sharing a real redis-server, copies spread over both still let
exactly one through, and a copy sent to the other instance later is refused.
The upstream receives exactly the one request that passed. The in-process
store forgets its nonces with the process: after a kill -9 and a restart, a
request signed before the restart is refused (401 signature_before_start)
rather than let through a second time, unless refuse_before_start is off.
"""

import os
import signal
import time

import pytest

import policy_helpers as ph
from helpers import bound, chat_body, wait_until

P = ph.CHAT_PATH


def _copies(instances, tok, n, prompt="once only"):
    """n byte-identical copies of one signed request, spread round-robin
    over the instances."""
    body = ph.body_bytes(chat_body(prompt))
    h = ph.signed_headers(tok, "POST", P, body)
    return [
        (s.host, s.port, ph.request_bytes(s.host, s.port, "POST", P, body, h))
        for s in (instances[i % len(instances)] for i in range(n))
    ], h, body


def _check_one_through(responses, mock, prompt):
    st = ph.statuses(responses)
    assert st == {200: 1, 401: len(responses) - 1}, st
    for r in responses:
        if r.status == 401:
            ph.assert_auth_error(r, "signature_replay")
    reqs = mock.requests()
    assert len(reqs) == 1, len(reqs)
    assert reqs[0]["json"]["messages"][-1]["content"] == prompt


def test_second_copy_is_a_replay(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("alice")
    targets, h, body = _copies([s], tok, 1)
    assert s.request("POST", P, body, h).status == 200
    before = ph.metric(s, "sluice_auth_rejected_total", reason="signature_replay")
    for _ in range(2):
        ph.assert_auth_error(s.request("POST", P, body, h), "signature_replay")
    assert ph.metric(s, "sluice_auth_rejected_total", reason="signature_replay") == before + 2
    assert len(mock.requests()) == 1
    # the same nonce under another token is a different request
    other = ph.mint("alice")
    h2 = ph.signed_headers(other, "POST", P, body, ts=int(h["X-Sluice-Timestamp"]),
                           nonce=h["X-Sluice-Nonce"])
    assert s.request("POST", P, body, h2).status == 200


@pytest.mark.timeout(60)
def test_100_concurrent_copies_one_passes(sluice_factory, mock):
    s = ph.start(sluice_factory, mock)
    tok = ph.mint("alice")
    targets, _, _ = _copies([s], tok, 100)
    responses = ph.burst(targets)
    _check_one_through(responses, mock, "once only")
    assert ph.metric(s, "sluice_auth_rejected_total", reason="signature_replay") == 99


@pytest.mark.timeout(60)
def test_100_copies_over_two_instances_sharing_redis(sluice_factory, mock, redis_server):
    over = {"redis": ph.redis_section(redis_server)}
    a = ph.start(sluice_factory, mock, over, name="a")
    b = ph.start(sluice_factory, mock, over, name="b")
    tok = ph.mint("alice")
    targets, h, body = _copies([a, b], tok, 100)
    responses = ph.burst(targets)
    _check_one_through(responses, mock, "once only")
    # both instances refused copies (the spread was real)
    ra = ph.metric(a, "sluice_auth_rejected_total", reason="signature_replay")
    rb = ph.metric(b, "sluice_auth_rejected_total", reason="signature_replay")
    assert ra + rb == 99 and ra >= 49 and rb >= 49, (ra, rb)
    # a fresh request through A, then its copy to B: a replay there
    tok2 = ph.mint("bob")
    targets, h, body = _copies([a], tok2, 1, "second")
    assert a.request("POST", P, body, h).status == 200
    ph.assert_auth_error(b.request("POST", P, body, h), "signature_replay")
    assert len(mock.requests()) == 2
    assert redis_server.cmd("DBSIZE") >= 2  # the nonces live in Redis


def test_without_redis_instances_do_not_share_nonces(sluice_factory, mock):
    """The documented limit of the in-process store: the replay check is
    per instance (this is what Redis is for)."""
    a = ph.start(sluice_factory, mock, name="a")
    b = ph.start(sluice_factory, mock, name="b")
    tok = ph.mint("alice")
    _, h, body = _copies([a], tok, 1)
    assert a.request("POST", P, body, h).status == 200
    assert b.request("POST", P, body, h).status == 200
    ph.assert_auth_error(a.request("POST", P, body, h), "signature_replay")


def _next_second():
    """Waits for the wall clock's next second (a clock condition, not a
    pause standing in for an event)."""
    now = int(time.time())
    wait_until(lambda: int(time.time()) > now, 2, interval=0.005, what="the next second")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("refuse", [True, False], ids=["refuse_before_start", "off"])
def test_request_signed_before_a_restart_is_not_replayed(sluice_factory, mock, refuse):
    over = {"auth": {"signing": {"refuse_before_start": refuse}}}
    s = ph.start(sluice_factory, mock, over)
    tok = ph.mint("alice")
    _next_second()  # signed in a later second than this process's start
    body = ph.body_bytes(chat_body("signed before the restart"))
    h = ph.signed_headers(tok, "POST", P, body)
    assert s.request("POST", P, body, h).status == 200
    ph.assert_auth_error(s.request("POST", P, body, h), "signature_replay")
    os.kill(s.p.pid, signal.SIGKILL)
    assert s.p.wait(bound(5)) == -signal.SIGKILL
    _next_second()  # the new process starts in a later second than h's
    s.start()
    r = s.request("POST", P, body, h)
    if refuse:
        ph.assert_auth_error(r, "signature_before_start")
        assert ph.metric(s, "sluice_auth_rejected_total", reason="signature_before_start") == 1
        assert len(mock.requests()) == 1
        # refused, not remembered: the client signs again and gets through once
        h2 = ph.signed_headers(tok, "POST", P, body)
        assert s.request("POST", P, body, h2).status == 200
        ph.assert_auth_error(s.request("POST", P, body, h2), "signature_replay")
        assert len(mock.requests()) == 2
    else:
        # what the check closes: the restarted store let the copy through
        assert r.status == 200, r
        assert len(mock.requests()) == 2
