"""
test_ops_reload.py — SIGHUP applies what operators change often (issue 13,
item 4): rate limits (per_user, overrides, keys), auth keys and clients,
filter lists, templates, routes and upstream servers; only listeners,
workers, Redis and the queue store stay restart-only. The limiter's state
survives a reload of its limits: a user at their limit stays limited across
a reload that changes a weight, and a user's partly used bucket keeps its
usage under a changed limit (docs/ratelimit.md, "Reload").

test_core_reload.py has the rest of reload (aliases, upstreams, refusals,
reloads under traffic); test_filters_reload.py the filter lists in detail.
"""

import copy

import helpers
import fallback_helpers as fh
import policy_helpers as ph
from helpers import bound, chat_body, wait_until


def reloads(s, result):
    return sum(v for _, l, v in s.metrics().find("sluice_config_reloads_total")
               if l.get("result") == result)


def reload_and_wait(s, conf):
    """Sends SIGHUP with conf and waits for it to be applied (or fails
    naming the refusal from the error log)."""
    ok, err = reloads(s, "ok"), reloads(s, "error")
    s.reload(conf)
    wait_until(lambda: reloads(s, "ok") + reloads(s, "error") > ok + err, bound(5),
               what="the reload to finish")
    assert reloads(s, "ok") == ok + 1, "reload refused:\n" + s.stderr_text()[-1500:]


def limited(r):
    return r.status == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"


def test_user_at_the_limit_stays_limited_across_a_reload(sluice_factory, mock):
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"requests_per_minute": 5}})
    alice, bob = ph.mint("alice"), ph.mint("bob")
    for i in range(5):
        assert ph.as_user(s, alice, chat_body("a%d" % i)).status == 200
    assert limited(ph.as_user(s, alice))
    # One reload changes an unrelated weight and the ratelimit section
    # itself (an override for bob): before issue 13 the ratelimit change
    # made the whole reload refused.
    conf = copy.deepcopy(s.conf)
    conf["upstreams"]["main"]["servers"][0]["weight"] = 3
    conf["ratelimit"]["overrides"] = {"bob": {"requests_per_minute": 100}}
    reload_and_wait(s, conf)
    r = ph.as_user(s, alice)
    assert limited(r), r  # her bucket was kept, not reset
    assert ph.rl_headers(r)[:2] == (5, 0)
    r = ph.as_user(s, bob)
    assert r.status == 200 and ph.rl_headers(r)[0] == 100, r.headers  # the override applies
    assert len(mock.requests()) == 6  # alice's refusals never went upstream


def test_changed_limit_keeps_the_used_share_of_the_bucket(sluice_factory, mock):
    # alice uses 2 of 10 a minute: 12 s of the bucket's 60 s. Under 4 a
    # minute (15 s a request) those 12 s still count, so after one more
    # request she has 2 left; a reset bucket would leave her 3.
    s = ph.rl_start(sluice_factory, mock, {"per_user": {"requests_per_minute": 10}})
    alice, carol = ph.mint("alice"), ph.mint("carol")
    for _ in range(2):
        assert ph.as_user(s, alice).status == 200
    conf = copy.deepcopy(s.conf)
    conf["ratelimit"]["per_user"]["requests_per_minute"] = 4
    reload_and_wait(s, conf)
    r = ph.as_user(s, alice)
    assert r.status == 200 and ph.rl_headers(r)[:2] == (4, 2), r.headers
    r = ph.as_user(s, carol)  # a fresh user gets the new limit whole
    assert r.status == 200 and ph.rl_headers(r)[:2] == (4, 3), r.headers
    assert ph.as_user(s, alice).status == 200
    assert ph.as_user(s, alice).status == 200
    assert limited(ph.as_user(s, alice))


def test_auth_keys_and_clients_reload(sluice_factory, mock):
    env = {"SLUICE_TEST_K2_SECRET": ph.OTHER_SECRET, "SLUICE_TEST_APP2_SECRET": "app2-secret-0123456789"}
    s = ph.start(sluice_factory, mock, {"auth": {"signing": {"required": False}}}, env=env)
    k1 = ph.mint("alice")
    k2 = ph.mint("alice", kid="k2", secret=ph.OTHER_SECRET)
    assert ph.as_user(s, k1).status == 200
    assert ph.as_user(s, k2).status == 401
    r, _ = ph.fetch_token(s, client_id="app2", secret="app2-secret-0123456789")
    assert r.status == 401, r
    # rotate: k2 in, k1 out; a second client
    conf = copy.deepcopy(s.conf)
    conf["auth"]["tokens"]["keys"] = [{"kid": "k2", "alg": "HS256", "secret_env": "SLUICE_TEST_K2_SECRET"}]
    conf["auth"]["clients"].append({"id": "app2", "secret_env": "SLUICE_TEST_APP2_SECRET"})
    reload_and_wait(s, conf)
    assert ph.as_user(s, k2).status == 200
    r = ph.as_user(s, k1)
    assert r.status == 401 and r.json()["error"]["code"] == "token_unknown_kid", r.json()
    r, tok = ph.fetch_token(s, client_id="app2", secret="app2-secret-0123456789")
    assert r.status == 200, r
    assert ph.as_user(s, tok).status == 200


def test_filters_templates_routes_and_servers_in_one_reload(sluice_factory, mock_factory):
    mock = mock_factory()
    second = mock_factory(name="second")
    s = sluice_factory(upstream=mock)
    assert s.chat("a forbidden word").status == 200
    assert s.chat("hi", model="new-model").status == 404
    conf = copy.deepcopy(s.conf)
    conf = helpers.deep_merge(conf, fh.second_upstream("other", second))
    conf["models"]["new-model"] = {"upstream": "other"}
    conf["filters"] = {"regex": [{"name": "forbidden", "pattern": "forbidden", "action": "block"}]}
    conf["fallback"]["template"] = {"enabled": True, "text": "Reloaded template."}
    conf["upstreams"]["main"]["servers"] = [{"url": second.url}]  # main's server moves
    reload_and_wait(s, conf)
    r = s.chat("a forbidden word")
    assert r.status == 400 and r.json()["error"]["code"] == "content_filter", r
    n = len(second.requests())
    assert s.chat("hi", model="new-model").status == 200
    assert s.chat("hi").status == 200
    assert len(second.requests()) == n + 2
    second.set_default({"status": 503})
    fh.assert_template_json(s.chat("hi"), text="Reloaded template.")
    assert not [q for q in mock.requests() if q["path"] == fh.CHAT][1:]  # the old server: first only
