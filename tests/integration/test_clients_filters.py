"""
test_clients_filters.py — content filters over the Responses API (issue 12,
item 2): the output_text deltas go through the same hold-back and mask as
chat chunks, the full texts repeated by the done events and by
response.completed are the text actually sent, a block ends the stream with
an `error` event, a string `input` is checked like a user message, and a
whole (non-streamed) response is filtered too.
"""

import json

import pytest

import helpers
import policy_helpers as ph

WORDS = ["badword", "敏感词"]


def start(sluice_factory, mock, tmp_path, action="mask"):
    wf = ph.word_file(tmp_path / "words.txt", WORDS)
    f = {"words": [{"file": wf, "action": action}], "output": True}
    return ph.start(sluice_factory, mock, {"filters": f}, auth=False)


def stream(s, text_in="tell me"):
    with s.client(timeout=helpers.bound(10)) as c:
        r, evs = c.stream("POST", "/v1/responses", {"model": "chat-model", "input": text_in,
                                                    "stream": True})
        evs = [e.json() for e in evs if e.data is not None]
    assert r.status == 200, r
    return evs


@pytest.mark.parametrize("events", [1, 3, 7, 22])
def test_mask_across_deltas_and_in_the_full_texts(sluice_factory, mock, tmp_path, events):
    s = start(sluice_factory, mock, tmp_path)
    mock.script({"text": "hello badword and 敏感词 more", "events": events})
    evs = stream(s)
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert deltas == "hello *** and *** more"
    done = [e for e in evs if e["type"] == "response.output_text.done"]
    assert done and done[0]["text"] == deltas
    (completed,) = [e for e in evs if e["type"] == "response.completed"]
    assert completed["response"]["output"][0]["content"][0]["text"] == deltas
    (item_done,) = [e for e in evs if e["type"] == "response.output_item.done"]
    assert item_done["item"]["content"][0]["text"] == deltas
    assert "badword" not in json.dumps(evs, ensure_ascii=False)


def test_block_ends_with_an_error_event(sluice_factory, mock, tmp_path):
    s = start(sluice_factory, mock, tmp_path, action="block")
    mock.script({"text": "safe words then badword and the rest", "events": 6})
    evs = stream(s)
    assert evs[-1]["type"] == "error" and evs[-1]["code"] == "content_filter"
    assert not any(e["type"] == "response.completed" for e in evs)
    assert "badword" not in json.dumps(evs)


def test_whole_response_and_string_input(sluice_factory, mock, tmp_path):
    s = start(sluice_factory, mock, tmp_path)
    mock.script({"text": "a badword here"})
    r = s.request("POST", "/v1/responses", {"model": "chat-model", "input": "say badword"})
    assert r.status == 200
    assert r.json()["output"][0]["content"][0]["text"] == "a *** here"
    # The input was masked before it went upstream.
    assert mock.requests()[-1]["json"]["input"] == "say ***"
    s2 = start(sluice_factory, mock, tmp_path, action="block")
    r = s2.request("POST", "/v1/responses", {"model": "chat-model", "input": "say badword"})
    helpers.assert_error(r, 400, "content_filter")


@pytest.mark.parametrize("events", [1, 5, 16])
def test_mask_in_escaped_deltas(sluice_factory, mock, tmp_path, events):
    # quotes, newlines and \u escapes in the deltas: the filter reads each
    # delta string from the event's bytes and decodes only escaped ones
    s = start(sluice_factory, mock, tmp_path)
    text = 'say "badword"\nthen\t敏感词 \\ and bad\u00e9word end'
    mock.script({"text": text, "events": events})
    evs = stream(s)
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert deltas == 'say "***"\nthen\t*** \\ and bad\u00e9word end', deltas
    done = [e for e in evs if e["type"] == "response.output_text.done"]
    assert done and done[0]["text"] == deltas
