"""
conftest.py — fixtures for the black-box tests of the real sluice binary.

    mock              a started mock upstream (tests/mock_upstream.py)
    mock_factory      make more: mock_factory(name="b", tls=(cert, key), demo=False)
    sluice            sluice running with base_conf() against `mock`
    sluice_factory    sluice_factory(overrides={...}, conf=None, upstream=mock,
                      env=None, start=True) -> helpers.Sluice
    sluice_bin        the binary ($SLUICE_BIN, default build/sluice)
    tls_files         a test CA, server certs (session scoped, openssl CLI)
    redis_server      a private redis-server (own port, own dir)
    node / promtool   the tool's path, or a skip naming what is missing

Teardown fails the test when sluice crashed, exited with an unexpected code,
did not stop within shutdown_timeout after SIGTERM, or printed a sanitizer
report; and when a mock received a request it could not parse (sluice sent
broken HTTP) unless the test set mock.allow_protocol_errors.

Every test runs under an alarm (90 s, or @pytest.mark.timeout(S)) so that a
hang fails that test instead of the whole run.
"""

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402

DEFAULT_TEST_TIMEOUT = 90


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): per-test alarm (default 90 s)")


class TestTimeout(Exception):
    pass


@pytest.fixture(autouse=True)
def _alarm(request):
    m = request.node.get_closest_marker("timeout")
    secs = int(helpers.bound(m.args[0] if m else DEFAULT_TEST_TIMEOUT))

    def on_alarm(_sig, _frame):
        raise TestTimeout("test exceeded %d s" % secs)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(secs)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def sluice_bin():
    b = os.environ.get("SLUICE_BIN") or str(helpers.ROOT / "build" / "sluice")
    if not (os.path.isfile(b) and os.access(b, os.X_OK)):
        pytest.fail("sluice binary %s not found: build it (make) or set SLUICE_BIN" % b)
    return b


@pytest.fixture
def mock_factory(tmp_path):
    made = []

    def make(name=None, **kw):
        name = name or ("mock" if not made else "mock%d" % (len(made) + 1))
        m = helpers.Mock(tmp_path / "logs", name=name, **kw)
        made.append(m)
        return m

    yield make
    problems = []
    for m in made:
        try:
            if m.p.alive() and not m.allow_protocol_errors:
                errs = m.protocol_errors()
                if errs:
                    problems.append(
                        "mock %s could not parse what sluice sent: %s"
                        % (m.name, [e["error"] for e in errs])
                    )
        except Exception as e:  # a dead mock is reported below
            problems.append("mock %s control failed: %r" % (m.name, e))
        if not m.p.alive() and not m.expect_dead:
            problems.append("mock %s died (rc=%s):\n%s" % (m.name, m.p.proc.returncode, m.p.tail()))
        m.stop()
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def mock(mock_factory):
    return mock_factory()


@pytest.fixture
def sluice_factory(tmp_path, sluice_bin, mock_factory, request):
    made = []
    default_mock = []

    def make(overrides=None, conf=None, upstream=None, env=None, start=True, name=None):
        if conf is None:
            if upstream is None:
                if not default_mock:
                    default_mock.append(request.getfixturevalue("mock"))
                upstream = default_mock[0]
            url = upstream if isinstance(upstream, str) else upstream.url
            conf = helpers.base_conf(helpers.free_port(), helpers.free_port(), url)
        if overrides:
            conf = helpers.deep_merge(conf, overrides)
        name = name or ("sluice" if not made else "sluice%d" % (len(made) + 1))
        s = helpers.Sluice(sluice_bin, tmp_path / "logs", conf, env=env, name=name, start=False)
        made.append(s)
        if start:
            s.start()
        return s

    yield make
    problems = [p for p in (s.finish() for s in made) if p]
    if problems:
        pytest.fail("\n\n".join(problems))


@pytest.fixture
def sluice(sluice_factory, mock):
    return sluice_factory(upstream=mock)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl CLI not installed (Debian package openssl)")
    return helpers.make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def redis_server(tmp_path):
    if not shutil.which("redis-server"):
        pytest.skip("redis-server not installed (Debian package redis-server)")
    r = helpers.RedisServer(tmp_path / "redis")
    yield r
    r.stop()


@pytest.fixture(scope="session")
def promtool():
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return exe


@pytest.fixture(scope="session")
def node():
    exe = shutil.which("node")
    npm = shutil.which("npm")
    if not exe or not npm:
        pytest.skip("node/npm not installed (needed for the openai npm client tests)")
    return exe
