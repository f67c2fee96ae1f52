"""
test_ops_postinst.py — the package's postinst upgrades a running service in
place (SIGUSR2) and restarts it only when that did not take.

The real script runs with fakes for the commands it calls first on PATH
(systemctl, deb-systemd-invoke, and what its user/directory part calls), and
the "systemd is running" check pointed at a temporary directory. The old
main process is a real process, so the "no child left" test reads /proc.
"""

import os
import subprocess
import time

from helpers import ROOT, bound

POSTINST = ROOT / "debian" / "sluice.postinst"

FAKE_SYSTEMCTL = r"""#!/bin/sh
echo "systemctl $*" >>"$FAKE/log"
case "$*" in
"-q is-active sluice.service") [ -e "$FAKE/active" ]; exit $? ;;
"show -p MainPID --value sluice.service") cat "$FAKE/mainpid" ;;
"kill --kill-whom=main -s USR2 sluice.service")
    # "swap": the new process reports MAINPID= a moment later.
    if [ -e "$FAKE/swap" ]; then (sleep 0.3; echo 4242 >"$FAKE/mainpid") & fi ;;
esac
exit 0
"""


def fakes(tmp_path, *, active=True, swap=True):
    fake = tmp_path / "fake"
    bin_ = fake / "bin"
    bin_.mkdir(parents=True)
    (fake / "systemd").mkdir()
    scripts = {
        "systemctl": FAKE_SYSTEMCTL,
        "deb-systemd-invoke": '#!/bin/sh\necho "deb-systemd-invoke $*" >>"$FAKE/log"\n',
        # The user exists and the directories have overrides: nothing to do.
        "getent": "#!/bin/sh\nexit 0\n",
        "dpkg-statoverride": "#!/bin/sh\nexit 0\n",
        "adduser": '#!/bin/sh\necho "adduser $*" >>"$FAKE/log"\n',
    }
    for name, text in scripts.items():
        p = bin_ / name
        p.write_text(text)
        p.chmod(0o755)
    if active:
        (fake / "active").touch()
    if swap:
        (fake / "swap").touch()
    (fake / "log").write_text("")
    return fake


def run_postinst(fake, old_pid, *args):
    (fake / "mainpid").write_text("%d\n" % old_pid)
    (fake / "log").write_text("")
    env = dict(os.environ)
    env.update(FAKE=str(fake), PATH="%s:%s" % (fake / "bin", env["PATH"]),
               SLUICE_SYSTEMD_DIR=str(fake / "systemd"))
    t0 = time.monotonic()
    p = subprocess.run(["sh", str(POSTINST)] + list(args), env=env, capture_output=True,
                       timeout=90)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr.decode()
    return (fake / "log").read_text().splitlines(), p.stderr.decode(), took


def old_main():
    """A real process with no children: the old main process."""
    return subprocess.Popen(["sleep", "60"])


def test_upgrade_swaps_in_place_without_restart(tmp_path):
    fake = fakes(tmp_path)
    old = old_main()
    try:
        log, err, took = run_postinst(fake, old.pid, "configure", "0.9.0")
    finally:
        old.kill()
    assert "systemctl kill --kill-whom=main -s USR2 sluice.service" in log
    assert not any(l.startswith("deb-systemd-invoke restart") for l in log), log
    assert "restarting" not in err
    assert took < bound(5), took


def test_refused_upgrade_restarts(tmp_path):
    # USR2 sent, but no new process appears (refused): restart, soon.
    fake = fakes(tmp_path, swap=False)
    old = old_main()
    try:
        log, err, took = run_postinst(fake, old.pid, "configure", "0.9.0")
    finally:
        old.kill()
    assert "systemctl kill --kill-whom=main -s USR2 sluice.service" in log
    assert log[-1] == "deb-systemd-invoke restart sluice.service", log
    assert "did not take" in err
    assert took < bound(10), took


def test_waits_while_the_new_process_starts(tmp_path):
    # The old process has a child (the new binary starting): postinst waits
    # for MAINPID= rather than restarting after the first second.
    fake = fakes(tmp_path, swap=False)
    script = tmp_path / "old.sh"
    # The old "main process" has a child; MAINPID changes 2 s later.
    script.write_text("sleep 60 & wait\n")
    old = subprocess.Popen(["sh", str(script)])
    swapper = subprocess.Popen(["sh", "-c", "sleep 2; echo 5151 >%s" % (fake / "mainpid")])
    try:
        # run_postinst writes mainpid first; the swapper overwrites it later.
        log, err, took = run_postinst(fake, old.pid, "configure", "0.9.0")
    finally:
        swapper.wait()
        old.kill()
        subprocess.run(["pkill", "-P", str(old.pid)])
    assert not any(l.startswith("deb-systemd-invoke restart") for l in log), (log, err)
    assert 1.5 < took < bound(8), took


def test_fresh_install_and_inactive_unit_send_nothing(tmp_path):
    fake = fakes(tmp_path)
    old = old_main()
    try:
        log, _, _ = run_postinst(fake, old.pid, "configure")  # no old version
        assert not any("USR2" in l or "restart" in l for l in log), log
        (fake / "active").unlink()
        log, _, _ = run_postinst(fake, old.pid, "configure", "0.9.0")
        assert not any("USR2" in l or "restart" in l for l in log), log
    finally:
        old.kill()
