"""
test_core_reload.py — SIGHUP reload (issue 2, part 7): a changed alias or
upstream takes effect, an open stream survives, a bad conf is refused while
the old one keeps serving, keys that need a restart are not half-applied,
and reloads under traffic lose no request.
"""

import copy
import re
import signal
import threading

import helpers
from helpers import bound, chat_body, connect_refused, free_port, wait_until


def reloads(s, ok):
    """sluice_config_reloads_total for successful (ok=True) or failed ones."""
    good = ("ok", "success", "succeeded")
    return sum(
        v for _, l, v in s.metrics().find("sluice_config_reloads_total")
        if (l.get("result") in good) == ok
    )


def last_model(mock):
    return mock.requests()[-1]["json"]["model"]


def with_alias(s, served):
    c = copy.deepcopy(s.conf)
    c["models"]["chat-model"]["name"] = served
    return c


def test_alias_change_takes_effect(sluice, mock):
    assert sluice.chat().status == 200 and last_model(mock) == "Qwen2.5-7B-Instruct"
    before = reloads(sluice, True)
    conf = with_alias(sluice, "Qwen-Reloaded")
    conf["models"]["new-model"] = {"upstream": "main"}
    del conf["models"]["plain-model"]
    sluice.reload(conf)
    wait_until(lambda: sluice.chat().status == 200 and last_model(mock) == "Qwen-Reloaded",
               bound(5), interval=0.05, what="the new alias in use")
    assert reloads(sluice, True) == before + 1
    ids = sorted(m["id"] for m in sluice.request("GET", "/v1/models").json()["data"])
    assert ids == ["chat-model", "embed-model", "new-model"]
    helpers.assert_error(sluice.chat(model="plain-model"), 404, "model_not_found")
    assert sluice.chat(model="new-model").status == 200 and last_model(mock) == "new-model"


def test_upstream_change_takes_effect(sluice_factory, mock_factory):
    a, b = mock_factory("a"), mock_factory("b")
    s = sluice_factory(upstream=a)
    assert s.chat().json()["system_fingerprint"] == "a"
    conf = copy.deepcopy(s.conf)
    conf["upstreams"]["second"] = {"servers": [{"url": b.url}], "api_key_env": helpers.UPSTREAM_KEY_ENV}
    conf["models"]["chat-model"]["upstream"] = "second"
    s.reload(conf)
    wait_until(lambda: s.chat().json()["system_fingerprint"] == "b", bound(5), interval=0.05,
               what="requests going to the new upstream")
    assert s.chat(model="embed-model").json()["system_fingerprint"] == "a"


def test_open_stream_survives_reload(sluice, mock):
    mock.script({"gate": True, "events": 3})
    with sluice.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("long one", stream=True))
        evs = (e for e in evs if e.data is not None)
        got = [next(evs)]
        (req,) = mock.requests()
        sluice.reload(with_alias(sluice, "Qwen-After"))
        wait_until(lambda: sluice.chat().status == 200 and last_model(mock) == "Qwen-After",
                   bound(5), interval=0.05, what="the reload to take effect")
        mock.release(n=100, request=req["id"])
        got += list(evs)
    assert got[-1].is_done and r.complete
    text = "".join((e.json()["choices"][0]["delta"].get("content") or "") for e in got[:-1])
    assert text == helpers.mock_upstream.reply_text("long one", 3)
    conn = next(x for x in mock.connections() if x["id"] == req["conn"])
    assert mock.requests()[0]["outcome"] == "complete", conn


def test_bad_conf_is_refused_and_old_one_serves(sluice, mock):
    before_ok, before_bad = reloads(sluice, True), reloads(sluice, False)
    good_text = sluice.conf_path.read_text()
    for bad in (
        "listen: [\n",  # not YAML
        good_text + "no_such_key: 1\n",  # unknown key
        good_text.replace("upstream: main", "upstream: nowhere", 1),  # broken reference
    ):
        n_bad = reloads(sluice, False)
        sluice.write_conf_text(bad)
        sluice.p.signal(signal.SIGHUP)
        wait_until(lambda: reloads(sluice, False) == n_bad + 1, bound(5), what="the failed reload counted")
        assert sluice.alive()
        r = sluice.chat()
        assert r.status == 200 and last_model(mock) == "Qwen2.5-7B-Instruct"
    assert reloads(sluice, True) == before_ok
    assert reloads(sluice, False) == before_bad + 3
    # the error names the file and a line
    name = re.escape(sluice.conf_path.name)
    assert re.search(name + r":\d+", sluice.stderr_text()), sluice.stderr_text()[-2000:]
    # and a good conf afterwards is taken
    sluice.reload(with_alias(sluice, "Qwen-Fixed"))
    wait_until(lambda: sluice.chat().status == 200 and last_model(mock) == "Qwen-Fixed", bound(5),
               interval=0.05, what="the good conf after bad ones")


def test_restart_only_change_is_not_half_applied(sluice, mock):
    new_port = free_port()
    conf = copy.deepcopy(sluice.conf)
    conf["listen"] = [{"address": "127.0.0.1:%d" % new_port}]
    conf["models"]["chat-model"]["name"] = "Qwen-Should-Not-Apply"
    n_bad = reloads(sluice, False)
    old = sluice.conf
    sluice.reload(conf)
    sluice.conf = old  # refused: the running sluice still has the old listeners
    wait_until(lambda: reloads(sluice, False) == n_bad + 1, bound(5), what="the reload refused")
    assert connect_refused("127.0.0.1", new_port)
    assert sluice.chat().status == 200 and last_model(mock) == "Qwen2.5-7B-Instruct"


def test_reloads_under_traffic_lose_nothing(sluice, mock):
    confs = [with_alias(sluice, "Qwen-A"), with_alias(sluice, "Qwen-B")]
    stop = threading.Event()
    results = []

    def traffic():
        while not stop.is_set():
            try:
                with sluice.client() as c:
                    r = c.request("POST", "/v1/chat/completions", chat_body("t"))
                    results.append(r.status)
                    if len(results) % 3 == 0:
                        rr, evs = c.stream("POST", "/v1/chat/completions", chat_body("s", stream=True))
                        results.append(200 if [e for e in evs if e.data][-1].is_done else -1)
            except Exception as e:  # counted as a failure below
                results.append(repr(e))

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(10):
            n = reloads(sluice, True)
            sluice.reload(confs[i % 2])
            wait_until(lambda: reloads(sluice, True) == n + 1, bound(5), what="reload %d" % i)
    finally:
        stop.set()
        for t in threads:
            t.join(bound(20))
    assert results and all(x == 200 for x in results), [x for x in results if x != 200][:5]
    assert sluice.alive()
