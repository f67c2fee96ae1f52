"""
test_fallback_retry.py — the retry tier through the real binary (issue 6,
tier 1): a connect failure, a 5xx or the first-byte timeout is retried while
nothing reached the client, with the same request body, on another server of
the pool when there is one, after a jittered exponential backoff, honouring
Retry-After (and giving up on the server when it asks for longer than
backoff_max); 501 is never retried; attempts and the retry budget bound it.
Everything is counted at the mock (requests, their bodies, arrival times)
and in /metrics.
"""

import time

import fallback_helpers as fh
import helpers
from helpers import bound, mock_upstream

BREAKER_OFF = {"failures": 0, "failure_percent": 0}


def retrying(attempts=1, backoff="10ms", **more):
    r = {"attempts": attempts, "backoff": backoff, "budget_percent": 100, "budget_min": 100}
    r.update(more)
    return r


def echo(prompt):
    return mock_upstream.reply_text(prompt)


def test_5xx_is_retried_with_the_same_body(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(retry=retrying(), template=False), upstream=mock)
    m0 = fh.Metrics(s)
    body = helpers.chat_body("retry me", temperature=0.25, max_tokens=7,
                             messages=[{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "retry me"}])
    for stream in (False, True):
        mock.reset()
        mock.script({"status": 503})
        b = dict(body, stream=True) if stream else body
        if stream:
            r, evs = fh.stream(s, b)
            assert r.status == 200 and evs[-1].is_done, (r, evs)
            text = "".join(e.json()["choices"][0]["delta"].get("content") or "" for e in evs[:-1])
        else:
            r = s.request("POST", fh.CHAT, b)
            assert r.status == 200, r
            text = r.json()["choices"][0]["message"]["content"]
        assert text == echo("retry me")
        # A retry is not a fallback tier the client is told about.
        assert r.header("X-Sluice-Fallback") is None
        reqs = mock.requests()
        assert [q["status"] for q in reqs] == [503, 200]
        assert reqs[0]["body"] == reqs[1]["body"], "the retry must resend the same bytes"
        assert reqs[0]["json"]["model"] == "Qwen2.5-7B-Instruct"  # the alias, both times
        assert reqs[0]["json"]["temperature"] == 0.25
        ids = fh.mock_ids(mock)
        assert ids[0] == ids[1] == r.header("X-Request-Id"), ids
    assert m0.delta("sluice_retries_total", upstream="main") == 2
    assert m0.delta("sluice_fallback_total", tier="retry") == 2
    assert m0.delta("sluice_upstream_errors_total", upstream="main", kind="status_5xx") == 2


def test_connect_failure_is_retried_on_the_other_server(sluice_factory, mock):
    dead = fh.dead_url()
    over = fh.merge(
        fh.chain(retry=retrying(), circuit=BREAKER_OFF, template=False),
        {"upstreams": {"main": {"servers": [{"url": dead}, {"url": mock.url}]}}},
    )
    s = sluice_factory(overrides=over, upstream=mock)
    n = 20
    rs = [s.chat("c%d" % i) for i in range(n)]
    assert [r.status for r in rs] == [200] * n
    assert [r.json()["choices"][0]["message"]["content"] for r in rs] == [echo("c%d" % i) for i in range(n)]
    # Every request reached the live server exactly once.
    assert sorted(fh.mock_ids(mock)) == sorted(r.header("X-Request-Id") for r in rs)
    m = s.metrics()
    refused = m.value("sluice_upstream_errors_total", upstream="main", kind="connect")
    # Round robin sends about half to the dead one first; each is retried.
    assert 5 <= refused <= 15, refused
    assert m.value("sluice_retries_total", upstream="main") == refused


def test_retry_prefers_another_server(sluice_factory, mock_factory):
    a = mock_factory(name="a")
    b = mock_factory(name="b")
    a.set_default({"status": 503})
    over = fh.merge(
        fh.chain(retry=retrying(attempts=3), circuit=BREAKER_OFF, template=False),
        {"upstreams": {"main": {"servers": [{"url": a.url}, {"url": b.url}]}}},
    )
    s = sluice_factory(overrides=over, upstream=a)
    rs = [s.chat("p%d" % i) for i in range(20)]
    assert [r.status for r in rs] == [200] * 20
    ids_a, ids_b = fh.mock_ids(a), fh.mock_ids(b)
    assert len(ids_b) == 20 and len(set(ids_b)) == 20
    # With three attempts allowed, going back to a would show a request
    # there twice: every retry went to b.
    assert len(ids_a) == len(set(ids_a)) and 5 <= len(ids_a) <= 15, ids_a
    assert set(ids_a) <= set(ids_b)
    assert fh.metric(s, "sluice_retries_total", upstream="main") == len(ids_a)


def test_first_byte_timeout_is_retried(sluice_factory, mock):
    over = fh.merge(fh.chain(retry=retrying(), template=False),
                    {"upstreams": {"main": {"timeouts": {"first_byte": "300ms"}}}})
    s = sluice_factory(overrides=over, upstream=mock)
    mock.script({"stall_first_byte": 5})
    t0 = time.monotonic()
    r = s.chat("slow then fast")
    dt = time.monotonic() - t0
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == echo("slow then fast")
    assert 0.3 <= dt < bound(2.0), dt
    q0, second = mock.requests()
    first = mock.wait_request_state(q0["id"], lambda q: q["outcome"] != "in_progress")
    assert first["outcome"] == "peer_closed" and first["status"] is None  # sluice gave up on it
    assert second["body"] == first["body"]
    assert second["t"] - first["t"] >= 0.3
    assert fh.metric(s, "sluice_upstream_errors_total", upstream="main", kind="first_byte_timeout") == 1


def test_retry_after_is_honoured_and_bounded(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(retry=retrying(backoff="10ms", backoff_max="2s"), template=False),
                       upstream=mock)
    # Seconds: the retry waits for it (the only server asked for a pause).
    mock.script({"status": 503, "retry_after": 1})
    r = s.chat("after one second")
    assert r.status == 200
    q1, q2 = mock.requests()
    assert 0.95 <= q2["t"] - q1["t_end"] < bound(1.8), q2["t"] - q1["t_end"]
    # An HTTP-date two seconds ahead (second granularity: 1..2 s from now).
    mock.reset()
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 2))
    mock.script({"status": 503, "retry_after": date})
    assert s.chat("after a date").status == 200
    q1, q2 = mock.requests()
    assert 0.9 <= q2["t"] - q1["t_end"] < bound(2.5), q2["t"] - q1["t_end"]
    # Longer than backoff_max: no retry on that server; the client gets an
    # answer now, not after the pause (the template when it is on).
    mock.reset()
    mock.script({"status": 503, "retry_after": 30})
    t0 = time.monotonic()
    r = s.chat("after thirty seconds")
    assert time.monotonic() - t0 < bound(0.5)
    assert r.status == 503
    assert len(mock.requests()) == 1
    s.reload(helpers.deep_merge(s.conf, {"fallback": {"template": {"enabled": True}}}))
    helpers.wait_until(lambda: fh.metric(s, "sluice_config_reloads_total", result="ok") == 1, bound(5),
                       what="reload")
    mock.reset()
    mock.script({"status": 503, "retry_after": 30})
    t0 = time.monotonic()
    fh.assert_template_json(s.chat("after thirty seconds"))
    assert time.monotonic() - t0 < bound(0.5)
    assert len(mock.requests()) == 1


def test_declined_retry_relays_the_upstream_answer(sluice_factory, mock):
    """When no tier answers, the client should get what the upstream said
    (its Retry-After above all), as it does with the chain off."""
    s = sluice_factory(overrides=fh.chain(retry=retrying(backoff_max="2s"), template=False), upstream=mock)
    mock.script({"status": 503, "retry_after": 30, "body": {"error": {"message": "GPU busy",
                                                                     "type": "server_error",
                                                                     "code": "overloaded"}}})
    r = s.chat("relay me")
    assert r.status == 503 and len(mock.requests()) == 1
    assert r.header("Retry-After") == "30", r.headers
    assert r.json()["error"]["message"] == "GPU busy", r.body


def test_attempts_backoff_and_what_is_never_retried(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(retry=retrying(attempts=2, backoff="100ms"), template=False),
                       upstream=mock)
    m0 = fh.Metrics(s)
    mock.set_default({"status": 502})
    r = s.chat("always failing")
    assert r.status == 502
    q = mock.requests()
    assert len(q) == 3  # the try and two retries
    g1, g2 = q[1]["t"] - q[0]["t_end"], q[2]["t"] - q[1]["t_end"]
    assert 0.05 <= g1 < bound(0.5), g1  # backoff in [half, full] of 100 ms
    assert 0.1 <= g2 < bound(0.7), g2  # doubled: [100, 200] ms
    assert len({x["body"] for x in q}) == 1
    # 501 (and 505): no retry fixes them.
    mock.reset()
    mock.set_default({"status": 501})
    assert s.chat("not implemented").status == 501
    assert len(mock.requests()) == 1
    # A 4xx is the client's: relayed, not retried.
    mock.reset()
    mock.set_default({"status": 429, "retry_after": 1})
    assert s.chat("slow down").status == 429
    assert len(mock.requests()) == 1
    assert m0.delta("sluice_retries_total", upstream="main") == 2


def test_budget_spent_means_no_retry(sluice_factory, mock):
    s = sluice_factory(overrides=fh.chain(retry={"attempts": 1, "backoff": "10ms", "budget_percent": 0,
                                                 "budget_min": 0}, template=False), upstream=mock)
    mock.script({"status": 503}, {"status": 503})
    assert s.chat("no budget").status == 503
    assert len(mock.requests()) == 1
    m = s.metrics()
    assert m.value("sluice_retry_budget_exhausted_total", upstream="main") == 1
    assert m.value("sluice_retries_total", upstream="main") == 0
