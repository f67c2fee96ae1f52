"""
test_ops_install.py — the deployment files (issue 13, items 1 and 2):
`make install` with DESTDIR and PREFIX puts each file where sluice(8) says,
with its mode, and keeps an operator's conf; the installed unit has the
directives the issue asks for and passes `systemd-analyze verify` without a
single message (a broken copy does not: the check can fail); the man page
renders without warnings and documents every signal and exit code; the
logrotate file, run by the real logrotate, moves the log and signals only
sluice's main process with USR1.

The Debian package itself is built and checked in CI (scripts/package.sh):
a minute of compiling is too long for the suite.
"""

import os
import re
import shutil
import stat
import subprocess

import pytest

from helpers import ROOT

UNIT = ROOT / "contrib" / "systemd" / "sluice.service"
LOGROTATE = ROOT / "contrib" / "logrotate" / "sluice"
MAN = ROOT / "docs" / "sluice.8"


def make_install(sluice_bin, destdir, *args):
    # Not the variables of a make that runs this suite (PREFIX=..., SANITIZE=1).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    p = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "install", "DESTDIR=%s" % destdir,
         "SL_INSTALL_BIN=%s" % sluice_bin] + list(args),
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    return p.stdout.decode()


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def unit_directives(text):
    """[section] -> list of (key, value), in order (keys may repeat)."""
    out, sec = {}, None
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln or ln.startswith(("#", ";")):
            continue
        if ln.startswith("["):
            sec = ln.strip("[]")
            out[sec] = []
            continue
        k, _, v = ln.partition("=")
        out[sec].append((k.strip(), v.strip()))
    return out


def verify(unit_path, destdir):
    """systemd-analyze verify on a copy of the unit whose binary path points
    into destdir; returns its messages (it exits 0 on unknown keys, so the
    output is what tells)."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    vdir = destdir.parent / "verify"
    vdir.mkdir(exist_ok=True)
    text = unit_path.read_text().replace("/usr/sbin/sluice", str(destdir / "usr/sbin/sluice"))
    (vdir / "sluice.service").write_text(text)
    env = dict(os.environ, MANPATH=str(destdir / "usr/share/man"))
    p = subprocess.run(
        ["systemd-analyze", "verify", str(vdir / "sluice.service")],
        capture_output=True,
        timeout=60,
        env=env,
    )
    return (p.stdout.decode() + p.stderr.decode()).strip()


@pytest.fixture
def installed(sluice_bin, tmp_path):
    d = tmp_path / "root"
    make_install(sluice_bin, d)
    return d


def test_install_layout_and_modes(installed, sluice_bin):
    d = installed
    want = {
        "usr/sbin/sluice": 0o755,
        "usr/share/man/man8/sluice.8": 0o644,
        "lib/systemd/system/sluice.service": 0o644,
        "etc/sluice/sluice.yaml": 0o644,
        "etc/default/sluice": 0o600,
        "etc/logrotate.d/sluice": 0o644,
    }
    for rel, m in want.items():
        assert (d / rel).is_file(), rel
        assert mode(d / rel) == m, "%s mode %o, want %o" % (rel, mode(d / rel), m)
    for rel in ("var/lib/sluice", "var/log/sluice"):
        assert (d / rel).is_dir(), rel
    assert (d / "usr/sbin/sluice").read_bytes() == open(sluice_bin, "rb").read()
    assert (d / "etc/sluice/sluice.yaml").read_text() == (ROOT / "conf/sluice.yaml").read_text()
    # the installed example conf is valid as shipped
    p = subprocess.run(
        [str(d / "usr/sbin/sluice"), "-t", "-c", str(d / "etc/sluice/sluice.yaml")],
        capture_output=True,
        timeout=20,
    )
    assert p.returncode == 0, p.stderr.decode()


def test_install_keeps_an_operators_conf(installed, sluice_bin):
    conf = installed / "etc/sluice/sluice.yaml"
    env = installed / "etc/default/sluice"
    conf.write_text("# mine\n")
    env.write_text("SECRET=x\n")
    out = make_install(sluice_bin, installed)
    assert conf.read_text() == "# mine\n"
    assert env.read_text() == "SECRET=x\n"
    assert "kept" in out


def test_prefix_moves_the_binary_and_the_unit_follows(sluice_bin, tmp_path):
    d = tmp_path / "root"
    make_install(sluice_bin, d, "PREFIX=/usr/local")
    assert (d / "usr/local/sbin/sluice").is_file()
    assert (d / "usr/local/share/man/man8/sluice.8").is_file()
    assert not (d / "usr/sbin").exists()
    unit = (d / "lib/systemd/system/sluice.service").read_text()
    starts = [v for k, v in unit_directives(unit)["Service"] if k.startswith("Exec")]
    assert len(starts) == 4, starts
    for v in starts:
        assert "/usr/sbin/sluice" not in v.replace("/usr/local/sbin/sluice", ""), v
    assert "ExecStart=/usr/local/sbin/sluice -c /etc/sluice/sluice.yaml" in unit


def test_unit_has_what_the_issue_asks(installed):
    u = unit_directives((installed / "lib/systemd/system/sluice.service").read_text())
    s = dict(u["Service"])
    assert s["Type"] == "notify"
    assert s["NotifyAccess"] == "all"  # the SIGUSR2 upgrade's MAINPID=
    reload = [v for k, v in u["Service"] if k == "ExecReload"]
    assert reload == ["/usr/sbin/sluice -t -c /etc/sluice/sluice.yaml", "/bin/kill -HUP $MAINPID"]
    assert s["ExecStart"] == "/usr/sbin/sluice -c /etc/sluice/sluice.yaml"
    assert s["ProtectSystem"] == "strict"
    assert s["NoNewPrivileges"] == "yes"
    assert s["CapabilityBoundingSet"] == "CAP_NET_BIND_SERVICE"
    assert s["ReadWritePaths"].split() == ["/var/lib/sluice", "-/var/log/sluice"]
    assert s["StateDirectory"] == "sluice" and s["StateDirectoryMode"] == "0750"
    assert int(s["LimitNOFILE"]) >= 65536
    assert s["KillMode"] == "mixed"
    assert s["User"] == "sluice"
    assert "MemoryDenyWriteExecute" not in s  # PCRE2 JIT
    assert u["Install"] == [("WantedBy", "multi-user.target")]


def test_systemd_analyze_verify_is_clean(installed):
    out = verify(installed / "lib/systemd/system/sluice.service", installed)
    assert out == "", out


def test_systemd_analyze_verify_catches_a_broken_unit(installed, tmp_path):
    bad = tmp_path / "bad" / "sluice.service"
    bad.parent.mkdir()
    text = (installed / "lib/systemd/system/sluice.service").read_text()
    bad.write_text(text.replace("KillMode=mixed", "KillMode=mixd").replace("Type=notify", "Tpye=notify"))
    out = verify(bad, installed)
    assert "mixd" in out and "Tpye" in out, out


def test_man_page_renders_and_documents_signals_and_exit_codes():
    if not shutil.which("man"):
        pytest.skip("man not installed (Debian package man-db)")
    p = subprocess.run(
        ["man", "--warnings", "-l", str(MAN)],
        capture_output=True,
        timeout=30,
        env=dict(os.environ, MANWIDTH="100", MAN_KEEP_FORMATTING="0"),
    )
    assert p.returncode == 0
    assert p.stderr.decode() == "", p.stderr.decode()
    text = re.sub(r".\x08", "", p.stdout.decode())
    sections = re.findall(r"^([A-Z][A-Z ]+)$", text, re.M)
    for s in ("NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "SIGNALS", "FILES", "EXIT STATUS"):
        assert s in sections, (s, sections)
    sig = text.split("\nSIGNALS\n", 1)[1].split("\nSYSTEMD\n", 1)[0]
    rows = dict(re.findall(r"^\s+(SIG[A-Z0-9]+)\s+(\S.*)$", sig, re.M))
    assert set(rows) == {"SIGHUP", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGQUIT"}, rows
    assert rows["SIGHUP"].startswith("Reload")
    assert rows["SIGUSR1"].startswith("Reopen")
    assert rows["SIGUSR2"].startswith("Upgrade")
    assert rows["SIGTERM"].startswith("Graceful")
    assert rows["SIGQUIT"].startswith("As SIGTERM")
    ex = text.split("\nEXIT STATUS\n", 1)[1].split("\nEXAMPLES\n", 1)[0]
    assert re.findall(r"^\s+([0-9]+)\s", ex, re.M) == ["0", "1", "2"], ex
    for f in ("/usr/sbin/sluice", "/etc/sluice/sluice.yaml", "/var/lib/sluice", "/etc/default/sluice"):
        assert f in text, f


def test_man_page_exit_codes_are_the_binarys(sluice_bin, tmp_path):
    # 2: bad command line; 1: invalid conf; 0: -V
    assert subprocess.run([sluice_bin, "--no-such-flag"], capture_output=True).returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: 3\n")
    assert subprocess.run([sluice_bin, "-t", "-c", str(bad)], capture_output=True).returncode == 1
    assert subprocess.run([sluice_bin, "-V"], capture_output=True).returncode == 0


def test_logrotate_moves_the_log_and_sends_usr1_to_main_only(tmp_path):
    exe = shutil.which("logrotate")
    if not exe:
        pytest.skip("logrotate not installed (Debian package logrotate)")
    logs = tmp_path / "log"
    logs.mkdir(mode=0o755)
    (logs / "access.log").write_text('{"status":200}\n')
    conf = tmp_path / "logrotate.conf"
    conf.write_text(LOGROTATE.read_text().replace("/var/log/sluice/", str(logs) + "/"))
    os.chmod(conf, 0o644)
    # a systemctl that records how it was called, first on PATH
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "systemctl").write_text('#!/bin/sh\necho "$@" >> %s\n' % calls)
    os.chmod(fake / "systemctl", 0o755)
    env = dict(os.environ, PATH="%s:%s" % (fake, os.environ.get("PATH", "/usr/bin:/bin")))
    p = subprocess.run(
        [exe, "-f", "-s", str(tmp_path / "state"), str(conf)], capture_output=True, timeout=30, env=env
    )
    assert p.returncode == 0, p.stderr.decode()
    assert not (logs / "access.log").exists()
    assert (logs / "access.log.1").read_text() == '{"status":200}\n'  # delaycompress
    assert calls.read_text().splitlines() == ["kill --kill-whom=main --signal=USR1 sluice.service"]
