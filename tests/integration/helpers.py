"""
helpers.py — the tools sluice's black-box tests are built from: processes
(the mock upstream, the real sluice binary, redis-server) with their logs, a
strict raw-socket HTTP/1.1 client with an SSE reader that timestamps every
event, a YAML writer for confs, a Prometheus text parser, and test TLS
material made with the openssl CLI.

Stdlib only (Debian's /usr/bin/python3). Nothing here sleeps to synchronise:
waits poll a condition against a deadline (wait_until) or block on a socket
with a timeout.

Times are time.monotonic() seconds, the clock the mock's records use too.
"""

import http.client
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOCK_PY = ROOT / "tests" / "mock_upstream.py"
PYTHON = sys.executable or "/usr/bin/python3"

sys.path.insert(0, str(ROOT / "tests"))
import mock_upstream  # noqa: E402  (reply_text and friends, for expected values)

UPSTREAM_KEY_ENV = "SLUICE_TEST_UPSTREAM_KEY"
UPSTREAM_KEY = "sk-upstream-test-6f1c2a"
SANITIZER_PATTERNS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "AddressSanitizer:DEADLYSIGNAL",
    "runtime error:",
    "WARNING: ThreadSanitizer",
)


def _time_scale():
    v = os.environ.get("SLUICE_TIME_SCALE")
    if v:
        return float(v)
    b = os.environ.get("SLUICE_BUILD", "") + os.environ.get("SLUICE_BIN", "")
    return 3.0 if "san" in b else 1.0


# Upper time bounds are multiplied by this (sanitizer builds are slower).
TIME_SCALE = _time_scale()


def bound(seconds):
    """An upper time bound, stretched for slow builds."""
    return seconds * TIME_SCALE


# ---- small utilities ------------------------------------------------------------


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out = set()
_port_rng = random.Random(os.getpid())
# Ports the fetch standard refuses to connect to ("bad port" from Node's
# fetch, seen once in CI): of its list only 10080 is in the range used here.
_FETCH_BAD_PORTS = {10080}


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a
    server started next. Taken below the kernel's ephemeral range: a port
    the kernel picked (bind to 0) could go to one of the many outgoing
    connections before the server binds it ("Address already in use", seen
    once in a full run); below the range only listeners compete. Not handed
    out twice in a session."""
    lo = 10000
    if _EPHEMERAL_LOW - lo > 1000:
        for _ in range(500):
            port = _port_rng.randrange(lo, _EPHEMERAL_LOW)
            if port in _handed_out or port in _FETCH_BAD_PORTS:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accept_each(ls, handle):
    """Serves listening socket `ls` from a daemon thread: each accepted
    connection goes to handle(conn) in a daemon thread of its own, until
    `ls` is closed."""

    def loop():
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def _recv_loop(s, done, timeout):
    """Reads socket s until done(bytes so far) is true (checked before the
    first read too), the peer closes or resets, or `timeout` seconds pass:
    (bytes, how), how one of "done", "timeout", "closed", "reset"."""
    got = b""
    deadline = time.monotonic() + timeout
    while not done(got):
        left = deadline - time.monotonic()
        if left <= 0:
            return got, "timeout"
        s.settimeout(left)
        try:
            b = s.recv(65536)
        except (socket.timeout, TimeoutError):
            return got, "timeout"
        except ConnectionResetError:
            return got, "reset"
        except ssl.SSLError:
            return got, "closed"
        if not b:
            return got, "closed"
        got += b
    return got, "done"


def recv_until(s, done, timeout):
    """Bytes read from socket s until done(bytes so far) is true, the peer
    closes, or `timeout` seconds pass."""
    return _recv_loop(s, done, timeout)[0]


def wait_until(pred, timeout=5.0, interval=0.02, what="condition"):
    """Polls pred() until it returns a truthy value (returned) or the
    deadline passes (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # a probe that fails is "not yet"
            last_exc = e
        if time.monotonic() >= deadline:
            msg = "timed out after %.1fs waiting for %s" % (timeout, what)
            if last_exc is not None:
                msg += " (last error: %r)" % (last_exc,)
            raise AssertionError(msg)
        time.sleep(interval)


def deep_merge(base, over):
    """base with over merged in: dicts merge recursively, a None value in
    `over` deletes the key, anything else (lists too) replaces."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


_PLAIN_RE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _yaml_scalar(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    if _PLAIN_RE.match(s) and s.lower() not in _YAML_WORDS and not s.endswith(":"):
        return s
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def to_yaml(obj, indent=0):
    """Block-style YAML for dicts, lists and scalars (what sluice confs use).
    Strings are plain where that is unambiguous, double-quoted otherwise."""
    pad = " " * indent
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = _yaml_scalar(k)
            if isinstance(v, dict) and v:
                out.append("%s%s:\n%s" % (pad, key, to_yaml(v, indent + 2)))
            elif isinstance(v, list) and v:
                out.append("%s%s:\n%s" % (pad, key, to_yaml(v, indent + 2)))
            elif isinstance(v, dict):
                out.append("%s%s: {}\n" % (pad, key))
            elif isinstance(v, list):
                out.append("%s%s: []\n" % (pad, key))
            else:
                out.append("%s%s: %s\n" % (pad, key, _yaml_scalar(v)))
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)) and item:
                inner = to_yaml(item, indent + 2)
                out.append("%s- %s" % (pad, inner[indent + 2 :]))
            elif isinstance(item, dict):
                out.append("%s- {}\n" % pad)
            elif isinstance(item, list):
                out.append("%s- []\n" % pad)
            else:
                out.append("%s- %s\n" % (pad, _yaml_scalar(item)))
    else:
        out.append("%s%s\n" % (pad, _yaml_scalar(obj)))
    return "".join(out)


# ---- processes -----------------------------------------------------------------


def _keep_old_logs(*paths):
    """A process started again under the same name (a restart, a kill -9
    drill) gets fresh log files; the previous run's are renamed NAME.1,
    NAME.2, ... so that a failure's evidence from before the restart is
    still there to read."""
    for p in paths:
        if not p.exists():
            continue
        n = 1
        while p.with_name("%s.%d" % (p.name, n)).exists():
            n += 1
        p.rename(p.with_name("%s.%d" % (p.name, n)))


class Proc:
    """A child process whose stdout and stderr go to files in `logdir`
    (those of an earlier process of the same name kept as NAME.1, ...)."""

    def __init__(self, name, argv, logdir, env=None, stdout_pipe=False):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.out_path = self.logdir / (name + ".stdout")
        self.err_path = self.logdir / (name + ".stderr")
        _keep_old_logs(self.out_path, self.err_path)
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else self._out,
            stderr=self._err,
            env=env,
            start_new_session=True,  # a ^C to pytest is not a signal to it
        )
        self.pid = self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit code, or None if still running after `timeout`."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=5)

    def stdout_text(self):
        return self.out_path.read_text("utf-8", "replace")

    def stderr_text(self):
        return self.err_path.read_text("utf-8", "replace")

    def close_logs(self):
        for f in (self._out, self._err):
            try:
                f.close()
            except OSError:
                pass

    def tail(self, n=40):
        lines = self.stderr_text().splitlines()[-n:]
        return "\n".join("    " + ln for ln in lines)


class Mock:
    """The scripted mock upstream (tests/mock_upstream.py) in its own process.
    Control calls go over a fresh connection each (they are hidden from the
    mock's connection list)."""

    def __init__(self, logdir, name="mock", tls=None, demo=False, models=None, port=0, base_path=None):
        argv = [PYTHON, MOCK_PY, "--host", "127.0.0.1", "--port", port, "--name", name]
        if base_path:
            argv += ["--base-path", base_path]
        if tls:
            argv += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        if demo:
            argv.append("--demo")
        if models:
            argv += ["--models", ",".join(models)]
        self.name = name
        self.tls = bool(tls)
        self.allow_protocol_errors = False
        self.expect_dead = False  # teardown: a mock the test stopped is fine
        self.p = Proc("mock-" + name, argv, logdir, stdout_pipe=True)
        line = self._read_line(bound(10))
        info = json.loads(line)
        self.port = info["listening"]
        self.host = "127.0.0.1"

    def _read_line(self, timeout):
        fd = self.p.proc.stdout
        deadline = time.monotonic() + timeout
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.p.alive():
                raise AssertionError(
                    "mock %s did not start (rc=%s):\n%s" % (self.name, self.p.proc.poll(), self.p.tail())
                )
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd.fileno(), 4096)
                if not chunk:
                    continue
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)

    def _call(self, method, path, obj=None):
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # test-side control channel only
            c = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            body = None if obj is None else json.dumps(obj)
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            c.request(method, path, body=body, headers=hdrs)
            r = c.getresponse()
            data = r.read()
            if r.status != 200:
                raise AssertionError("mock control %s %s: %d %r" % (method, path, r.status, data))
            return json.loads(data)
        finally:
            c.close()

    # -- control --

    def script(self, *behaviours, default=None, append=False):
        body = {"script": list(behaviours), "append": append}
        if default is not None:
            body["default"] = default
        return self._call("POST", "/_mock/script", body)

    def set_default(self, behaviour):
        return self._call("POST", "/_mock/default", behaviour)

    def release(self, n=1, request=None):
        body = {"n": n}
        if request is not None:
            body["request"] = request
        return self._call("POST", "/_mock/release", body)["released"]

    def reset(self):
        self._call("POST", "/_mock/reset", {})

    def drop(self):
        return self._call("POST", "/_mock/drop", {})["dropped"]

    def requests(self, path=None):
        """Model requests (protocol errors included, with outcome
        'protocol_error'), oldest first."""
        reqs = self._call("GET", "/_mock/requests")
        if path is not None:
            reqs = [r for r in reqs if r["path"] == path]
        return reqs

    def connections(self, all=False):
        return self._call("GET", "/_mock/connections" + ("?all=1" if all else ""))

    def bytes_received(self):
        """Bytes received on non-control connections (what sluice sent)."""
        return sum(c["bytes_in"] for c in self.connections())

    def wait_requests(self, n, timeout=5.0, path=None):
        return wait_until(
            lambda: (lambda r: r if len(r) >= n else None)(self.requests(path)),
            timeout,
            what="%d request(s) at mock %s" % (n, self.name),
        )

    def wait_request_state(self, rid, pred, timeout=5.0, what=None):
        def probe():
            for r in self.requests():
                if r["id"] == rid and pred(r):
                    return r
            return None

        return wait_until(probe, timeout, what=what or "request %d state" % rid)

    def protocol_errors(self):
        return [r for r in self.requests() if r["outcome"] == "protocol_error"]

    def stop(self):
        self.p.signal(signal.SIGTERM)
        if self.p.wait(5) is None:
            self.p.kill()
        self.p.close_logs()


def header_values(headers, name):
    """All values of a header in a [[name, value], ...] list, any case."""
    n = name.lower()
    return [v for k, v in headers if k.lower() == n]


class Sluice:
    """The real sluice binary with a conf written from a dict."""

    def __init__(self, bin_path, workdir, conf, env=None, name="sluice", start=True):
        self.bin = str(bin_path)
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.conf_path = self.dir / (name + ".yaml")
        self.conf = conf
        self.write_conf(conf)
        self.env = dict(os.environ)
        self.env.setdefault(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
        self.env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:halt_on_error=1")
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        if env:
            for k, v in env.items():
                if v is None:
                    self.env.pop(k, None)
                else:
                    self.env[k] = v
        # What teardown expects: None = "still running; SIGTERM it and expect
        # exit 0"; an int = the exit code the test already expected.
        self.expected_rc = 0
        self.p = None
        if start:
            self.start()

    # -- addresses from the conf --

    @staticmethod
    def _hostport(addr):
        host, _, port = addr.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def host(self):
        return self._hostport(self.conf["listen"][0]["address"])[0]

    @property
    def port(self):
        return self._hostport(self.conf["listen"][0]["address"])[1]

    @property
    def admin_port(self):
        return self._hostport(self.conf["admin"]["address"])[1]

    def listener(self, i):
        return self._hostport(self.conf["listen"][i]["address"])

    # -- life --

    def write_conf(self, conf):
        self.conf = conf
        tmp = self.conf_path.with_suffix(".tmp")
        tmp.write_text(to_yaml(conf))
        os.replace(tmp, self.conf_path)  # a reload never reads half a file

    def write_conf_text(self, text):
        tmp = self.conf_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.conf_path)

    def start(self, wait=True):
        self.p = Proc(self.name, [self.bin, "-c", self.conf_path], self.dir, env=self.env)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=None):
        timeout = timeout or bound(10)

        def ready():
            if not self.p.alive():
                raise _Exited()
            try:
                r = request("127.0.0.1", self.admin_port, "GET", "/healthz", timeout=1)
                return r.status == 200
            except OSError:
                return False

        try:
            wait_until(ready, timeout, interval=0.02, what="sluice /healthz on the admin listener")
        except _Exited:
            raise AssertionError(
                "sluice exited with %s before it was ready; conf:\n%s\nstderr:\n%s"
                % (self.p.proc.returncode, to_yaml(self.conf), self.p.tail())
            ) from None
        except AssertionError as e:
            raise AssertionError("%s\nstderr:\n%s" % (e, self.p.tail())) from None

    def reload(self, conf=None):
        """Writes `conf` (if given) and sends SIGHUP. Returns at once: the
        caller polls for the effect it expects."""
        if conf is not None:
            self.write_conf(conf)
        self.p.signal(signal.SIGHUP)

    def term(self):
        self.p.signal(signal.SIGTERM)

    def wait_exit(self, timeout):
        return self.p.wait(timeout)

    def alive(self):
        return self.p is not None and self.p.alive()

    def stdout_text(self):
        return self.p.stdout_text()

    def stderr_text(self):
        return self.p.stderr_text()

    def access_log(self):
        """The JSON objects printed one per line on stdout (the access log)."""
        out = []
        for ln in self.stdout_text().splitlines():
            ln = ln.strip()
            if ln.startswith("{"):
                try:
                    out.append(json.loads(ln))
                except ValueError:
                    pass
        return out

    def sanitizer_report(self):
        text = self.stderr_text() + self.stdout_text()
        for pat in SANITIZER_PATTERNS:
            i = text.find(pat)
            if i >= 0:
                return text[max(0, i - 200) : i + 3000]
        return None

    def finish(self):
        """Teardown: stop it if it runs, then complain (returned as a string)
        about a crash, an unexpected exit code or a sanitizer report."""
        problems = []
        if self.p is None:
            return None
        if self.p.alive():
            self.term()
            limit = bound(_duration_s(self.conf.get("shutdown_timeout", "30s")) + 5)
            rc = self.p.wait(limit)
            if rc is None:
                problems.append("did not exit within %.0fs of SIGTERM" % limit)
                self.p.kill()
                rc = self.p.proc.returncode
            elif rc != 0:
                problems.append("exit code %s after SIGTERM (want 0)" % rc)
        else:
            rc = self.p.proc.returncode
            if self.expected_rc is not None and rc != self.expected_rc:
                problems.append("exited with %s (expected %s)" % (rc, self.expected_rc))
        if rc is not None and rc < 0 and -rc != signal.SIGTERM:
            problems.append("killed by signal %d" % -rc)
        rep = self.sanitizer_report()
        if rep:
            problems.append("sanitizer report:\n" + rep)
        self.p.close_logs()
        if problems:
            return "sluice %s: %s\nstderr tail:\n%s" % (self.name, "; ".join(problems), self.p.tail())
        return None

    # -- requests --

    def client(self, timeout=10, tls=None, server_hostname=None, listener=0, rcvbuf=None):
        host, port = self.listener(listener)
        return HTTPClient(host, port, timeout=timeout, tls=tls, server_hostname=server_hostname, rcvbuf=rcvbuf)

    def request(self, method, path, body=None, headers=None, timeout=10, **kw):
        return request(self.host, self.port, method, path, body, headers, timeout=timeout, **kw)

    def chat(self, prompt="hello", model="chat-model", stream=False, headers=None, **extra):
        return self.request(
            "POST", "/v1/chat/completions", chat_body(prompt, model, stream, **extra), headers
        )

    def admin(self, method, path, timeout=10):
        return request("127.0.0.1", self.admin_port, method, path, timeout=timeout)

    def metrics_text(self):
        r = self.admin("GET", "/metrics")
        assert r.status == 200, "GET /metrics: %d %r" % (r.status, r.body[:200])
        return r.body.decode()

    def metrics(self):
        return parse_prometheus(self.metrics_text())


class _Exited(Exception):
    pass


def _duration_s(v):
    if isinstance(v, (int, float)):
        return v / 1000.0
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", str(v))
    if not m:
        return 30
    n, unit = int(m.group(1)), m.group(2) or "ms"
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def base_conf(port, admin_port, upstream_url, **over):
    """A minimal working conf: one listener, the admin listener, one upstream
    `main` at upstream_url with the test API key, models chat-model (alias of
    Qwen2.5-7B-Instruct), plain-model (no alias), embed-model."""
    conf = {
        "listen": [{"address": "127.0.0.1:%d" % port}],
        "admin": {"address": "127.0.0.1:%d" % admin_port},
        "workers": 2,
        "shutdown_timeout": "5s",
        "upstreams": {
            "main": {
                "servers": [{"url": upstream_url, "weight": 1}],
                "api_key_env": UPSTREAM_KEY_ENV,
                "timeouts": {"connect": "2s", "first_byte": "10s", "total": "60s"},
            }
        },
        "models": {
            "chat-model": {"upstream": "main", "name": "Qwen2.5-7B-Instruct"},
            "plain-model": {"upstream": "main"},
            "embed-model": {"upstream": "main", "name": "mock-embed"},
        },
        "log": {"access": "stdout", "level": "info"},
        # The core tests watch the proxy's own answers to upstream failures;
        # the fallback chain (retry, local, template) has its own tests.
        "fallback": {"retry": {"attempts": 0}, "template": {"enabled": False}},
    }
    return deep_merge(conf, over)


class RedisServer:
    """A private redis-server: own port, own dir, no persistence unless a test
    turns it on. Its files (an AOF a test enables) go to a fresh directory in
    /dev/shm when the machine has one: an fsync on a shared disk can block
    Redis's only thread for seconds (a loaded run saw no write executed for
    8.6 s), and no test here needs its data to reach a disk, since none kills
    Redis to read it back. The directory goes with stop()."""

    def __init__(self, workdir):
        exe = shutil.which("redis-server")
        if not exe:
            raise FileNotFoundError("redis-server")
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.data = tempfile.mkdtemp(prefix="sluice-redis-", dir=shm) if shm else None
        self.port = free_port()
        self.p = Proc(
            "redis",
            [exe, "--port", self.port, "--bind", "127.0.0.1", "--dir", self.data or self.dir,
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes"],
            self.dir,
        )
        try:
            wait_until(lambda: self._ping(), bound(10), what="redis-server PING")
        except BaseException:
            self.stop()
            raise

    def _ping(self):
        if not self.p.alive():
            raise AssertionError("redis-server exited:\n" + self.p.stdout_text()[-2000:])
        try:
            return self.cmd("PING") == "PONG"
        except OSError:
            return False

    def cmd(self, *args):
        """One command over a fresh connection; returns the decoded reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(resp_encode(args))
            f = s.makefile("rb")
            return resp_decode(f)

    def stop(self):
        self.p.signal(signal.SIGTERM)
        if self.p.wait(5) is None:
            self.p.kill()
        self.p.close_logs()
        if self.data:
            shutil.rmtree(self.data, ignore_errors=True)


def resp_encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def resp_decode(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise OSError("redis: connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2].decode("utf-8", "replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [resp_decode(f) for _ in range(n)]
    raise OSError("redis: bad reply %r" % line)


# ---- HTTP/1.1 client ----------------------------------------------------------


class ProtocolError(AssertionError):
    """sluice sent something that is not valid HTTP/1.1 or SSE framing."""


def chat_body(prompt="hello", model="chat-model", stream=False, **extra):
    b = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


class Response:
    def __init__(self, status, reason, version, headers, body=b""):
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers  # [(name, value), ...] as received
        self.body = body
        self.chunked = False
        self.closed = False  # the server closed the connection after it

    def header(self, name):
        v = header_values(self.headers, name)
        return v[0] if v else None

    def header_all(self, name):
        return header_values(self.headers, name)

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise AssertionError("body is not JSON: %r" % self.body[:300]) from None

    def __repr__(self):
        return "<Response %d %r>" % (self.status, self.body[:200])


class Event:
    """One SSE event as the client received it. `t` is when its last byte
    (the blank line) arrived."""

    def __init__(self, t, raw, data, comments, event, eid):
        self.t = t
        self.raw = raw
        self.data = data  # joined data lines, or None when there were none
        self.comments = comments  # ": ..." lines, without the colon
        self.event = event
        self.id = eid

    @property
    def is_done(self):
        return self.data == "[DONE]"

    @property
    def is_comment(self):
        return self.data is None and self.event is None

    def json(self):
        try:
            return json.loads(self.data)
        except (TypeError, ValueError):
            raise AssertionError("event data is not JSON: %r" % (self.data,)) from None

    def __repr__(self):
        return "<Event t=%.3f %r>" % (self.t, self.raw[:120])


class SSEParser:
    """Incremental WHATWG event-stream parser: fed bytes, returns the events
    completed by them (comment-only blocks too, as events with data None)."""

    def __init__(self):
        self.buf = b""
        self.lines = []

    def feed(self, data, t=None):
        t = time.monotonic() if t is None else t
        self.buf += data
        events = []
        while True:
            m = re.search(rb"\r\n|\r|\n", self.buf)
            if not m:
                break
            # A lone CR at the very end may be the first half of CRLF.
            if m.group() == b"\r" and m.end() == len(self.buf):
                break
            line = self.buf[: m.start()]
            self.buf = self.buf[m.end() :]
            if line == b"":
                if self.lines:
                    events.append(self._event(t))
                continue
            self.lines.append(line)
        return events

    def _event(self, t):
        raw = b"\n".join(self.lines).decode("utf-8", "replace")
        data, comments, event, eid = [], [], None, None
        for ln in self.lines:
            s = ln.decode("utf-8", "replace")
            if s.startswith(":"):
                comments.append(s[1:].lstrip(" "))
                continue
            field, _, value = s.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id":
                eid = value
        self.lines = []
        return Event(t, raw, "\n".join(data) if data else None, comments, event, eid)


class ChunkedDecoder:
    """Strict incremental decoder of a chunked body."""

    def __init__(self):
        self.buf = b""
        self.left = None  # bytes left in the current chunk, None = want a size line
        self.done = False
        self.trailers = False

    def feed(self, data):
        self.buf += data
        out = []
        while not self.done:
            if self.left is None:
                i = self.buf.find(b"\r\n")
                if i < 0:
                    if len(self.buf) > 1024:
                        raise ProtocolError("chunk size line too long")
                    break
                line = self.buf[:i]
                self.buf = self.buf[i + 2 :]
                size = line.split(b";", 1)[0]
                if not re.fullmatch(rb"[0-9a-fA-F]+", size):
                    raise ProtocolError("bad chunk size line %r" % line)
                n = int(size, 16)
                if n == 0:
                    self.trailers = True
                    self.left = -1
                else:
                    self.left = n
            elif self.left == -1:  # trailers, then the final CRLF
                i = self.buf.find(b"\r\n")
                if i < 0:
                    break
                line = self.buf[:i]
                self.buf = self.buf[i + 2 :]
                if line == b"":
                    self.done = True
            elif self.left > 0:
                take = self.buf[: self.left]
                out.append(take)
                self.left -= len(take)
                self.buf = self.buf[len(take) :]
                if self.left > 0:
                    break
            else:  # chunk data done: CRLF
                if len(self.buf) < 2:
                    break
                if self.buf[:2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF: %r" % self.buf[:20])
                self.buf = self.buf[2:]
                self.left = None
        return b"".join(out)


class HTTPClient:
    """One client connection with exact control of the bytes: send raw bytes
    or a request, read a response strictly (Content-Length, chunked or
    close-delimited), or read a streamed body as timestamped SSE events."""

    def __init__(self, host, port, timeout=10, tls=None, server_hostname=None, rcvbuf=None):
        self.host, self.port, self.timeout = host, port, timeout
        if rcvbuf:  # a small receive window: set before connect to stick
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            raw.settimeout(timeout)
            raw.connect((host, port))
        else:
            raw = socket.create_connection((host, port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            raw = tls.wrap_socket(raw, server_hostname=server_hostname or host)
        self.sock = raw
        self.buf = b""
        self.eof = False
        self.reset = False
        self.t_eof = None

    # -- low level --

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, timeout=None):
        """Reads more; False at EOF. socket.timeout if nothing in time."""
        if self.eof:
            return False
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
            self.reset = True
        except ssl.SSLError as e:
            if "timed out" in str(e):
                raise socket.timeout(str(e)) from None
            data = b""
        if not data:
            self.eof = True
            self.t_eof = time.monotonic()
            return False
        self.buf += data
        return True

    def _line(self):
        while b"\r\n" not in self.buf:
            if len(self.buf) > 65536:
                raise ProtocolError("response head line too long")
            if not self._fill():
                raise ProtocolError("connection closed in response head: %r" % self.buf[:200])
        i = self.buf.index(b"\r\n")
        line, self.buf = self.buf[:i], self.buf[i + 2 :]
        if b"\n" in line or b"\r" in line:
            raise ProtocolError("bare CR/LF in response head: %r" % line)
        return line

    def wait_closed(self, timeout):
        """True when the server closes within `timeout` (bytes that arrive
        meanwhile are kept in self.buf); False if it is still open."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self._fill(timeout=left)
            except (socket.timeout, TimeoutError):
                return False
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self):
        """Close with a RST (SO_LINGER 0): a client that vanishes."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        except OSError:
            pass
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    # -- requests --

    def send_request(self, method, path, body=None, headers=None, host=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        hdrs = [("Host", host or "%s:%d" % (self.host, self.port))]
        names = set()
        for k, v in (headers.items() if isinstance(headers, dict) else (headers or [])):
            hdrs.append((k, v))
            names.add(k.lower())
        if body is not None and "content-length" not in names and "transfer-encoding" not in names:
            if "content-type" not in names:
                hdrs.append(("Content-Type", "application/json"))
            hdrs.append(("Content-Length", str(len(body))))
        head = "%s %s HTTP/1.1\r\n" % (method, path)
        head += "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
        self.send(head.encode("latin-1") + (body or b""))

    def read_head(self, head_request=False):
        """Reads a status line and headers (100 Continue skipped)."""
        while True:
            line = self._line()
            m = re.fullmatch(rb"HTTP/(\d)\.(\d) (\d{3}) ?(.*)", line)
            if not m:
                raise ProtocolError("bad status line %r" % line)
            status = int(m.group(3))
            headers = []
            while True:
                h = self._line()
                if h == b"":
                    break
                if h[:1] in (b" ", b"\t"):
                    raise ProtocolError("obs-fold in response: %r" % h)
                name, sep, value = h.partition(b":")
                if not sep or not re.fullmatch(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
                    raise ProtocolError("bad response header line %r" % h)
                headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
            if status == 100:
                continue
            r = Response(status, m.group(4).decode("latin-1"), "%s.%s" % (m.group(1).decode(), m.group(2).decode()), headers)
            te = r.header_all("Transfer-Encoding")
            cl = r.header_all("Content-Length")
            if te and cl:
                raise ProtocolError("response has Content-Length and Transfer-Encoding")
            if len(cl) > 1:
                raise ProtocolError("response has several Content-Length")
            if te:
                if [x.strip().lower() for x in ",".join(te).split(",")] != ["chunked"]:
                    raise ProtocolError("response Transfer-Encoding %r" % te)
                r.chunked = True
            r._head_request = head_request
            return r

    def iter_body(self, r):
        """Yields body pieces as they arrive (de-chunked); sets r.closed and,
        for chunked bodies, r.complete (False when the connection ended
        before the terminating chunk)."""
        r.complete = False
        if r._head_request or r.status in (204, 304) or 100 <= r.status < 200:
            r.complete = True
            return
        if r.chunked:
            dec = ChunkedDecoder()
            if self.buf:
                data, self.buf = self.buf, b""
                piece = dec.feed(data)
                if piece:
                    yield piece
            while not dec.done:
                if not self._fill():
                    r.closed = True
                    return
                data, self.buf = self.buf, b""
                piece = dec.feed(data)
                if piece:
                    yield piece
            self.buf = dec.buf  # pipelined bytes after the body
            r.complete = True
            return
        cl = r.header("Content-Length")
        if cl is not None:
            if not re.fullmatch(r"\d+", cl):
                raise ProtocolError("bad Content-Length %r" % cl)
            left = int(cl)
            while left > 0:
                if not self.buf and not self._fill():
                    r.closed = True
                    raise ProtocolError("connection closed %d bytes before the end of the body" % left)
                take, self.buf = self.buf[:left], self.buf[left:]
                left -= len(take)
                yield take
            r.complete = True
            return
        # close-delimited
        while True:
            if self.buf:
                data, self.buf = self.buf, b""
                yield data
            if not self._fill():
                r.closed = True
                r.complete = True
                return

    def read_response(self, head_request=False):
        r = self.read_head(head_request)
        r.body = b"".join(self.iter_body(r))
        conn = ",".join(r.header_all("Connection")).lower()
        if "close" in conn and not r.closed:
            r.closed = self.wait_closed(bound(2))
        return r

    def request(self, method, path, body=None, headers=None, host=None):
        self.send_request(method, path, body, headers, host)
        return self.read_response(head_request=(method == "HEAD"))

    def events(self, r):
        """Yields the SSE events of streamed response r, each stamped with
        its arrival time. Ends at the terminating chunk (r.complete) or when
        the connection closes (r.complete False)."""
        p = SSEParser()
        for piece in self.iter_body(r):
            for ev in p.feed(piece, time.monotonic()):
                yield ev
        r.leftover = p.buf + b"".join(p.lines)

    def stream(self, method, path, body=None, headers=None):
        """Sends a request and returns (response head, event iterator)."""
        self.send_request(method, path, body, headers)
        r = self.read_head()
        return r, self.events(r)


def request(host, port, method, path, body=None, headers=None, timeout=10, tls=None, server_hostname=None):
    """One request on a fresh connection, which is then closed."""
    with HTTPClient(host, port, timeout=timeout, tls=tls, server_hostname=server_hostname) as c:
        return c.request(method, path, body, headers)


class RawResult:
    def __init__(self, data, closed, t_sent, t_closed, reset):
        self.data = data
        self.closed = closed
        self.t_sent = t_sent
        self.t_closed = t_closed
        self.reset = reset

    def response(self):
        """The first response in the received bytes."""
        return parse_response_bytes(self.data)

    def __repr__(self):
        return "<RawResult closed=%s %r>" % (self.closed, self.data[:300])


def raw_exchange(host, port, data, timeout=5.0, tls=None, server_hostname=None, pieces=None):
    """Sends exact bytes (or `pieces`, a list of (bytes, pause_s)), then
    reads until the server closes or `timeout` passes. A reset or a refused
    write counts as closed; what arrived before is kept."""
    s = socket.create_connection((host, port), timeout=timeout)
    if tls is not None:
        s = tls.wrap_socket(s, server_hostname=server_hostname or host)
    got, closed, reset = b"", False, False
    t_sent = None
    try:
        try:
            if pieces is None:
                s.sendall(data)
            else:
                for chunk, pause in pieces:
                    s.sendall(chunk)
                    if pause:
                        # pacing bytes on purpose (a slow client), not syncing
                        r, _, _ = select.select([s], [], [], pause)
                        if r:
                            break
        except (BrokenPipeError, ConnectionResetError):
            pass
        t_sent = time.monotonic()
        got, how = _recv_loop(s, lambda _: False, timeout)
        closed, reset = how in ("closed", "reset"), how == "reset"
    finally:
        s.close()
    return RawResult(got, closed, t_sent, time.monotonic() if closed else None, reset)


def parse_response_bytes(data):
    """The first HTTP response in `data` (strictly parsed)."""

    class _Fake(HTTPClient):
        def __init__(self, buf):
            self.buf, self.eof, self.reset, self.timeout = buf, False, False, 0
            self.t_eof = None

        def _fill(self, timeout=None):
            self.eof = True
            return False

    c = _Fake(data)
    r = c.read_head()
    r.body = b"".join(c.iter_body(r))
    r.rest = c.buf
    return r


def assert_error(r, status, code, etype=None):
    """r is an OpenAI-style JSON error with this status and code."""
    assert r.status == status, "want %d %s, got %d: %r" % (status, code, r.status, r.body[:300])
    ct = (r.header("Content-Type") or "").lower()
    assert ct.startswith("application/json"), "error Content-Type %r" % ct
    body = r.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    e = body["error"]
    assert isinstance(e.get("message"), str) and e["message"], e
    assert e.get("code") == code, "error code %r, want %r (%r)" % (e.get("code"), code, e)
    if etype is None:
        etype = "server_error" if status >= 500 else "invalid_request_error"
    assert e.get("type") == etype, "error type %r, want %r" % (e.get("type"), etype)
    return e


def connect_refused(host, port, timeout=1.0):
    """True when a TCP connect is refused (nothing listens)."""
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    s.close()
    return False


# ---- Prometheus text ------------------------------------------------------------

_SAMPLE_RE = re.compile(
    r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$"
)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


class Samples(list):
    """A parsed exposition: a list of (name, labels dict, value)."""

    def find(self, name, **labels):
        return [(n, l, v) for n, l, v in self if n == name and all(l.get(k) == w for k, w in labels.items())]

    def value(self, name, default=0.0, **labels):
        """The sum of the samples of `name` whose labels include `labels`."""
        m = self.find(name, **labels)
        return sum(v for _, _, v in m) if m else default

    def where(self, name, pred):
        return [(n, l, v) for n, l, v in self if n == name and pred(l)]

    def names(self):
        return {n for n, _, _ in self}


def parse_prometheus(text):
    out = Samples()
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        m = _SAMPLE_RE.match(ln)
        if not m:
            raise AssertionError("bad metrics line %r" % ln)
        labels = {}
        if m.group(3):
            pos, s = 0, m.group(3)
            while pos < len(s):
                lm = _LABEL_RE.match(s, pos)
                if not lm:
                    raise AssertionError("bad labels in %r" % ln)
                labels[lm.group(1)] = (
                    lm.group(2).replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
                )
                pos = lm.end()
        v = m.group(4)
        value = float("inf") if v == "+Inf" else float("-inf") if v == "-Inf" else float(v)
        out.append((m.group(1), labels, value))
    return out


def route_is(label_value, route):
    """Route labels may be the path or a name: '/v1/chat/completions' and
    'chat_completions' both match route 'chat/completions'."""
    norm = lambda s: re.sub(r"[^a-z0-9]", "", s.lower())  # noqa: E731
    return norm(label_value or "").endswith(norm(route))


def promtool_check(text):
    """(ok, output) of `promtool check metrics` on the exposition text."""
    exe = shutil.which("promtool")
    p = subprocess.run([exe, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    return p.returncode == 0, (p.stdout + p.stderr).decode("utf-8", "replace")


# ---- TLS material ----------------------------------------------------------------


class TLSFiles:
    pass


def _openssl(*args, cwd=None):
    p = subprocess.run(["openssl"] + [str(a) for a in args], cwd=cwd, capture_output=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("openssl %s failed:\n%s" % (args[0], p.stderr.decode()))


def make_ca(d, name):
    """A self-signed test CA (EC P-256): (cert path, key path)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / (name + ".crt"), d / (name + ".key")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", crt, "-days", "3", "-subj", "/CN=" + name,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    return crt, key


def make_cert(d, ca, name, dns=("localhost",), ips=("127.0.0.1",)):
    """A server certificate signed by `ca` for the given names: (cert, key)."""
    d = Path(d)
    crt, key, csr, ext = (d / (name + s) for s in (".crt", ".key", ".csr", ".ext"))
    san = ",".join(["DNS:" + n for n in dns] + ["IP:" + i for i in ips])
    ext.write_text(
        "subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n" % san
    )
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=" + (list(dns) + list(ips))[0],
    )
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", crt, "-days", "3", "-extfile", ext, cwd=d,
    )
    return crt, key


def make_tls_files(d):
    """Everything the TLS tests need: a CA and its server cert for 127.0.0.1
    and localhost, a second unrelated CA, and a cert from the good CA for a
    name that is not ours (other.example)."""
    t = TLSFiles()
    t.dir = Path(d)
    t.ca = make_ca(d, "test-ca")
    t.ca_cert = t.ca[0]
    t.server = make_cert(d, t.ca, "server")
    t.other_ca = make_ca(d, "other-ca")
    t.other_ca_cert = t.other_ca[0]
    t.wrong_host = make_cert(d, t.ca, "wrong-host", dns=("other.example",), ips=())
    return t


def client_tls(ca_cert):
    """A client TLS context that trusts only `ca_cert`."""
    ctx = ssl.create_default_context(cafile=str(ca_cert))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
