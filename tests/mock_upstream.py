#!/usr/bin/env python3
"""
mock_upstream.py — a scripted OpenAI-compatible model server for sluice's
black-box tests and for `make run`'s demo upstream.

Stdlib only (asyncio), with its own HTTP/1.1 handling so that it can do what
a real framework would not let it do on purpose: cut a stream mid-event, close
without the terminating chunk, stall before the first byte, hold each SSE
event until the test says "next". It is strict about what it receives (CRLF
only, no obs-fold, one Host, valid framing): sluice re-serialises what it
forwards, and a serialisation bug must show up as a failed test, so a request
the mock cannot parse is answered 400 and recorded with `error`.

Model routes (answers echo what was asked: the reply text is built from the
prompt and the `model` field is the one the request named):
    POST /v1/chat/completions   stream or not (SSE chunks, `data: [DONE]`)
    POST /v1/completions        stream or not
    POST /v1/embeddings         deterministic 8-dim vectors (floats or base64)
    GET  /v1/models             the --models list
    (with --base-path /openai/v1 these live under /openai/v1/ instead, and a
    request for /v1/... is a 404)
    POST /v1/responses, GET|DELETE /v1/responses/{id}, POST .../cancel
                                the Responses API (answer_responses)
    * /v1/moderations, /v1/audio/*   an echo of path, method, content type, size

Control API on the same port (JSON in and out; not recorded as requests):
    POST /_mock/script    a JSON list of behaviours, consumed in order by the
                          next model requests, then `default` applies.
                          Body: [b1, b2, ...] or {"script": [...],
                          "default": {...}, "append": false}
    POST /_mock/default   {...}: the behaviour used when the script is empty
    POST /_mock/release   {"n": 1, "request": ID?}: let gated streams go on by
                          n events (without "request": every gated stream;
                          with none gated, the credit waits for the next one)
    POST /_mock/reset     forget requests, closed connections, script, gates;
                          the RNG of `percent` starts again from --seed
    POST /_mock/seed      {"seed": N}: restart the RNG of `percent` from N
    POST /_mock/drop      close every open non-control connection now
    GET  /_mock/requests  every model request (see REQUEST RECORD)
    GET  /_mock/connections   every connection that sent a model request or
                          none at all (control-only connections are hidden;
                          ?all=1 shows them)
    GET  /_mock/health    200

A behaviour is a JSON object; every key is optional and they combine. A bare
string is short for {that: true} ("gate", "no_done", "normal").
    events: N          content events in a stream (default 4)
    delay: S           seconds before each event after the first
    text: "..."        the reply text (default "echo: " + the prompt)
    usage: bool        send usage (default: non-stream yes; stream only if
                       the request asked stream_options.include_usage)
    status: CODE       answer this status with a JSON error body (or `body`)
    retry_after: V     ... with Retry-After: V
    body: str|obj      the body for `status` (an object is sent as JSON)
    headers: {k: v}    extra response headers
    cut_after: K       send K events (or, non-stream, half the body) then
                       close the socket: no terminating chunk
    cut_partial: bool  ... and half of event K+1 before closing
    cut_rst: bool      ... closing with a TCP RST instead of a FIN
    no_done: bool      end the stream cleanly (0-chunk) without [DONE]
    no_finish: bool    leave out the chunk with the finish_reason
    stall_first_byte: S|true   send nothing for S seconds (true = forever)
    stall_after_headers: S|true   send the headers, then nothing for S
    gate: bool         send event 1, then wait for /_mock/release before each
                       following event ([DONE] included)
    gate_head: bool    with gate: wait for a release before event 1 too
    gate_lead: N       with gate: each event goes out in one write with the
                       first N bytes of the next (at most all but its last
                       byte), whose rest waits for the release
    pad: N             add a "mock_pad" field of N bytes to every chunk
    embedding: [f...]  /v1/embeddings: this vector for every input (tests
                       that need known cosines, e.g. the semantic cache)
    eol: "\\r\\n"      SSE line ending (default "\\n")
    raw: [str, ...]    send these SSE events verbatim instead of generated ones
    chunk_split: K     write each event as HTTP chunks of at most K bytes
    split_delay: S     ... with S seconds between them
    coalesce: bool     write all events as one HTTP chunk in one write
    close: bool        answer with Connection: close and close afterwards
    raw_response: str  send these bytes (latin-1) as the whole answer, close
                       (with cut_rst: with a TCP RST; "" = close at once)
    demo: bool         the friendly `make run` reply: one word per event,
                       50 ms apart (what --demo makes the default)
    percent: P         apply the rest of this behaviour to P% of the requests
                       that take it (drawn from the mock's seeded RNG); the
                       others get `otherwise` (default: a normal answer).
                       {"status": 503, "percent": 30} as the default is a
                       30% 503 storm, reproducible with the same seed
    otherwise: {...}   the behaviour used when `percent` did not draw it

REQUEST RECORD: {id, conn, t, t_end, method, target, path, version,
headers: [[name, value], ...] as received, body (text), json (parsed or
null), behaviour, status, events_sent, event_times (when each streamed event was
written; chat streams), outcome, error}. `outcome` is
"complete", "cut", "peer_closed", "protocol_error" or "in_progress".
CONNECTION RECORD: {id, peer, tls, sni, opened, closed, peer_eof, closed_by,
bytes_in, bytes_out, requests, control, tls_error}. Times are
time.monotonic() seconds (CLOCK_MONOTONIC, the same clock the tests read).

Run: mock_upstream.py [--host H] [--port P|0] [--tls-cert F --tls-key F]
     [--name NAME] [--models a,b] [--demo] [--seed N]
It prints one JSON line {"listening": PORT, ...} on stdout once it accepts.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import random
import re
import signal
import socket
import ssl
import struct
import sys
import time

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
TOKEN_RE = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

DEMO_TEXT = (
    "Hello from sluice's demo upstream! Each word of this reply is its own "
    "server-sent event, sent about 50 ms after the one before, and sluice "
    "relays every event the moment it is complete, without buffering. "
    "You asked: "
)


class ProtoError(Exception):
    """The peer sent something that is not valid HTTP/1.1."""


class PeerGone(Exception):
    """The peer closed (or reset) the connection while we were answering."""


def now():
    return time.monotonic()


# ---- reply content -----------------------------------------------------------


def prompt_of(req):
    """The text a request asked about: the last user message, the prompt, or
    the input, flattened to a string."""
    if not isinstance(req, dict):
        return ""
    msgs = req.get("messages")
    if isinstance(msgs, list) and msgs:
        last = msgs[-1] if isinstance(msgs[-1], dict) else {}
        content = last.get("content", "")
        if isinstance(content, list):  # content parts
            return " ".join(
                p.get("text", "") for p in content if isinstance(p, dict)
            )
        return content if isinstance(content, str) else json.dumps(content)
    p = req.get("prompt")
    if isinstance(p, list):
        return " ".join(str(x) for x in p)
    if isinstance(p, str):
        return p
    return ""


def reply_text(prompt, events=4, text=None):
    """The reply the mock streams for `prompt` in `events` content events —
    importable by the tests to compute what the client must receive."""
    t = text if text is not None else "echo: " + prompt
    if events > len(t):
        t = t + "." * (events - len(t))
    return t


def split_text(t, n):
    """n nearly equal character slices of t (n <= len(t))."""
    if n <= 0:
        return []
    q, r = divmod(len(t), n)
    out, i = [], 0
    for k in range(n):
        size = q + (1 if k < r else 0)
        out.append(t[i : i + size])
        i += size
    return out


def demo_pieces(prompt):
    words = (DEMO_TEXT + "\u00ab" + (prompt or "nothing") + "\u00bb.").split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def embedding_of(s, dim=8):
    h = hashlib.sha256(s.encode("utf-8", "replace")).digest()
    return [(b - 128) / 128.0 for b in h[:dim]]  # exact in float32 too


def embedding_b64(vec):
    return base64.b64encode(struct.pack("<%df" % len(vec), *vec)).decode()


# ---- state shared by all connections ------------------------------------------


class Gate:
    def __init__(self):
        self.credits = 0
        self.changed = asyncio.Event()

    def add(self, n):
        self.credits += n
        self.changed.set()

    async def take(self):
        while self.credits <= 0:
            self.changed.clear()
            await self.changed.wait()
        self.credits -= 1


class State:
    def __init__(self, args):
        self.args = args
        self.script = []
        self.default = {"demo": True} if args.demo else {}
        self.requests = []
        self.conns = {}  # id -> Conn
        self.next_conn = 1
        self.next_req = 1
        self.gates = {}  # request id -> Gate (streams waiting on release)
        self.pending_credits = 0
        self.rng = random.Random(args.seed)

    def next_behaviour(self):
        b = self.script.pop(0) if self.script else dict(self.default)
        if "percent" in b:
            # One draw per request that takes this behaviour, so a run with
            # the same seed and the same order of requests is the same storm.
            drawn = self.rng.random() * 100.0 < float(b["percent"])
            if drawn:
                b = {k: v for k, v in b.items() if k not in ("percent", "otherwise")}
            else:
                b = normalise_behaviour(b.get("otherwise") or {})
        return b

    def gate_for(self, rid):
        g = Gate()
        if self.pending_credits:
            g.add(self.pending_credits)
            self.pending_credits = 0
        self.gates[rid] = g
        return g

    def release(self, n, rid=None):
        if rid is not None:
            g = self.gates.get(rid)
            if g is None:
                return 0
            g.add(n)
            return 1
        if not self.gates:
            self.pending_credits += n
            return 0
        for g in self.gates.values():
            g.add(n)
        return len(self.gates)

    def reset(self):
        self.rng = random.Random(self.args.seed)
        self.script = []
        self.default = {"demo": True} if self.args.demo else {}
        self.requests = []
        self.pending_credits = 0
        for rid, g in list(self.gates.items()):
            g.add(1 << 30)  # let anything gated finish
        self.gates = {}
        for cid, c in list(self.conns.items()):
            if c.rec["closed"] is not None:
                del self.conns[cid]
            else:
                c.rec["bytes_in"] = c.rec["bytes_out"] = c.rec["requests"] = 0


def normalise_behaviour(b):
    if isinstance(b, str):
        return {} if b == "normal" else {b: True}
    if isinstance(b, dict):
        b = dict(b)
        kind = b.pop("kind", None)
        if kind and kind != "normal" and kind not in b:
            b[kind] = True
        return b
    raise ValueError("a behaviour is an object or a string")


# ---- one connection --------------------------------------------------------------


class Conn:
    def __init__(self, st, reader, writer):
        self.st = st
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self.changed = asyncio.Event()
        self.pump_task = None
        self.resp_task = None
        self.id = st.next_conn
        st.next_conn += 1
        peer = writer.get_extra_info("peername")
        self.rec = {
            "id": self.id,
            "peer": "%s:%s" % (peer[0], peer[1]) if peer else None,
            "tls": False,
            "sni": None,
            "opened": now(),
            "closed": None,
            "peer_eof": None,
            "closed_by": None,
            "bytes_in": 0,
            "bytes_out": 0,
            "requests": 0,
            "control": False,
            "tls_error": None,
        }
        st.conns[self.id] = self

    # -- input --

    async def _pump(self):
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.rec["bytes_in"] += len(data)
                self.buf += data
                self.changed.set()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        self.eof = True
        self.rec["peer_eof"] = now()
        self.changed.set()
        # A peer that goes away mid-answer cancels the answer (that is what
        # the cancellation tests watch for: the mock notices at once).
        if self.resp_task is not None and not self.resp_task.done():
            self.resp_task.cancel()

    async def _more(self):
        """Waits for more input. False once the peer has closed."""
        if self.eof:
            return False
        self.changed.clear()
        await self.changed.wait()
        return True

    async def read_line(self, limit):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            if len(self.buf) > limit:
                raise ProtoError("line too long")
            if not await self._more():
                raise ProtoError("eof in line")

    async def read_exact(self, n):
        while len(self.buf) < n:
            if not await self._more():
                raise ProtoError("eof in body")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    async def read_head(self):
        """The head (without the final CRLFCRLF), or None at a clean EOF."""
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                head = bytes(self.buf[:i])
                del self.buf[: i + 4]
                return head
            if len(self.buf) > MAX_HEAD:
                raise ProtoError("head too large")
            if not await self._more():
                if self.buf:
                    raise ProtoError("eof in head")
                return None

    async def read_request(self):
        head = await self.read_head()
        if head is None:
            return None
        t = now()
        if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
            raise ProtoError("bare CR or LF in head")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise ProtoError("bad request line %r" % lines[0][:100])
        method, target, version = (p.decode("latin-1") for p in parts)
        headers = []
        for ln in lines[1:]:
            if ln[:1] in (b" ", b"\t"):
                raise ProtoError("obs-fold")
            name, sep, value = ln.partition(b":")
            if not sep or not TOKEN_RE.match(name):
                raise ProtoError("bad header line %r" % ln[:100])
            headers.append([name.decode("latin-1"), value.strip(b" \t").decode("latin-1")])
        lower = [(n.lower(), v) for n, v in headers]
        cls = [v for n, v in lower if n == "content-length"]
        tes = [v for n, v in lower if n == "transfer-encoding"]
        hosts = [v for n, v in lower if n == "host"]
        if version == "HTTP/1.1" and len(hosts) != 1:
            raise ProtoError("need exactly one Host, got %d" % len(hosts))
        if cls and tes:
            raise ProtoError("Content-Length with Transfer-Encoding")
        if len(cls) > 1:
            raise ProtoError("several Content-Length")
        req = {
            "id": self.st.next_req,
            "conn": self.id,
            "t": t,
            "t_end": None,
            "method": method,
            "target": target,
            "path": target.split("?", 1)[0],
            "version": version,
            "headers": headers,
            "body": "",
            "json": None,
            "behaviour": None,
            "status": None,
            "events_sent": 0,
            "outcome": "in_progress",
            "error": None,
        }
        if any(v.lower() == "100-continue" for n, v in lower if n == "expect"):
            await self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if tes:
            if len(tes) != 1 or tes[0].lower() != "chunked":
                raise ProtoError("unsupported Transfer-Encoding %r" % tes)
            body = bytearray()
            while True:
                size_line = await self.read_line(1024)
                size_s = size_line.split(b";", 1)[0]
                if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", size_s):
                    raise ProtoError("bad chunk size %r" % size_line[:40])
                size = int(size_s, 16)
                if size == 0:
                    while (await self.read_line(MAX_HEAD)) != b"":
                        pass  # trailers
                    break
                body += await self.read_exact(size)
                if await self.read_exact(2) != b"\r\n":
                    raise ProtoError("chunk not followed by CRLF")
                if len(body) > MAX_BODY:
                    raise ProtoError("body too large")
            body = bytes(body)
        elif cls:
            if not re.fullmatch(r"[0-9]{1,15}", cls[0]):
                raise ProtoError("bad Content-Length %r" % cls[0])
            n = int(cls[0])
            if n > MAX_BODY:
                raise ProtoError("body too large")
            body = await self.read_exact(n)
        else:
            body = b""
        req["body"] = body.decode("utf-8", "replace")
        if body:
            try:
                req["json"] = json.loads(body)
            except ValueError:
                req["json"] = None
        req["_keep_alive"] = self._keep_alive(version, lower)
        self.st.next_req += 1
        return req

    @staticmethod
    def _keep_alive(version, lower):
        conn = ",".join(v for n, v in lower if n == "connection").lower()
        tokens = {x.strip() for x in conn.split(",")}
        if version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    # -- output --

    async def write(self, data):
        if self.writer.is_closing():
            raise PeerGone()
        self.writer.write(data)
        self.rec["bytes_out"] += len(data)
        try:
            await self.writer.drain()
            # TLS: asyncio 3.11's SSL transport can leave drain() waiting
            # forever with write limits of 0, so it keeps the default limits
            # and the mock waits here until its buffer is empty instead.
            tr = self.writer.transport
            while self.rec["tls"] and tr.get_write_buffer_size() > 0:
                if tr.is_closing():
                    raise PeerGone()
                await asyncio.sleep(0.001)
        except (ConnectionError, ssl.SSLError, OSError) as e:
            raise PeerGone() from e

    async def close(self, rst=False, by="mock"):
        if self.rec["closed"] is None:
            self.rec["closed"] = now()
            self.rec["closed_by"] = by
        if rst:
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                except OSError:
                    pass
            self.writer.transport.abort()
            return
        try:
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (ConnectionError, ssl.SSLError, OSError, asyncio.TimeoutError):
            pass

    # -- the connection's life --

    async def run(self, tls_ctx):
        try:
            if tls_ctx is not None:
                self.rec["tls"] = True
                try:
                    await self.writer.start_tls(tls_ctx)
                except (ssl.SSLError, ConnectionError, OSError) as e:
                    self.rec["tls_error"] = str(e)
                    await self.close(by="tls_error")
                    return
                sslobj = self.writer.get_extra_info("ssl_object")
                self.rec["sni"] = SNI.pop(id(sslobj), None)
            else:
                # events_sent then means "handed to the kernel", not "queued"
                self.writer.transport.set_write_buffer_limits(0)
            self.pump_task = asyncio.ensure_future(self._pump())
            await self._serve()
        except Exception as e:  # never let one connection kill the mock
            print("mock: connection %d: %r" % (self.id, e), file=sys.stderr)
            await self.close()
        finally:
            if self.pump_task is not None:
                self.pump_task.cancel()
            if self.rec["closed"] is None:
                self.rec["closed"] = now()
                self.rec["closed_by"] = "peer" if self.eof else "mock"

    async def _serve(self):
        while True:
            try:
                req = await self.read_request()
            except ProtoError as e:
                rec = {
                    "id": self.st.next_req,
                    "conn": self.id,
                    "t": now(),
                    "t_end": now(),
                    "method": None,
                    "target": None,
                    "path": None,
                    "version": None,
                    "headers": [],
                    "body": "",
                    "json": None,
                    "behaviour": None,
                    "status": 400,
                    "events_sent": 0,
                    "outcome": "protocol_error",
                    "error": str(e),
                }
                self.st.next_req += 1
                self.st.requests.append(rec)
                try:
                    await self.send_json(
                        400, err_body("mock: " + str(e), "mock_bad_request"), close=True
                    )
                except PeerGone:
                    pass
                await self.close()
                return
            if req is None:
                await self.close(by="peer")
                return
            keep = req.pop("_keep_alive")
            control = req["path"].startswith("/_mock/")
            if control:
                self.rec["control"] = True
            else:
                self.rec["requests"] += 1
                self.st.requests.append(req)
            self.resp_task = asyncio.ensure_future(
                self.control(req) if control else self.answer(req)
            )
            try:
                keep_after = await self.resp_task
            except asyncio.CancelledError:
                if not self.eof:
                    raise
                keep_after = False
                if req["outcome"] == "in_progress":
                    req["outcome"] = "peer_closed"
            except PeerGone:
                keep_after = False
                if req["outcome"] == "in_progress":
                    req["outcome"] = "peer_closed"
            finally:
                self.resp_task = None
                req["t_end"] = now()
                self.st.gates.pop(req["id"], None)
            if req["outcome"] == "cut":
                return  # already closed
            if not (keep and keep_after):
                await self.close(by="peer" if self.eof else "mock")
                return

    # -- answers --

    async def send_head(self, status, headers, close=False):
        lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Status"))]
        for k, v in headers:
            lines.append("%s: %s" % (k, v))
        if close:
            lines.append("Connection: close")
        await self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def send_json(self, status, obj, close=False, extra=()):
        body = json.dumps(obj).encode()
        hdrs = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        hdrs += list(extra)
        await self.send_head(status, hdrs, close)
        await self.write(body)

    async def control(self, req):
        st = self.st
        path, m = req["path"], req["method"]
        body = req["json"]
        try:
            if path == "/_mock/health":
                out = {"ok": True, "name": st.args.name}
            elif path == "/_mock/script" and m == "POST":
                if isinstance(body, list):
                    body = {"script": body}
                if not isinstance(body, dict):
                    raise ValueError("script: a list or an object")
                script = [normalise_behaviour(b) for b in body.get("script", [])]
                st.script = (st.script if body.get("append") else []) + script
                if "default" in body:
                    st.default = normalise_behaviour(body["default"] or {})
                out = {"queued": len(st.script)}
            elif path == "/_mock/default" and m == "POST":
                st.default = normalise_behaviour(body or {})
                out = {"default": st.default}
            elif path == "/_mock/release" and m == "POST":
                body = body or {}
                n = int(body.get("n", 1))
                out = {"released": st.release(n, body.get("request"))}
            elif path == "/_mock/seed" and m == "POST":
                self.st.rng = random.Random(int((body or {}).get("seed", 0)))
                out = {"ok": True}
            elif path == "/_mock/reset" and m == "POST":
                st.reset()
                out = {"ok": True}
            elif path == "/_mock/drop" and m == "POST":
                victims = [
                    c for c in st.conns.values() if not c.rec["control"] and c.rec["closed"] is None
                ]
                for c in victims:
                    if c.resp_task is not None:
                        c.resp_task.cancel()
                    await c.close()
                out = {"dropped": len(victims)}
            elif path == "/_mock/requests" and m == "GET":
                out = st.requests
            elif path == "/_mock/connections" and m == "GET":
                show_all = "all=1" in req["target"]
                out = [
                    c.rec
                    for c in st.conns.values()
                    if show_all or not c.rec["control"] or c.rec["requests"]
                ]
            else:
                await self.send_json(404, err_body("no such control path", "not_found"))
                return True
        except (ValueError, TypeError) as e:
            await self.send_json(400, err_body(str(e), "bad_control"))
            return True
        await self.send_json(200, out)
        return True

    async def answer(self, req):
        st = self.st
        path, m = req["path"], req["method"]
        base = st.args.base_path
        if base != "/v1":  # --base-path: the model routes live under it only
            path = "/v1" + path[len(base):] if path.startswith(base + "/") else "(outside %s)" % base
        routes = {
            "/v1/chat/completions": "POST",
            "/v1/completions": "POST",
            "/v1/embeddings": "POST",
            "/v1/models": "GET",
        }
        if path == "/v1/responses" or path.startswith("/v1/responses/"):
            return await self.answer_responses(req)
        if path == "/v1/moderations" or path.startswith("/v1/audio/"):
            # Pass-through paths (sluice's passthrough:): say what arrived.
            ct = next((v for k, v in req["headers"] if k.lower() == "content-type"), None)
            req["status"], req["outcome"] = 200, "complete"
            await self.send_json(200, {"object": "mock.echo", "path": path, "method": m,
                                       "content_type": ct, "bytes": len(req["body"] or "")})
            return True
        if path not in routes:
            req["status"], req["outcome"] = 404, "complete"
            await self.send_json(404, err_body("mock: no route " + req["path"], "not_found"))
            return True
        if m != routes[path]:
            req["status"], req["outcome"] = 405, "complete"
            await self.send_json(
                405, err_body("mock: method", "method_not_allowed"), extra=[("Allow", routes[path])]
            )
            return True
        beh = st.next_behaviour()
        req["behaviour"] = beh
        close = bool(beh.get("close"))
        extra = [("X-Mock-Request-Id", str(req["id"]))]
        extra += [(k, str(v)) for k, v in (beh.get("headers") or {}).items()]

        stall = beh.get("stall_first_byte")
        if stall:
            await asyncio.sleep(1e9 if stall is True else float(stall))

        if beh.get("raw_response") is not None:
            # Exact bytes (broken framing on purpose), then close.
            await self.write(beh["raw_response"].encode("latin-1"))
            req["status"], req["outcome"] = 0, "cut"
            await self.close(rst=bool(beh.get("cut_rst")), by="mock_cut")
            return False

        if "status" in beh:
            status = int(beh["status"])
            body = beh.get("body")
            if body is None:
                body = err_body("mock status %d" % status, None, "server_error")
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            if beh.get("retry_after") is not None:
                extra.append(("Retry-After", str(beh["retry_after"])))
            req["status"] = status
            await self.send_head(
                status,
                [("Content-Type", "application/json"), ("Content-Length", str(len(raw)))] + extra,
                close,
            )
            await self.write(raw)
            req["outcome"] = "complete"
            return not close

        body = req["json"] if isinstance(req["json"], dict) else None
        if m == "POST" and body is None:
            req["status"], req["outcome"] = 400, "complete"
            await self.send_json(400, err_body("mock: body is not a JSON object", "invalid_json"))
            return True

        if path == "/v1/models":
            obj = {
                "object": "list",
                "data": [
                    {"id": x, "object": "model", "created": 0, "owned_by": "mock"}
                    for x in st.args.models
                ],
            }
            return await self.send_whole(req, beh, obj, extra, close)
        if path == "/v1/embeddings":
            inp = body.get("input", "")
            items = inp if isinstance(inp, list) else [inp]
            b64 = body.get("encoding_format") == "base64"  # what the openai npm client asks
            fixed = beh.get("embedding")

            def vec(x):
                return list(fixed) if fixed is not None else embedding_of(json.dumps(x))

            data = [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": embedding_b64(vec(x)) if b64 else vec(x),
                }
                for i, x in enumerate(items)
            ]
            ntok = sum(len(str(x).split()) for x in items)
            obj = {
                "object": "list",
                "data": data,
                "model": body.get("model"),
                "usage": {"prompt_tokens": ntok, "total_tokens": ntok},
            }
            return await self.send_whole(req, beh, obj, extra, close)

        chat = path == "/v1/chat/completions"
        prompt = prompt_of(body)
        model = body.get("model")
        rid = "%s-mock-%d" % ("chatcmpl" if chat else "cmpl", req["id"])
        created = int(time.time())
        if beh.get("demo"):
            pieces = demo_pieces(prompt)
            beh = dict(beh)
            beh.setdefault("delay", 0.05)
        else:
            n = int(beh.get("events", 4))
            pieces = split_text(reply_text(prompt, n, beh.get("text")), n)
        text = "".join(pieces)
        ptok = len(prompt.split())
        usage = {
            "prompt_tokens": ptok,
            "completion_tokens": len(pieces),
            "total_tokens": ptok + len(pieces),
        }
        fingerprint = st.args.name

        if not body.get("stream"):
            if chat:
                obj = {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                }
            else:
                obj = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "system_fingerprint": fingerprint,
                    "choices": [
                        {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
                    ],
                }
            if beh.get("usage", True):
                obj["usage"] = usage
            return await self.send_whole(req, beh, obj, extra, close)

        # ---- a stream ----
        want_usage = beh.get("usage")
        if want_usage is None:
            so = body.get("stream_options")
            want_usage = isinstance(so, dict) and bool(so.get("include_usage"))
        pad = int(beh.get("pad", 0))

        def chunk(choice_delta, finish=None, with_usage=False):
            c = {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": fingerprint,
            }
            if with_usage:
                c["choices"] = []
                c["usage"] = usage
            elif chat:
                c["choices"] = [{"index": 0, "delta": choice_delta, "finish_reason": finish}]
            else:
                c["choices"] = [
                    {
                        "index": 0,
                        "text": choice_delta.get("content", ""),
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ]
            if pad:
                c["mock_pad"] = "x" * pad
            return json.dumps(c)

        eol = beh.get("eol", "\n")
        if beh.get("raw") is not None:
            events = [e.encode() for e in beh["raw"]]
        else:
            datas = []
            for i, p in enumerate(pieces):
                d = {"role": "assistant", "content": p} if i == 0 and chat else {"content": p}
                datas.append(chunk(d))
            if not beh.get("no_finish"):
                datas.append(chunk({}, "stop"))
            if want_usage:
                datas.append(chunk({}, with_usage=True))
            if not beh.get("no_done"):
                datas.append("[DONE]")
            events = [("data: " + d + eol + eol).encode() for d in datas]

        req["status"] = 200
        # before the head: a client that has the head can release by request id
        gate = st.gate_for(req["id"]) if beh.get("gate") else None
        await self.send_head(
            200,
            [
                ("Content-Type", "text/event-stream"),
                ("Cache-Control", "no-cache"),
                ("Transfer-Encoding", "chunked"),
            ]
            + extra,
            close,
        )
        sah = beh.get("stall_after_headers")
        if sah:
            await asyncio.sleep(1e9 if sah is True else float(sah))

        cut = beh.get("cut_after")
        delay = float(beh.get("delay", 0))
        split = int(beh.get("chunk_split", 0))
        split_delay = float(beh.get("split_delay", 0))

        if beh.get("coalesce") and cut is None and gate is None:
            await self.write(chunked(b"".join(events)))
            req["events_sent"] = len(events)
        else:
            lead = int(beh.get("gate_lead", 0)) if gate is not None else 0
            led = 0  # bytes of this event sent with the one before
            for i, ev in enumerate(events):
                if cut is not None and i >= int(cut):
                    break
                if gate is not None and (i > 0 or beh.get("gate_head")):
                    await gate.take()
                if i > 0 and delay:
                    await asyncio.sleep(delay)
                if lead:
                    nxt = events[i + 1] if i + 1 < len(events) and (cut is None or i + 1 < int(cut)) else b""
                    head = min(lead, max(0, len(nxt) - 1))
                    ev, led = ev[led:] + nxt[:head], head
                if split:
                    for k in range(0, len(ev), split):
                        if k and split_delay:
                            await asyncio.sleep(split_delay)
                        await self.write(chunked(ev[k : k + split]))
                else:
                    await self.write(chunked(ev))
                req["events_sent"] = i + 1
                req.setdefault("event_times", []).append(time.monotonic())
        if cut is not None:
            if beh.get("cut_partial") and int(cut) < len(events):
                ev = events[int(cut)]
                await self.write(chunked(ev[: max(1, len(ev) // 2)]))
            req["outcome"] = "cut"
            await self.close(rst=bool(beh.get("cut_rst")), by="mock_cut")
            return False
        await self.write(b"0\r\n\r\n")
        req["outcome"] = "complete"
        return not close

    async def answer_responses(self, req):
        """The Responses API: POST /v1/responses (stream: SSE with `event:`
        lines, ending with response.completed and no [DONE]; behaviours:
        status, events, text, no_finish = no response.completed, cut_after =
        close after K events, usage = the usage object sent (false: none;
        default: input words, one output token an event)), GET and
        DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel."""
        st, path, m = self.st, req["path"], req["method"]
        store = st.__dict__.setdefault("responses", {})
        beh = st.next_behaviour() if m == "POST" and path == "/v1/responses" else {}
        req["behaviour"] = beh
        extra = [("X-Mock-Request-Id", str(req["id"]))]
        req["outcome"] = "complete"
        if "status" in beh:
            req["status"] = int(beh["status"])
            await self.send_json(req["status"], err_body("mock status", None, "server_error"))
            return True
        rest = path[len("/v1/responses/"):] if path != "/v1/responses" else ""
        if rest:
            rid, _, action = rest.partition("/")
            obj = store.get(rid)
            if obj is None:
                req["status"] = 404
                await self.send_json(404, err_body("mock: no response " + rid, "not_found"))
                return True
            if m == "DELETE":
                del store[rid]
                obj = {"id": rid, "object": "response.deleted", "deleted": True}
            elif m == "POST" and action == "cancel":
                obj["status"] = "cancelled"
            elif m != "GET" or action:
                req["status"] = 405
                await self.send_json(405, err_body("mock: method", "method_not_allowed"))
                return True
            req["status"] = 200
            await self.send_json(200, obj)
            return True
        body = req["json"] if isinstance(req["json"], dict) else {}
        inp = body.get("input", "")
        if isinstance(inp, list):
            parts = []
            for it in inp:
                c = it.get("content") if isinstance(it, dict) else it
                if isinstance(c, list):
                    parts += [x.get("text", "") for x in c if isinstance(x, dict)]
                elif isinstance(c, str):
                    parts.append(c)
            inp = " ".join(parts)
        n = int(beh.get("events", 4))
        pieces = split_text(reply_text(str(inp), n, beh.get("text")), n)
        text = "".join(pieces)
        rid, mid = "resp_mock_%d" % req["id"], "msg_mock_%d" % req["id"]
        usage = {"input_tokens": len(str(inp).split()), "output_tokens": len(pieces),
                 "total_tokens": len(str(inp).split()) + len(pieces),
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}
        if "usage" in beh:
            usage = beh["usage"] if beh["usage"] is not False else None
        msg = {"type": "message", "id": mid, "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
        resp = {"id": rid, "object": "response", "created_at": int(time.time()),
                "status": "completed", "model": body.get("model"), "output": [msg],
                "incomplete_details": None, "error": None, "usage": usage}
        if body.get("store", True):
            store[rid] = resp
        if not body.get("stream"):
            req["status"] = 200
            await self.send_json(200, resp)
            return True
        seq = [0]

        def ev(kind, **fields):
            d = dict(type=kind, sequence_number=seq[0], **fields)
            seq[0] += 1
            return ("event: %s\ndata: %s\n\n" % (kind, json.dumps(d))).encode()

        started = dict(resp, status="in_progress", output=[], usage=None)
        events = [ev("response.created", response=started),
                  ev("response.output_item.added", output_index=0,
                     item=dict(msg, status="in_progress", content=[]))]
        events += [ev("response.output_text.delta", item_id=mid, output_index=0, content_index=0,
                      delta=p, logprobs=[]) for p in pieces]
        events += [ev("response.output_text.done", item_id=mid, output_index=0, content_index=0,
                      text=text, logprobs=[]),
                   ev("response.output_item.done", output_index=0, item=msg)]
        if not beh.get("no_finish"):
            events.append(ev("response.completed", response=resp))
        req["status"] = 200
        await self.send_head(200, [("Content-Type", "text/event-stream"),
                                   ("Transfer-Encoding", "chunked")] + extra, False)
        delay = float(beh.get("delay", 0))
        cut = beh.get("cut_after")
        for i, e in enumerate(events):
            if cut is not None and i >= int(cut):
                req["outcome"] = "cut"
                await self.close(rst=bool(beh.get("cut_rst")), by="mock_cut")
                return False
            if i and delay:
                await asyncio.sleep(delay)
            await self.write(chunked(e))
            req["events_sent"] = i + 1
        await self.write(b"0\r\n\r\n")
        return True

    async def send_whole(self, req, beh, obj, extra, close):
        raw = json.dumps(obj).encode()
        req["status"] = 200
        await self.send_head(
            200,
            [("Content-Type", "application/json"), ("Content-Length", str(len(raw)))] + extra,
            close,
        )
        sah = beh.get("stall_after_headers")
        if sah:
            await asyncio.sleep(1e9 if sah is True else float(sah))
        if beh.get("cut_after") is not None:
            await self.write(raw[: len(raw) // 2])
            req["outcome"] = "cut"
            await self.close(rst=bool(beh.get("cut_rst")), by="mock_cut")
            return False
        await self.write(raw)
        req["outcome"] = "complete"
        return not close


def chunked(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def err_body(message, code, etype="invalid_request_error"):
    return {"error": {"message": message, "type": etype, "code": code}}


REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

SNI = {}  # id(ssl object) -> server name, filled by the SNI callback


def make_tls_ctx(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def on_sni(sslobj, name, _ctx):
        SNI[id(sslobj)] = name
        return None

    ctx.sni_callback = on_sni
    return ctx


async def main_async(args):
    st = State(args)
    tls_ctx = make_tls_ctx(args.tls_cert, args.tls_key) if args.tls_cert else None
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _l, _c: None)  # peers that vanish are normal here

    async def on_conn(reader, writer):
        await Conn(st, reader, writer).run(tls_ctx)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(
        on_conn, args.host, args.port, reuse_address=True, backlog=512
    )
    port = server.sockets[0].getsockname()[1]
    print(
        json.dumps({"listening": port, "host": args.host, "tls": bool(tls_ctx), "name": args.name}),
        flush=True,
    )
    async with server:
        await stop.wait()


def main(argv=None):
    ap = argparse.ArgumentParser(description="sluice's scripted mock upstream")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--name", default="mock")
    ap.add_argument(
        "--models",
        default="Qwen2.5-7B-Instruct,mock-embed",
        type=lambda s: [x for x in s.split(",") if x],
    )
    ap.add_argument("--demo", action="store_true", help="friendly streamed replies for make run")
    ap.add_argument("--seed", type=int, default=0, help="seed of the RNG behind `percent`")
    ap.add_argument("--base-path", default="/v1",
                    help="answer the model routes under this path instead of /v1 (a hosted "
                         "provider's /openai/v1)")
    args = ap.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
