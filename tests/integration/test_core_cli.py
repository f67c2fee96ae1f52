"""
test_core_cli.py — the command line (issue 2, part 7): `sluice -t -c FILE`
exits 0 for a good conf and 1 for a bad one, naming file, line and key;
checking binds nothing; the example conf/sluice.yaml is valid; a bad conf
or flag at start-up is a clean non-zero exit.
"""

import re
import socket
import subprocess

import pytest

import helpers
from helpers import free_port

GOOD = """\
listen:
  - address: 127.0.0.1:{port}
admin:
  address: 127.0.0.1:{admin}
workers: 1
upstreams:
  main:
    servers:
      - url: http://127.0.0.1:{up}
        weight: 1
    timeouts:
      connect: 2s
      first_byte: 15s
models:
  chat-model:
    upstream: main
    name: Qwen2.5-7B-Instruct
"""


def run(sluice_bin, *args, cwd=None, timeout=20):
    p = subprocess.run([sluice_bin] + [str(a) for a in args], capture_output=True, cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")


def good_text():
    return GOOD.format(port=free_port(), admin=free_port(), up=free_port())


def test_check_good_conf_exits_0(sluice_bin, tmp_path):
    f = tmp_path / "good.yaml"
    f.write_text(good_text())
    rc, out = run(sluice_bin, "-t", "-c", f)
    assert rc == 0, out
    assert not any(p in out for p in helpers.SANITIZER_PATTERNS), out


def test_check_binds_nothing(sluice_bin, tmp_path):
    # the conf's ports are taken: a check must not care
    held = []
    try:
        ports = []
        for _ in range(2):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            held.append(s)
            ports.append(s.getsockname()[1])
        f = tmp_path / "busy.yaml"
        f.write_text(GOOD.format(port=ports[0], admin=ports[1], up=free_port()))
        rc, out = run(sluice_bin, "-t", "-c", f)
        assert rc == 0, out
    finally:
        for s in held:
            s.close()


def test_example_conf_is_valid(sluice_bin):
    rc, out = run(sluice_bin, "-t", "-c", "conf/sluice.yaml", cwd=helpers.ROOT)
    assert rc == 0, out


def _line_of(text, needle):
    for i, ln in enumerate(text.splitlines(), 1):
        if needle in ln:
            return i
    raise AssertionError(needle)


BAD = [
    # (id, how to break the good text, the line's marker, words the error names)
    ("unknown_top_key", lambda t: t + "bogus_key: 1\n", "bogus_key", ["bogus_key"]),
    ("unknown_nested_key", lambda t: t.replace("    timeouts:\n", "    timeouts:\n      conect: 2s\n"), "conect", ["conect"]),
    ("bad_duration", lambda t: t.replace("connect: 2s", "connect: 2x"), "connect: 2x", ["connect"]),
    ("bad_weight", lambda t: t.replace("weight: 1", "weight: 0"), "weight: 0", ["weight"]),
    ("wrong_type", lambda t: t.replace("workers: 1", "workers: [1]"), "workers:", ["workers"]),
    ("unknown_upstream", lambda t: t.replace("upstream: main", "upstream: nowhere"), ("upstream: nowhere", "chat-model:"), ["nowhere"]),
    ("duplicate_key", lambda t: t.replace("workers: 1\n", "workers: 1\nworkers: 2\n"), "workers: 2", ["workers"]),
    ("tls_cert_without_key", lambda t: t.replace("  - address: 127.0.0.1:", "  - tls: { cert: /tmp/x.crt }\n    address: 127.0.0.1:", 1), "tls:", ["key"]),
    ("yaml_syntax", lambda t: t.replace("models:\n", "models:\n  chat-model: [\n"), None, []),
]


@pytest.mark.parametrize("name,breaker,marker,words", BAD, ids=[b[0] for b in BAD])
def test_check_bad_conf_exits_1_naming_file_line_key(sluice_bin, tmp_path, name, breaker, marker, words):
    text = breaker(good_text())
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    rc, out = run(sluice_bin, "-t", "-c", f)
    assert rc == 1, "rc=%s: %s" % (rc, out)
    m = re.search(re.escape(str(f.name)) + r":(\d+)", out)
    assert m, "no file:line in %r" % out
    if marker is not None:
        markers = marker if isinstance(marker, tuple) else (marker,)
        want = [_line_of(text, mk) for mk in markers]
        assert int(m.group(1)) in want, "line %s, want %s: %s" % (m.group(1), want, out)
    for w in words:
        assert w in out, "%r not named in %r" % (w, out)
    assert not any(p in out for p in helpers.SANITIZER_PATTERNS), out


def test_check_missing_file_exits_1(sluice_bin, tmp_path):
    rc, out = run(sluice_bin, "-t", "-c", tmp_path / "nope.yaml")
    assert rc == 1 and "nope.yaml" in out


def test_start_with_bad_conf_fails_cleanly(sluice_bin, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(good_text() + "bogus_key: 1\n")
    rc, out = run(sluice_bin, "-c", f)
    assert rc not in (0, None) and rc > 0, (rc, out)
    assert "bad.yaml" in out


def test_unknown_flag_is_an_error(sluice_bin):
    rc, out = run(sluice_bin, "--no-such-flag")
    assert rc > 0 and out.strip()


def test_listen_port_in_use_fails_cleanly(sluice_bin, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        f = tmp_path / "busy.yaml"
        f.write_text(GOOD.format(port=s.getsockname()[1], admin=free_port(), up=free_port()))
        rc, out = run(sluice_bin, "-c", f, timeout=20)
        assert rc > 0, (rc, out)
        assert str(s.getsockname()[1]) in out, out
    finally:
        s.close()
