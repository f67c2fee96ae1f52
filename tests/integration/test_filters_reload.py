"""
test_filters_reload.py — word lists reloaded on SIGHUP through the real
binary (issue 5, part 2): a new word takes effect for new requests, a
stream in flight keeps the rules it started with, and a reload that cannot
build its rules (a missing list) keeps the running ones.
"""

import os

import helpers
import policy_helpers as ph
from helpers import chat_body, wait_until


def _last_prompt(mock):
    return mock.requests()[-1]["json"]["messages"][-1]["content"]


def _wait_rules(s, mock, probe, want):
    """Polls with prompt `probe` until the mock receives it as `want`."""
    def ok():
        r = s.chat(probe)
        return r.status == 200 and _last_prompt(mock) == want
    wait_until(ok, helpers.bound(5), interval=0.05, what="the reloaded word list in effect")


def test_sighup_reload_new_word_and_in_flight_stream_keeps_old_rules(sluice_factory, mock, tmp_path):
    wf = ph.word_file(tmp_path / "words.txt", ["oldword"])
    s = ph.start(sluice_factory, mock, {"filters": {"words": [{"file": wf, "action": "mask"}]}}, auth=False)
    assert s.chat("say oldword newword").status == 200
    assert _last_prompt(mock) == "say *** newword"

    mock.script({"gate": True, "raw": ph.raw_stream("start ", "oldword newword", " end")})
    with s.client(timeout=helpers.bound(10)) as c:
        r, it = c.stream("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        assert r.status == 200
        it = (e for e in it if e.data is not None)
        assert ph.event_text(next(it)) == "start "  # the stream runs on the old rules now
        (q,) = [x for x in mock.requests() if x["outcome"] == "in_progress"]

        ph.word_file(wf, ["newword"])
        s.reload()
        _wait_rules(s, mock, "say oldword newword", "say oldword ***")

        mock.release(n=10, request=q["id"])
        rest = list(it)
    old = "".join(ph.event_text(e) for e in rest)
    assert old == "*** newword end", old  # the rules it started with
    assert rest[-1].is_done

    mock.script({"raw": ph.raw_stream("start ", "oldword newword", " end")})
    with s.client() as c:
        r, it = c.stream("POST", ph.CHAT_PATH, chat_body("x", stream=True))
        new = "".join(ph.event_text(e) for e in it if e.data is not None)
    assert new == "start oldword *** end", new


def test_failed_reload_keeps_running_rules(sluice_factory, mock, tmp_path):
    wf = ph.word_file(tmp_path / "words.txt", ["keepword"])
    s = ph.start(sluice_factory, mock, {"filters": {"words": [{"file": wf, "action": "mask"}]}}, auth=False)
    os.unlink(wf)
    n_err = len(s.stderr_text())
    s.reload()
    # the reload is refused and says so (file:line style), sluice keeps serving
    wait_until(lambda: "words.txt" in s.stderr_text()[n_err:], helpers.bound(5),
               what="the failed reload logged")
    assert s.chat("a keepword b").status == 200
    assert _last_prompt(mock) == "a *** b"
    # and a fixed list then reloads
    ph.word_file(wf, ["otherword"])
    s.reload()
    _wait_rules(s, mock, "a keepword otherword", "a keepword ***")
