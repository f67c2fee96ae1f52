#!/usr/bin/python3
"""check-layers-report.py — the gateway's structure figures, for the closing
note of a restructure and for anyone who wants to watch them drift:

  - files in the gateway's call cycle: the largest strongly connected
    component of "a.c calls a function defined in b.c", read from the
    objects' symbol tables (nm), so macros and comments cannot fool it;
  - lines of the largest gateway header;
  - fields of the request struct (struct gw_req);
  - the files each docs/gateway.md recipe touches (counted from the doc).

Usage: scripts/check-layers-report.py [BUILD_DIR [SOURCE_ROOT]]   (default: build, this tree)
"""
import os
import re
import subprocess
import sys

ROOT = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
GW = os.path.join(ROOT, "gateway")


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBR":  # functions and data
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def sccs(graph):
    """Tarjan, iterative enough for a few dozen nodes."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    objdir = os.path.join(BUILD, "obj", "gateway")
    if not os.path.isdir(objdir):
        sys.exit(f"{objdir}: build first (make all)")
    srcs = sorted(f[:-2] for f in os.listdir(GW) if f.endswith(".c"))
    defs, uses = {}, {}
    for s in srcs:
        obj = os.path.join(objdir, s + ".o")
        if not os.path.exists(obj):
            sys.exit(f"{obj}: missing, build first")
        defs[s], uses[s] = symbols(obj)
    owner = {sym: s for s in srcs for sym in defs[s]}
    graph = {s: sorted({owner[u] for u in uses[s] if u in owner and owner[u] != s}) for s in srcs}
    comps = sorted(sccs(graph), key=len, reverse=True)
    big = comps[0] if comps else []
    print(f"gateway .c files: {len(srcs)}")
    print(f"files in the call cycle: {len(big) if len(big) > 1 else 0}"
          + (f" ({' '.join(sorted(big))})" if len(big) > 1 else ""))

    headers = [f for f in os.listdir(GW) if f.endswith(".h")]
    sizes = sorted(((sum(1 for _ in open(os.path.join(GW, h))), h) for h in headers), reverse=True)
    print(f"gateway headers: {len(headers)}; largest: {sizes[0][1]} ({sizes[0][0]} lines)")

    for h in headers:
        text = open(os.path.join(GW, h)).read()
        m = re.search(r"^struct gw_req \{\n(.*?)^\};", text, re.S | re.M)
        if m:
            body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
            nfields = 0
            for decl in body.split(";"):
                decl = decl.strip()
                if not decl:
                    continue
                # "int a, b" declares two fields; a function pointer counts once.
                nfields += 1 if "(" in decl else 1 + decl.count(",")
            nbool = len(re.findall(r"^\s*bool\b[^;]*", body, re.M))
            print(f"fields of struct gw_req ({h}): {nfields} (bool declarations: {nbool})")

    doc = os.path.join(ROOT, "docs", "gateway.md")
    if os.path.exists(doc):
        text = open(doc).read()
        for m in re.finditer(r"^### Recipe: (.*?)\n(.*?)(?=^#|\Z)", text, re.S | re.M):
            files = set(re.findall(r"^- `([^`]+)`", m.group(2), re.M))
            print(f"recipe '{m.group(1).strip()}': {len(files)} files")


if __name__ == "__main__":
    main()
