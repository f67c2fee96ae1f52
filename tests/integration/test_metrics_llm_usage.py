"""
test_metrics_llm_usage.py — sluice_tokens_total from a relayed JSON answer's
usage object (llm_metrics.c reads it from the answer's tail with yajl, no
tree): exactly the object's own integer prompt_tokens and completion_tokens,
whatever surrounds them, and nothing from an object that is not whole or
has a negative count (docs/metrics.md).
"""

import json

import pytest


MODEL = "chat-model"


def answer(usage_json, before="", after=""):
    """A chat.completion whose usage member is the given raw JSON text."""
    msg = {"role": "assistant", "content": 'say "usage":{"prompt_tokens":999} back'}
    head = ('{"id":"chatcmpl-u","object":"chat.completion","created":1,"model":"m",%s'
            '"choices":[%s]' % (before, json.dumps({"index": 0, "message": msg,
                                                    "finish_reason": "stop"})))
    return head + ',"usage":' + usage_json + after + "}"


def tokens(sluice):
    s = sluice.metrics()
    return (s.value("sluice_tokens_total", model=MODEL, kind="prompt") or 0,
            s.value("sluice_tokens_total", model=MODEL, kind="completion") or 0)


# (usage member as sent, what it adds to (prompt, completion))
CASES = [
    ('{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40}', (31, 9)),
    # nested details with look-alike keys, members in another order, blanks
    ('{ "completion_tokens" : 7, "prompt_tokens_details": {"prompt_tokens": 500,'
     ' "cached_tokens": 3}, "completion_tokens_details": {"completion_tokens": [1, 2]},'
     ' "prompt_tokens" : 12, "total_tokens": 19}', (12, 7)),
    # a count that is not an integer is not counted; the other one is
    ('{"prompt_tokens":5.0,"completion_tokens":4}', (0, 4)),
    ('{"prompt_tokens":"6","completion_tokens":null}', (0, 0)),
    # a negative count: the object adds nothing
    ('{"prompt_tokens":-1,"completion_tokens":4}', (0, 0)),
    # a duplicate member: the last one
    ('{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":3}', (2, 3)),
    # braces inside strings (the brace count that finds the object's end is
    # misled: yajl decides), then an ordinary object again
    ('{"note":"}{","prompt_tokens":3,"completion_tokens":1}', (3, 1)),
    ('{"note":"{[","prompt_tokens":4,"completion_tokens":2,"d":{"x":"]"}}', (4, 2)),
    ('{"prompt_tokens":"}","completion_tokens":5}', (0, 5)),
    ('{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40}', (31, 9)),
]


@pytest.mark.timeout(60)
def test_usage_members_exact(sluice, mock):
    before = tokens(sluice)
    for usage, (dp, dc) in CASES:
        mock.script({"status": 200, "body": answer(usage)})
        r = sluice.chat("hello")
        assert r.status == 200, (usage, r)
        assert json.loads(r.body)["choices"][0]["finish_reason"] == "stop"
        now = tokens(sluice)
        assert (now[0] - before[0], now[1] - before[1]) == (dp, dc), usage
        before = now


@pytest.mark.timeout(60)
def test_usage_first_or_broken(sluice, mock):
    before = tokens(sluice)
    # usage before the choices, the answer going on after it
    body = ('{"usage":{"prompt_tokens":8,"completion_tokens":2},"id":"x","object":'
            '"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
            '"content":"hi"},"finish_reason":"stop"}]}')
    mock.script({"status": 200, "body": body})
    assert sluice.chat("hello").status == 200
    now = tokens(sluice)
    assert (now[0] - before[0], now[1] - before[1]) == (8, 2)
    # an object that never closes, or is not JSON, adds nothing (the answer
    # is relayed as it came)
    for broken in ('{"prompt_tokens":8,"completion_tokens":2', '{"prompt_tokens":8,,}'):
        mock.script({"status": 200, "body": '{"id":"x","usage":' + broken})
        r = sluice.chat("hello")
        assert r.status == 200 and r.body.decode().endswith(broken), r
    last = tokens(sluice)
    assert last == now, (now, last)
    # the last `"usage":` that holds an object counts (found from the end:
    # a later "usage":null, a nested "usage" that is not an object)
    body = ('{"usage":{"prompt_tokens":1,"completion_tokens":1},"id":"x","choices":[{"index":0,'
            '"message":{"role":"assistant","content":"\\"usage\\":{\\"prompt_tokens\\":99}"},'
            '"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3},'
            '"x":{"usage":5},"usage":null}')
    mock.script({"status": 200, "body": body})
    assert sluice.chat("hello").status == 200
    got = tokens(sluice)
    assert (got[0] - last[0], got[1] - last[1]) == (7, 3)
    last = got
    # and the next whole object counts again
    mock.script({"status": 200, "body": answer('{"prompt_tokens":6,"completion_tokens":1}')})
    assert sluice.chat("hello").status == 200
    again = tokens(sluice)
    assert (again[0] - last[0], again[1] - last[1]) == (6, 1)
