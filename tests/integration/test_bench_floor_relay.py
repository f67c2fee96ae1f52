"""build/tools/floor_relay, the bench's floor (bench/realistic.sh, bench/scale.sh):
the least CPU per request a proxy can pay on the machine, as long as it relays
every byte both ways, one upstream connection per client connection, and
closes both when either side closes. A relay that dropped or reordered bytes
would make the floor look cheaper than it is."""

import os
import socket
import threading
from pathlib import Path

import pytest

import helpers

RELAY = Path(os.environ.get("SLUICE_BUILD") or helpers.ROOT / "build") / "tools" / "floor_relay"


class EchoUpstream:
    """Echoes every byte back; counts the connections it accepted and the
    ones whose peer closed."""

    def __init__(self):
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.accepted = 0
        self.closed = 0
        self.lock = threading.Lock()
        self.closed_ev = threading.Condition(self.lock)
        helpers.accept_each(self.ls, self._echo)

    def _echo(self, c):
        with self.lock:
            self.accepted += 1
        with c:
            while True:
                try:
                    d = c.recv(65536)
                except OSError:
                    d = b""
                if not d:
                    break
                c.sendall(d)
        with self.closed_ev:
            self.closed += 1
            self.closed_ev.notify_all()

    def wait_closed(self, n, timeout):
        with self.closed_ev:
            return self.closed_ev.wait_for(lambda: self.closed >= n, timeout)


@pytest.fixture
def relay(tmp_path):
    if not os.access(RELAY, os.X_OK):
        pytest.fail("%s not built (make)" % RELAY)
    up = EchoUpstream()
    port = helpers.free_port()
    p = helpers.Proc("floor_relay", [RELAY, "-l", "127.0.0.1:%d" % port, "-u", "127.0.0.1:%d" % up.port], tmp_path)

    def up_now():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    helpers.wait_until(up_now, timeout=helpers.bound(5), what="floor_relay listening")
    # the probe's own pair: accepted, then closed with it
    assert up.wait_closed(1, helpers.bound(5))
    with up.lock:
        up.accepted = up.closed = 0
    yield port, up
    p.kill()
    p.close_logs()
    up.ls.close()


def recv_exact(s, n):
    out = bytearray()
    while len(out) < n:
        d = s.recv(min(65536, n - len(out)))
        if not d:
            break
        out += d
    return bytes(out)


def test_relays_every_byte_in_order_through_a_full_kernel(relay):
    port, up = relay
    # All of it sent before any is read back: more than the kernel holds
    # towards the client, so the relay must keep what send() refused and
    # hand it on at EPOLLOUT (its bound is 64 MiB a side; the kernel's
    # buffers on the way hold a few MiB at most).
    data = os.urandom(24 * 1024 * 1024)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # before connect: the window
        s.settimeout(helpers.bound(10))
        s.connect(("127.0.0.1", port))
        t = threading.Thread(target=s.sendall, args=(data,))
        t.start()
        t.join(helpers.bound(20))
        assert not t.is_alive(), "the relay stopped taking bytes"
        got = recv_exact(s, len(data))
    assert len(got) == len(data)
    assert got == data


def test_one_upstream_connection_per_client_and_closes_follow(relay):
    port, up = relay
    conns = [socket.create_connection(("127.0.0.1", port), timeout=helpers.bound(5)) for _ in range(3)]
    for i, c in enumerate(conns):
        for k in range(20):  # kept-alive exchanges on the same pair
            msg = b"request %d.%d\r\n" % (i, k)
            c.sendall(msg)
            assert recv_exact(c, len(msg)) == msg
    with up.lock:
        assert up.accepted == 3
    for c in conns:
        c.close()
    assert up.wait_closed(3, helpers.bound(5)), "the relay kept an upstream connection after its client left"
