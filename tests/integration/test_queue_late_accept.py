"""
test_queue_late_accept.py — the Redis queue's accept once sluice has said
"not stored" (docs/fallback.md, "queue": the accept deadline and the
take-back), through the real binary and a real redis-server:

Redis holds every write (CLIENT PAUSE WRITE from a second connection) for
longer than redis.timeout while a request that must be queued arrives. The
client gets the template without a request id. When Redis resumes, the
accept that was waiting in its socket runs, and must store nothing: the
counters keep one accept (the one made before the pause), the stream one
entry, no item is pending for the late request, and when the model server
comes back it gets the earlier request and never the late one.
"""

import socket
import struct
import threading
import time

import pytest

import fallback_helpers as fh
import helpers
import policy_helpers as ph
from helpers import bound, wait_until

PAUSE_MS = 1500  # well over redis.timeout, under the client's stall limit (2 s)


def items(redis):
    """{item key: st} of every sluice:q:item:* hash."""
    return {k: redis.cmd("HGET", k, "st") for k in redis.cmd("KEYS", "sluice:q:item:*")}


def acc(redis):
    return int(redis.cmd("HGET", "sluice:q:stats", "acc") or 0)


def prompts_seen(mock):
    return [r["json"]["messages"][-1]["content"] for r in mock.requests() if r.get("json")]


def queue_one(sluice_factory, redis_server, redis_url, timeout, prompt, backoff, circuit=None):
    """sluice with the Redis queue at redis_url and its model server down
    all along; one request queued (its id returned with sluice), acc 1."""
    port = helpers.free_port()
    q = {"enabled": True, "store": "redis", "backoff": backoff[0], "backoff_max": backoff[1],
         "lease": "2s", "max_attempts": 20}
    over = fh.chain(queue=q, circuit=circuit)
    over["redis"] = {"url": redis_url, "timeout": timeout}
    s = sluice_factory(overrides=over, upstream="http://127.0.0.1:%d" % port)
    r = s.chat(prompt)
    rid = r.header("X-Sluice-Request-Id")
    assert fh.is_template(r) and rid
    assert acc(redis_server) == 1
    return s, rid, port


@pytest.mark.timeout(60)
def test_accept_after_the_deadline_stores_nothing(sluice_factory, mock_factory, tmp_path,
                                                  redis_server):
    # Before: an accept that works (and that the model server, down until
    # the end, must get later). Resends to the absent model server open its
    # breaker (5 failures; more rounds of backoff fit in the pause on a
    # loaded machine): a short cooldown lets the resend go soon after it is back.
    s, before, port = queue_one(sluice_factory, redis_server, ph.redis_url(redis_server), "200ms",
                                "before the pause", ("100ms", "200ms"), circuit={"cooldown": "200ms"})
    m0 = fh.Metrics(s)

    assert redis_server.cmd("CLIENT", "PAUSE", PAUSE_MS, "WRITE") == "OK"
    r = s.chat("during the pause")
    fh.assert_template_json(r)  # the client still gets the template ...
    assert r.header("X-Sluice-Request-Id") is None  # ... told nothing was queued
    assert m0.delta("sluice_queue_store_errors_total") >= 1
    assert m0.delta("sluice_queue_accepted_total") == 0

    # Redis resumes: the accept held in its socket runs now, past its
    # deadline: it stores nothing and counts itself (stats late). Had it
    # stored, acc would read 2.
    def stat(f):
        return int(redis_server.cmd("HGET", "sluice:q:stats", f) or 0)

    wait_until(lambda: stat("late") >= 1 or acc(redis_server) != 1,
               bound(PAUSE_MS / 1000 + 10), interval=0.02, what="the held accept run")
    assert (acc(redis_server), stat("late")) == (1, 1)
    # The take-back sent after it on the same connection leaves a tombstone
    # (st c): a copy of the accept that had not run yet never will.
    wait_until(lambda: "c" in items(redis_server).values(), bound(10), interval=0.02,
               what="the take-back's tombstone")
    st = items(redis_server)
    assert acc(redis_server) == 1, (acc(redis_server), st)
    assert redis_server.cmd("XLEN", "sluice:q:stream") == 1, st
    assert sorted(st.items(), key=lambda kv: kv[1]) [-1] == ("sluice:q:item:" + before, "p"), st
    assert sorted(st.values()) == ["c", "p"], st
    wait_until(lambda: fh.metric(s, "sluice_queue_store_late") == 1, bound(5),
               what="the store's late count in /metrics")

    # The model server comes back: it gets the earlier request, never the late one.
    mock = mock_factory(name="back", port=port)
    wait_until(lambda: before in fh.mock_ids(mock), bound(10), what="the earlier request resent")
    wait_until(lambda: redis_server.cmd("HGET", "sluice:q:stats", "del") == "1", bound(10),
               what="its delivery recorded")
    seen = prompts_seen(mock)
    assert "during the pause" not in seen, seen
    assert seen.count("before the pause") == 1, seen
    assert acc(redis_server) == 1


class CuttingRelay:
    """A TCP relay from sluice to Redis that, once armed, forwards the first
    chunk from sluice holding `marker` to Redis and at once resets the
    sluice side (the Redis side stays open a moment, so Redis reads and runs
    what it got): sluice sees its connection drop with the accept sent and
    unanswered, and Redis runs it in time. Every other connection, and every
    connection after the cut, is relayed as is."""

    def __init__(self, target_port):
        self.target = target_port
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.marker = None
        self.cut = threading.Event()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            threading.Thread(target=self._pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, False), daemon=True).start()

    def _pump(self, src, dst, from_sluice):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                if from_sluice and self.marker and self.marker in d and not self.cut.is_set():
                    self.cut.set()
                    # sluice's side first (RST), so no answer can reach it
                    src.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    src.close()
                    dst.sendall(d)  # Redis gets the accept and runs it
                    time.sleep(0.5)
                    dst.close()
                    return
                dst.sendall(d)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def stop(self):
        self.closed = True
        self.lsock.close()


@pytest.mark.timeout(60)
def test_accept_lost_with_its_connection_is_taken_back(sluice_factory, tmp_path, redis_server):
    """The connection drops with the accept sent: sluice answers "not
    stored", though Redis ran the accept before its deadline. The take-back
    cannot go on the dropped connection; it waits in its worker's table and
    goes on the next one: the item is undone, and the queue holds only the
    earlier request. Without the table it fails (acc stays 2)."""
    relay = CuttingRelay(redis_server.port)
    try:
        # The cut, not the deadline, ends the accept: a deadline long enough
        # for the relay's threads on a loaded machine.
        s, before, _ = queue_one(sluice_factory, redis_server, "redis://127.0.0.1:%d/0" % relay.port,
                                 "2s", "before the cut", ("2s", "4s"))
        m0 = fh.Metrics(s)

        relay.marker = b"cut with the accept"
        r = s.chat("cut with the accept")
        assert relay.cut.is_set()
        fh.assert_template_json(r)
        assert r.header("X-Sluice-Request-Id") is None  # told: not stored

        # Redis ran the accept (acc 2); the take-back undoes it (acc 1).
        wait_until(lambda: m0.delta("sluice_queue_late_total", result="undone") == 1, bound(10),
                   interval=0.02, what="the take-back, on the next connection")
        st = items(redis_server)
        assert acc(redis_server) == 1, st
        assert redis_server.cmd("XLEN", "sluice:q:stream") == 1, st
        assert sorted(st.items(), key=lambda kv: kv[1])[-1] == ("sluice:q:item:" + before, "p"), st
        assert sorted(st.values()) == ["c", "p"], st
        assert fh.metric(s, "sluice_queue_takebacks_waiting") == 0
        assert m0.delta("sluice_queue_late_total", result="kept") == 0
    finally:
        relay.stop()
