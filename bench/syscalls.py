#!/usr/bin/env python3
"""bench/syscalls.py — counts a proxy's system calls by kind in an strace log.

Used by bench/syscalls.sh. `syscalls.py count LOG` prints one "kind count"
line per kind for a log written by `strace -f -x -s 65536 -o LOG -p PID`;
`syscalls.py table` reads "target shape n_short n_long conns short long"
lines (two count files per row) on stdin and prints the markdown tables.

A socket is "client" or "upstream", told from what crosses it: accept4's
result, connect's socket, TLS records (client side), or the first bytes of
plain HTTP/1.1 (a request read from a client, written to an upstream; an
answer the other way round). Whatever else (eventfd, the listener, files)
is "other".
"""
import re
import sys
from collections import Counter

READS = {"read", "readv", "recvfrom", "recvmsg"}
WRITES = {"write", "writev", "sendto", "sendmsg"}
TIME = {"clock_gettime", "gettimeofday", "time", "clock_nanosleep", "nanosleep"}
LINE = re.compile(r"^(\d+)\s+(.*)$")
CALL = re.compile(r"^([a-z_0-9]+)\((.*)\)\s+=\s+(-?\d+|\?|0x[0-9a-f]+)(.*)$", re.S)
STR = re.compile(r'"((?:[^"\\]|\\.)*)"')
ESC = {"n": 10, "r": 13, "t": 9, "v": 11, "f": 12, '"': 34, "\\": 92}


def unescape(s):
    """strace -x string text to bytes."""
    out = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out.append(ord(c))
            i += 1
        elif s[i + 1] == "x":
            out.append(int(s[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(ESC.get(s[i + 1], ord(s[i + 1])))
            i += 2
    return bytes(out)


def tls_records(b):
    """Number of whole TLS records at the start of b (0 if not TLS)."""
    n = 0
    while len(b) >= 5 and 0x14 <= b[0] <= 0x18 and b[1] == 3:
        n += 1
        b = b[5 + (b[3] << 8 | b[4]):]
    return n


def side_of(data, writing):
    if tls_records(data):
        return "client"
    if data.startswith(b"HTTP/"):
        return "client" if writing else "upstream"
    if re.match(rb"^(POST|GET|PUT|HEAD|DELETE|OPTIONS|PATCH) ", data):
        return "upstream" if writing else "client"
    return None


def lines(path):
    """Whole calls, one per yield: strace -f splits a call another thread
    interrupted into "<unfinished ...>" and "<... name resumed>"."""
    pending = {}
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            pid, rest = m.groups()
            if rest.startswith("+++") or rest.startswith("---"):
                continue
            if rest.endswith("<unfinished ...>"):
                pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
                continue
            r = re.match(r"^<\.\.\. [a-z_0-9]+ resumed>\s?(.*)$", rest, re.S)
            if r:
                if pid not in pending:
                    continue
                rest = pending.pop(pid) + r.group(1)
            yield rest


def count(path):
    c = Counter()
    fds = {}
    for text in lines(path):
        m = CALL.match(text)
        if not m:
            continue
        name, args, ret, tail = m.groups()
        ret = int(ret, 0) if ret != "?" else 0
        c["all"] += 1
        c["sys." + name] += 1
        if ret < 0:
            c["errors"] += 1
        fd = args.split(",", 1)[0].strip()
        if name == "epoll_wait" or name == "epoll_pwait":
            if ret > 0:
                c["epoll_wait.events"] += ret
            else:
                c["epoll_wait.empty"] += 1
            continue
        if name == "epoll_ctl":
            op = args.split(",")[1].strip().replace("EPOLL_CTL_", "").lower()
            c["epoll_ctl." + op] += 1
            if ret < 0:
                c["epoll_ctl.failed"] += 1
            continue
        if name == "accept4" or name == "accept":
            if ret >= 0:
                fds[str(ret)] = "client"
            continue
        if name == "connect":
            fds[fd] = "upstream"
            continue
        if name == "close":
            fds.pop(fd, None)
            continue
        if name in TIME or name.startswith("timerfd"):
            c["time"] += 1
            continue
        if name not in READS and name not in WRITES:
            continue
        writing = name in WRITES
        data = b""
        if ret > 0:
            data = b"".join(unescape(s) for s in STR.findall(args))
            if not writing:
                data = data[:ret]
            side = side_of(data, writing)
            if side:
                fds[fd] = side
        side = fds.get(fd, "other")
        kind = "%s.%s" % (side, "write" if writing else "read")
        c[kind] += 1
        if not writing and ret < 0 and "EAGAIN" in tail:
            c[kind + ".eagain"] += 1
        if not writing and ret == 0:
            c[kind + ".eof"] += 1
        if writing and side == "client" and ret > 0:
            c["client.tls_records"] += tls_records(data)
    return c


ROWS = [
    ("all", "system calls, all"),
    ("epoll_wait", "epoll_wait"),
    ("epoll_wait.empty", "  of which returned nothing"),
    ("epoll_wait.events", "  events delivered"),
    ("epoll_ctl", "epoll_ctl"),
    ("client.read", "client reads"),
    ("client.read.eagain", "  of which EAGAIN"),
    ("client.write", "client writes"),
    ("client.tls_records", "  TLS records written"),
    ("upstream.read", "upstream reads"),
    ("upstream.read.eagain", "  of which EAGAIN"),
    ("upstream.write", "upstream writes"),
    ("time", "clock / timer calls (not vDSO)"),
    ("errors", "calls that failed"),
]


def val(c, key):
    if key == "epoll_wait":
        return c["sys.epoll_wait"] + c["sys.epoll_pwait"]
    if key == "epoll_ctl":
        return c["sys.epoll_ctl"]
    return c[key]


def load(path):
    c = Counter()
    with open(path) as f:
        for ln in f:
            k, v = ln.split()
            c[k] = int(v)
    return c


def table():
    rows = [ln.split() for ln in sys.stdin if ln.strip()]
    shapes = []
    for r in rows:
        if r[1] not in shapes:
            shapes.append(r[1])
    for shape in shapes:
        sel = [r for r in rows if r[1] == shape]
        per = {}
        for t, _, n1, n2, conns, f1, f2 in sel:
            a, b = load(f1), load(f2)
            n1, n2, conns = int(n1), int(n2), int(conns)
            keys = set(a) | set(b) | {k for k, _ in ROWS}
            req = {k: (val(b, k) - val(a, k)) / (n2 - n1) for k in keys}
            con = {k: (val(a, k) - req[k] * n1) / conns for k in keys}
            per[t] = (req, con)
        names = [t for t, *_ in sel]
        print("\n%s: system calls per request by kind, (%s requests) ÷ difference, strace -f\n" %
              (shape, " − ".join([sel[0][3], sel[0][2]])))
        print("| kind | " + " | ".join(names) + " |")
        print("| --- |" + " ---: |" * len(names))
        for k, label in ROWS:
            print("| %s | %s |" % (label, " | ".join("%.2f" % (round(per[t][0][k], 2) + 0.0) for t in names)))
        print("| per connection (handshake, close): system calls | %s |" %
              " | ".join("%.1f" % per[t][1]["all"] for t in names))
        other = sorted({k for t in names for k in per[t][0] if k.startswith("sys.")
                        and max(abs(per[u][0].get(k, 0)) for u in names) >= 0.05})
        print("\nby name (%s): %s" % (" / ".join(names), "; ".join(
            "%s %s" % (k[4:], " / ".join("%.2f" % per[t][0].get(k, 0) for t in names)) for k in other)))


if __name__ == "__main__":
    if sys.argv[1] == "count":
        for k, v in sorted(count(sys.argv[2]).items()):
            print(k, v)
    else:
        table()
