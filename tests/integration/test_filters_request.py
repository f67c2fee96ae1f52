"""
test_filters_request.py — request checks through the real binary (issue 5,
parts 1, 2 and 4), with what the mock upstream received as the proof:
banned words in a prompt (also hidden as \\u escapes, fullwidth forms,
other case, or split over text parts) get 400 content_filter and the
upstream gets nothing, or are masked; keep_turns and max_chars at their
edges; the system prompt prepended or replacing the client's; malformed
shapes refused before anything is forwarded.
"""

import pytest

import policy_helpers as ph
from helpers import assert_error

P = ph.CHAT_PATH


def _start(sluice_factory, mock, tmp_path, filters):
    f = dict(filters)
    if "words" not in f:
        wf = ph.word_file(tmp_path / "blocked.txt", ["badword", "敏感词"])
        f["words"] = [{"file": wf, "action": "block", "name": "blocked"}]
    return ph.start(sluice_factory, mock, {"filters": f}, auth=False)


def _raw(s, body):
    """Sends exact body bytes (escapes as written)."""
    return s.request("POST", P, body.encode("utf-8"), {"Content-Type": "application/json"})


def _msgs(mock):
    (q,) = mock.requests()
    return [(m["role"], m.get("content")) for m in q["json"]["messages"]]


@pytest.mark.parametrize("content_json", [
    r'"say \u0062adword please"',
    r'"say \u0042\u0041\u0044word please"',
    r'"\u654f\u611f\u8bcd"',  # 敏感词, all escaped
    '"say ＢＡＤＷＯＲＤ please"',
    '"say BadWord please"',
    '[{"type":"text","text":"say bad"},{"type":"text","text":"word please"}]',
])
def test_banned_word_in_prompt_is_blocked(sluice_factory, mock, tmp_path, content_json):
    s = _start(sluice_factory, mock, tmp_path, {})
    body = '{"model":"chat-model","messages":[{"role":"system","content":"be nice"},' \
           '{"role":"user","content":%s}]}' % content_json
    r = _raw(s, body)
    e = assert_error(r, 400, "content_filter")
    assert e.get("param") == "messages[1].content", e
    assert "badword" not in r.body.decode().lower() and "敏感词" not in r.body.decode()
    ph.assert_upstream_untouched(mock)
    assert ph.metric(s, "sluice_filter_hits_total", rule="blocked", action="block") == 1


def test_banned_word_in_any_message_is_blocked(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {})
    r = s.request("POST", P, {"model": "chat-model", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "I said badword"},
        {"role": "user", "content": "and?"}]})
    assert assert_error(r, 400, "content_filter")["param"] == "messages[1].content"
    ph.assert_upstream_untouched(mock)


def test_masked_prompt_reaches_upstream_masked(sluice_factory, mock, tmp_path):
    wf = ph.word_file(tmp_path / "m.txt", ["badword"])
    s = _start(sluice_factory, mock, tmp_path, {
        "words": [{"file": wf, "action": "mask"}], "mask": "[x]",
        "regex": [{"name": "email", "pattern": r"[a-z]+@[a-z]+\.com", "action": "mask"}]})
    r = _raw(s, r'{"model":"chat-model","messages":[{"role":"user","content":"a \u0062adword, bob@mail.com!"}]}')
    assert r.status == 200, r
    assert _msgs(mock) == [("user", "a [x], [x]!")]


def test_clean_prompt_passes_unchanged(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {})
    body = '{"model":"chat-model","messages":[{"role":"user","content":"bad word, badwor, \\u0062ad"}]}'
    assert _raw(s, body).status == 200
    assert _msgs(mock) == [("user", "bad word, badwor, bad")]


def _conv(n_turns, system=True):
    m = [{"role": "system", "content": "sys"}] if system else []
    for i in range(1, n_turns + 1):
        m.append({"role": "user", "content": "u%d" % i})
        if i < n_turns:
            m.append({"role": "assistant", "content": "a%d" % i})
    return m


@pytest.mark.parametrize("keep,turns,kept", [
    (2, 2, ["sys", "u1", "a1", "u2"]),           # exactly keep_turns: unchanged
    (2, 3, ["sys", "u2", "a2", "u3"]),           # one over: the oldest turn goes
    (2, 6, ["sys", "u5", "a5", "u6"]),
    (1, 3, ["sys", "u3"]),
    (0, 4, ["sys", "u1", "a1", "u2", "a2", "u3", "a3", "u4"]),  # 0 = all
])
def test_keep_turns_edges(sluice_factory, mock, tmp_path, keep, turns, kept):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"keep_turns": keep}})
    assert s.request("POST", P, {"model": "chat-model", "messages": _conv(turns)}).status == 200
    assert [c for _, c in _msgs(mock)] == kept


def test_keep_turns_keeps_system_in_place_and_tool_turns_whole(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"keep_turns": 2}})
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    msgs = [{"role": "system", "content": "s0"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "developer", "content": "d1"},
            {"role": "user", "content": "u2"}, call, {"role": "tool", "tool_call_id": "c1", "content": "t2"},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}]
    assert s.request("POST", P, {"model": "chat-model", "messages": msgs}).status == 200
    assert _msgs(mock) == [("system", "s0"), ("developer", "d1"), ("user", "u2"), ("assistant", None),
                           ("tool", "t2"), ("assistant", "a2"), ("user", "u3")]


@pytest.mark.parametrize("text,ok", [
    ("你好世界你好世界你好", True),     # 10 code points (30 bytes): at the limit
    ("你好世界你好世界你好!", False),   # 11
    ("0123456789", True),
    ("0123456789a", False),
    ("😀" * 10, True),                 # astral characters are one code point each
])
def test_max_chars_reject_edges(sluice_factory, mock, tmp_path, text, ok):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"max_chars": 10, "on_overflow": "reject"}})
    r = s.chat(text)
    if ok:
        assert r.status == 200, r
        assert _msgs(mock)[-1] == ("user", text)
    else:
        e = assert_error(r, 400, "prompt_too_long")
        assert e["param"] == "messages[0].content"
        ph.assert_upstream_untouched(mock)


def test_max_chars_counts_parts_and_only_user_text(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"max_chars": 10, "on_overflow": "reject"}})
    parts = [{"type": "text", "text": "01234"}, {"type": "text", "text": "567890"}]
    r = s.request("POST", P, {"model": "chat-model", "messages": [{"role": "user", "content": parts}]})
    assert_error(r, 400, "prompt_too_long")
    long_sys = [{"role": "system", "content": "x" * 50}, {"role": "assistant", "content": "y" * 50},
                {"role": "user", "content": "short"}]
    assert s.request("POST", P, {"model": "chat-model", "messages": long_sys}).status == 200
    assert len(mock.requests()) == 1


def test_max_chars_truncate(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"max_chars": 10, "on_overflow": "truncate"}})
    assert s.chat("你好世界你好世界你好和更多的字").status == 200
    assert _msgs(mock) == [("user", "你好世界你好世界你好")]
    mock.reset()
    parts = [{"type": "text", "text": "0123456"}, {"type": "text", "text": "789abc"},
             {"type": "text", "text": "def"}]
    assert s.request("POST", P, {"model": "chat-model", "messages": [{"role": "user", "content": parts}]}).status == 200
    (q,) = mock.requests()
    got = [p["text"] for p in q["json"]["messages"][0]["content"]]
    assert got == ["0123456", "789", ""], got


@pytest.mark.parametrize("mode,want", [
    ("prepend", [("system", "OPERATOR"), ("system", "client sys"), ("user", "hi"),
                 ("developer", "client dev"), ("user", "again")]),
    ("replace", [("system", "OPERATOR"), ("user", "hi"), ("user", "again")]),
])
def test_system_prompt(sluice_factory, mock, tmp_path, mode, want):
    s = _start(sluice_factory, mock, tmp_path,
               {"input": {"system_prompt": "OPERATOR", "system_prompt_mode": mode}})
    msgs = [{"role": "system", "content": "client sys"}, {"role": "user", "content": "hi"},
            {"role": "developer", "content": "client dev"}, {"role": "user", "content": "again"}]
    assert s.request("POST", P, {"model": "chat-model", "messages": msgs}).status == 200
    assert _msgs(mock) == want


def test_system_prompt_is_not_filtered(sluice_factory, mock, tmp_path):
    s = _start(sluice_factory, mock, tmp_path, {"input": {"system_prompt": "never say badword"}})
    assert s.chat("hello").status == 200
    assert _msgs(mock) == [("system", "never say badword"), ("user", "hello")]


@pytest.mark.parametrize("body,code", [
    ({"model": "chat-model"}, "invalid_messages"),
    ({"model": "chat-model", "messages": []}, "invalid_messages"),
    ({"model": "chat-model", "messages": "hi"}, "invalid_messages"),
    ({"model": "chat-model", "messages": [{"role": "wizard", "content": "x"}]}, "invalid_message"),
    ({"model": "chat-model", "messages": [{"role": "user"}]}, "invalid_message"),
    ({"model": "chat-model", "messages": [{"role": "user", "content": 5}]}, "invalid_message"),
    ({"model": "chat-model", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "invalid_message"),
])
def test_malformed_shapes_refused(sluice_factory, mock, tmp_path, body, code):
    s = _start(sluice_factory, mock, tmp_path, {})
    assert_error(s.request("POST", P, body), 400, code)
    ph.assert_upstream_untouched(mock)
