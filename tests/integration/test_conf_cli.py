"""
test_conf_cli.py — the conf conveniences of issue 13 (items 5, 6) through
the real binary: `sluice -t` lists every error as `file:line: key: message`
with "did you mean" for near-miss keys; errors found after loading (secrets
in the environment) carry their line too; `${VAR}` / `${VAR:-default}` in
values; `include:` globs adding upstreams and models, with errors naming the
included file; the default conf path when no -c is given.
"""

import os
import re
import subprocess

import helpers
from helpers import free_port


def run(sluice_bin, *args, env=None, cwd=None, timeout=20):
    e = dict(os.environ)
    e.setdefault(helpers.UPSTREAM_KEY_ENV, helpers.UPSTREAM_KEY)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run([str(sluice_bin)] + [str(a) for a in args], capture_output=True, env=e,
                       cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")


def conf_text(upstream="http://127.0.0.1:9"):
    return helpers.to_yaml(helpers.base_conf(free_port(), free_port(), upstream))


def error_lines(out, fname):
    return [ln for ln in out.splitlines() if re.match(r"sluice: .*%s:\d+: " % re.escape(fname), ln)]


def test_three_mistakes_three_errors(sluice_bin, tmp_path):
    text = conf_text().replace("shutdown_timeout: 5s", "shutdown_timout: 5s")
    text = text.replace("workers: 2", "workers: lots")
    text = text.replace("connect: 2s", "conect: 2s")
    f = tmp_path / "three.yaml"
    f.write_text(text)
    rc, out = run(sluice_bin, "-t", "-c", f)
    assert rc == 1, out
    lines = error_lines(out, f.name)
    assert len(lines) == 3, out
    lineno = {k: text.splitlines().index(next(l for l in text.splitlines() if l.strip().startswith(k))) + 1
              for k in ("shutdown_timout", "workers", "conect")}
    assert "%s:%d: shutdown_timout: unknown key; did you mean `shutdown_timeout`?" % (f, lineno["shutdown_timout"]) in out
    assert "%s:%d: workers: expected an integer or auto, got \"lots\"" % (f, lineno["workers"]) in out
    assert "%s:%d: upstreams.main.timeouts.conect: unknown key; did you mean `connect`?" % (f, lineno["conect"]) in out
    assert "test failed (3 errors)" in out
    assert not any(p in out for p in helpers.SANITIZER_PATTERNS), out


def test_secret_error_keeps_its_line(sluice_bin, tmp_path):
    text = conf_text() + (
        "auth:\n"
        "  tokens:\n"
        "    keys:\n"
        "      - kid: k1\n"
        "        alg: HS256\n"
        "        secret_env: SLUICE_TEST_NO_SUCH_SECRET\n"
        "  signing:\n"
        "    secret_env: SLUICE_TEST_SHORT_SECRET\n"
    )
    f = tmp_path / "secrets.yaml"
    f.write_text(text)
    kid_line = text.splitlines().index("      - kid: k1") + 1
    sign_line = text.splitlines().index("    secret_env: SLUICE_TEST_SHORT_SECRET") + 1
    rc, out = run(sluice_bin, "-t", "-c", f, env={"SLUICE_TEST_NO_SUCH_SECRET": None})
    assert rc == 1, out
    assert "%s:%d: " % (f, kid_line) in out and "SLUICE_TEST_NO_SUCH_SECRET is not set" in out, out
    rc, out = run(sluice_bin, "-t", "-c", f,
                  env={"SLUICE_TEST_NO_SUCH_SECRET": "k" * 40, "SLUICE_TEST_SHORT_SECRET": "short"})
    assert rc == 1, out
    assert "%s:%d: " % (f, sign_line) in out and "SLUICE_TEST_SHORT_SECRET" in out, out
    # The secret itself is never printed.
    rc, out = run(sluice_bin, "-t", "-c", f,
                  env={"SLUICE_TEST_NO_SUCH_SECRET": "k" * 40, "SLUICE_TEST_SHORT_SECRET": "s" * 40})
    assert rc == 0, out
    assert "k" * 40 not in out


def test_env_substitution_check_and_run(sluice_factory, mock, tmp_path):
    port, admin = free_port(), free_port()
    conf = helpers.base_conf(port, admin, mock.url)
    conf["listen"][0]["address"] = "127.0.0.1:${SLUICE_TEST_PORT}"
    conf["admin"]["address"] = "${SLUICE_TEST_ADMIN:-127.0.0.1:%d}" % admin
    conf["models"]["chat-model"]["name"] = "${SLUICE_TEST_SERVED:-Qwen2.5-7B-Instruct}"
    s = sluice_factory(conf=conf, env={"SLUICE_TEST_PORT": str(port), "SLUICE_TEST_ADMIN": None,
                                       "SLUICE_TEST_SERVED": None}, start=False)
    # The helpers read ports from the conf: give them the substituted ones.
    s.conf = helpers.deep_merge(conf, {"listen": [{"address": "127.0.0.1:%d" % port}],
                                       "admin": {"address": "127.0.0.1:%d" % admin}})
    s.start()
    r = s.chat("hello")
    assert r.status == 200, r.body
    # The mock answers with the model name it was sent (the alias target).
    assert b"Qwen2.5-7B-Instruct" in r.body, r.body


def test_env_unset_names_the_variable(sluice_bin, tmp_path):
    text = conf_text().replace("workers: 2", "workers: ${SLUICE_TEST_WORKERS}")
    f = tmp_path / "env.yaml"
    f.write_text(text)
    line = text.splitlines().index("workers: ${SLUICE_TEST_WORKERS}") + 1
    rc, out = run(sluice_bin, "-t", "-c", f, env={"SLUICE_TEST_WORKERS": None})
    assert rc == 1
    assert "%s:%d: workers: environment variable SLUICE_TEST_WORKERS is not set" % (f, line) in out, out
    rc, out = run(sluice_bin, "-t", "-c", f, env={"SLUICE_TEST_WORKERS": "1"})
    assert rc == 0, out


def test_include_adds_models_and_upstreams(sluice_factory, mock, tmp_path):
    conf = helpers.base_conf(free_port(), free_port(), mock.url)
    conf["include"] = "conf.d/*.yaml"
    s = sluice_factory(conf=conf, start=False)
    d = s.dir / "conf.d"
    d.mkdir()
    (d / "10-extra.yaml").write_text(
        "upstreams:\n"
        "  extra:\n"
        "    servers: [{url: '%s'}]\n"
        "    api_key_env: %s\n"
        "models:\n"
        "  extra-model: {upstream: extra, name: served-by-extra}\n" % (mock.url, helpers.UPSTREAM_KEY_ENV)
    )
    rc, out = run(s.bin, "-t", "-c", s.conf_path)
    assert rc == 0, out
    s.start()
    r = s.chat("hi", model="extra-model")
    assert r.status == 200, r.body
    assert b"served-by-extra" in r.body, r.body
    r = s.request("GET", "/v1/models")
    assert b"extra-model" in r.body and b"chat-model" in r.body


def test_include_errors_name_the_included_file(sluice_bin, tmp_path):
    text = conf_text() + "include: [conf.d/*.yaml]\n"
    f = tmp_path / "main.yaml"
    f.write_text(text)
    (tmp_path / "conf.d").mkdir()
    bad = tmp_path / "conf.d" / "bad.yaml"
    bad.write_text("models:\n  x: {upstream: main, nmae: y}\nworkers: 3\n")
    rc, out = run(sluice_bin, "-t", "-c", f)
    assert rc == 1
    assert "%s:2: models.x.nmae: unknown key; did you mean `name`?" % bad in out, out
    assert "%s:3: workers: an included file may only hold lists and maps" % bad in out, out
    bad.write_text("include: ../main.yaml\n")
    rc, out = run(sluice_bin, "-t", "-c", f)
    assert rc == 1 and "is included twice (an include cycle?)" in out, out


def test_default_conf_path(sluice_bin):
    # No -c: /etc/sluice/sluice.yaml, named in the answer either way.
    rc, out = run(sluice_bin, "-t")
    assert "/etc/sluice/sluice.yaml" in out, out
    rc2, out2 = run(sluice_bin, "--help")
    assert rc2 == 0 and "/etc/sluice/sluice.yaml" in out2
