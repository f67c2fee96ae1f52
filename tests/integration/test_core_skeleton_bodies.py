"""
test_core_skeleton_bodies.py — large bodies whose long string interiors
yajl does not read (gateway/body_scan.c's skeleton, issue 21.3): every
offset the scanner records is mapped back to the client's bytes, and the
strings the policies read come from those bytes. What must hold: a banned
word deep inside a long content (plain or as a \\u escape between long runs)
is refused or masked exactly where it is; the alias and a clamped
max_tokens after a MiB of content are spliced at the right bytes and
nothing else changes.
"""

import json

import pytest

import helpers
import policy_helpers as ph
from helpers import assert_error, bound

P = ph.CHAT_PATH
KIB = 1024


def filler(n, seed="The sea is vast and so calm, write about it. "):
    return (seed * (n // len(seed) + 1))[:n]


def _start(sluice_factory, mock, tmp_path, action, more=None):
    wf = ph.word_file(tmp_path / "w.txt", ["badword"])
    over = {"limits": {"max_body_bytes": "4m"},
            "filters": {"words": [{"file": wf, "action": action, "name": "w"}], "mask": "[x]",
                        "input": {"max_chars": 0}}}
    if more:
        over = helpers.deep_merge(over, more)
    return ph.start(sluice_factory, mock, over, auth=False)


def _send(s, raw):
    return s.request("POST", P, raw, {"Content-Type": "application/json"}, timeout=bound(20))


def _body(content_json, tail=""):
    return ('{"model":"chat-model","messages":[{"role":"system","content":"%s"},'
            '{"role":"user","content":%s}]%s}' % (filler(600), content_json, tail)).encode()


# where the word sits in a MiB of content: its first bytes, the middle, the
# last bytes, and as escapes between two long runs
PLACES = [
    ("start", '"badword %s"' % filler(KIB * KIB)),
    ("middle", '"%s badword %s"' % (filler(512 * KIB), filler(512 * KIB))),
    ("end", '"%s badword"' % filler(KIB * KIB)),
    ("escaped", '"%s \\u0062ad\\u0077ord\\n%s"' % (filler(300 * KIB), filler(300 * KIB))),
    ("part", '[{"type":"text","text":"%s"},{"type":"text","text":"%s badword"}]'
     % (filler(200 * KIB), filler(200 * KIB))),
]


@pytest.mark.parametrize("place,content", PLACES, ids=[p for p, _ in PLACES])
def test_banned_word_deep_in_a_long_content_is_blocked(sluice_factory, mock, tmp_path, place,
                                                       content):
    s = _start(sluice_factory, mock, tmp_path, "block")
    r = _send(s, _body(content))
    e = assert_error(r, 400, "content_filter")
    assert e.get("param") == "messages[1].content", e
    ph.assert_upstream_untouched(mock)
    assert ph.metric(s, "sluice_filter_hits_total", rule="w", action="block") == 1
    # the same body without the word goes through untouched
    clean = content.replace("badword", "goodword").replace("\\u0062ad\\u0077ord", "goodword")
    raw = _body(clean)
    r = _send(s, raw)
    assert r.status == 200, r
    (q,) = mock.requests()
    got = q["body"].encode()
    # the alias spliced, the model's default max_tokens added at the end
    want = raw.replace(b'"model":"chat-model"', b'"model":"Qwen2.5-7B-Instruct"', 1)
    assert got.startswith(want[:-1]), got[:200]
    assert set(json.loads(b"{" + got[len(want):]).keys()) == {"max_tokens"}, got[len(want) - 1:]


def test_banned_word_deep_in_a_long_content_is_masked_in_place(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, "mask")
    a, b = filler(400 * KIB), filler(300 * KIB, seed="Another line, with other words. ")
    r = _send(s, _body('"%s\\tbadword %s"' % (a, b)))
    assert r.status == 200, r
    (q,) = mock.requests()
    msgs = q["json"]["messages"]
    assert msgs[0]["content"] == filler(600)
    assert msgs[1]["content"] == a + "\t[x] " + b


def test_alias_and_clamp_after_a_mib_of_content(sluice_factory, mock):
    s = sluice_factory(overrides={"limits": {"max_body_bytes": "4m"},
                                  "filters": {"input": {"max_chars": 0}},
                                  "ratelimit": {"max_tokens": 100,
                                                "per_user": {"tokens_per_minute": 100000000}}},
                       upstream=mock)
    content = filler(KIB * KIB // 2) + '\\"quoted\\" ' + filler(KIB * KIB // 2)
    raw = ('{"messages":[{"role":"user","content":"%s"}],"stream":true,'
           '"model":"chat-model", "max_tokens": 5000 ,"stream_options":{"include_usage":false}}'
           % content).encode()
    r = _send(s, raw)
    assert r.status == 200, r
    (q,) = mock.requests()
    want = (raw.replace(b'"model":"chat-model"', b'"model":"Qwen2.5-7B-Instruct"', 1)
            .replace(b" 5000 ", b" 100 ", 1)
            .replace(b'"include_usage":false', b'"include_usage":true', 1))
    got = q["body"].encode()
    assert len(got) == len(want)
    assert got == want
    assert json.loads(got)["messages"][0]["content"] == json.loads(raw)["messages"][0]["content"]
