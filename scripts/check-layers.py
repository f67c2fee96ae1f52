#!/usr/bin/python3
"""check-layers.py — fails when an #include breaks the layering written in
README.md ("Layout and layering") or the gateway's internal order
(gateway/gw_types.h). Run by `make check-layers` and in CI.

Modules: common/ depends on nothing of ours; conf/ on common/;
auth/ ratelimit/ filters/ fallback/ model/ on common/ and conf/ only (not on
each other, never on gateway/); gateway/ may use them all, through their
public headers (never a module's *_internal.h).

Inside gateway/, each header has a layer (higher calls lower):

  7 server   6 worker   5 conn   4 route   3 request and hooks
  2 proxy/attempt   1 upstream   0 runtime and leaves

A header may include headers of its own layer or below only. A .c file
belongs to the layer of the header it implements and may include the same;
an include that reaches upward is a call upward, which should go through a
stored callback instead. The ones that remain are listed, each with its
reason, in scripts/check-layers.allow; the list may only shrink: a new
upward include fails, and so does an entry that no longer occurs.

Usage: scripts/check-layers.py [-v]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOW = os.path.join(ROOT, "scripts", "check-layers.allow")

MODULE_DEPS = {
    "common": {"common"},
    "conf": {"common", "conf"},
    "auth": {"common", "conf", "auth"},
    "ratelimit": {"common", "conf", "ratelimit"},
    "filters": {"common", "conf", "filters"},
    "fallback": {"common", "conf", "fallback"},
    "model": {"common", "conf", "model"},
}
# A new top-level folder of C sources is a policy module: the same rule as
# auth/ and the others, with no edit here.
NOT_MODULES = {"gateway", "tests", "scripts", "bench", "docs"}
for _d in sorted(os.listdir(ROOT)):
    _p = os.path.join(ROOT, _d)
    if (_d not in MODULE_DEPS and _d not in NOT_MODULES and not _d.startswith((".", "build"))
            and os.path.isdir(_p) and any(f.endswith((".c", ".h")) for f in os.listdir(_p))):
        MODULE_DEPS[_d] = {"common", "conf", _d}
ALL_MODULES = set(MODULE_DEPS) | {"gateway"}

LAYER_NAMES = ["runtime/leaf", "upstream", "proxy", "request", "route", "conn", "worker",
               "server"]
HEADER_LAYER = {
    "gw_types.h": 0, "gw_rt.h": 0, "gw_tls.h": 0, "gw_balance.h": 0, "gw_sup.h": 0,
    "gw_metrics.h": 0, "gw_h2_mem.h": 0, "gw_wio.h": 0, "http1.h": 0, "sse.h": 0, "sb.h": 0,
    "json_intake.h": 0, "gw_gzip.h": 0, "body_scan.h": 0, "body_store.h": 0,
    "gw_upstream.h": 1,
    "gw_proxy.h": 2,
    "gw_req.h": 3, "gw_hook.h": 3, "gw_fallback.h": 3, "gw_flow.h": 3, "gw_flt_resp.h": 3,
    "gw_route.h": 4,
    "gw_conn.h": 5,
    "gw_h2.h": 5,
    "gw_worker.h": 6,
    "gw_server.h": 7,
    "gw_llm.h": 0, "gw_admin.h": 4, "gw_trace.h": 0,
}
# .c files whose layer is not that of a same-named header.
SOURCE_LAYER = {
    "accesslog.c": 5, "respond.c": 3, "hooks.c": 3, "hook_auth.c": 3, "hook_filters.c": 3,
    "hook_ratelimit.c": 3, "hook_fallback.c": 3, "hook_cache.c": 3, "fallback_chain.c": 3,
    "fallback_journal.c": 3, "flt_responses.c": 3,
    "resend.c": 3, "flow.c": 3, "engine_gw.c": 2, "proxy.c": 2,
    "upstream.c": 1, "balance.c": 0,
    "route.c": 4, "conn.c": 5, "h2.c": 5, "worker.c": 6, "server.c": 7, "main.c": 7,
    "rt.c": 0, "h2_mem.c": 0, "tls.c": 0, "gw_metrics.c": 0, "wio.c": 0, "http1.c": 0, "sse.c": 0,
    "supervise.c": 0, "sse_finish.c": 0, "json_intake.c": 0, "gzip.c": 0, "body_scan.c": 0, "body_store.c": 0,
    "upgrade.c": 7,
    "llm_metrics.c": 3, "hook_llm.c": 3, "admin.c": 4, "trace.c": 0,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def files_of(folder, exts=(".c", ".h")):
    d = os.path.join(ROOT, folder)
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(d) if f.endswith(exts))


def includes(rel):
    with open(os.path.join(ROOT, rel)) as f:
        text = f.read()
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        m = INCLUDE.match(line)
        if m:
            out.append((n, m.group(1)))
    return out


def main():
    verbose = "-v" in sys.argv[1:]
    errors = []
    # --- modules ---------------------------------------------------------
    for mod, allowed in MODULE_DEPS.items():
        for rel in files_of(mod):
            for n, inc in includes(rel):
                top = inc.split("/")[0] if "/" in inc else mod
                if top in ALL_MODULES and top not in allowed:
                    errors.append(f"{rel}:{n}: {mod}/ may not include {inc} "
                                  f"(README: {mod}/ depends on {', '.join(sorted(allowed))})")
    for rel in files_of("gateway"):
        for n, inc in includes(rel):
            if inc.endswith("_internal.h") and not inc.startswith("gateway/"):
                errors.append(f"{rel}:{n}: {inc} is another module's internals; "
                              "use its public header")

    # --- gateway order ---------------------------------------------------
    allow = {}
    if os.path.exists(ALLOW):
        with open(ALLOW) as f:
            for n, line in enumerate(f, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                m = re.match(r"^(\S+)\s*->\s*(\S+)$", line)
                if not m:
                    errors.append(f"scripts/check-layers.allow:{n}: expected 'file.c -> header.h'")
                    continue
                allow[(m.group(1), m.group(2))] = n
    seen_allowed = set()
    upward = 0
    for rel in files_of("gateway"):
        base = os.path.basename(rel)
        if base.endswith(".h"):
            if base not in HEADER_LAYER:
                errors.append(f"{rel}: a gateway header without a layer: add it to "
                              "HEADER_LAYER in scripts/check-layers.py")
                continue
            own = HEADER_LAYER[base]
        else:
            if base not in SOURCE_LAYER:
                errors.append(f"{rel}: a gateway source without a layer: add it to "
                              "SOURCE_LAYER in scripts/check-layers.py")
                continue
            own = SOURCE_LAYER[base]
        for n, inc in includes(rel):
            if not inc.startswith("gateway/"):
                continue
            h = inc[len("gateway/"):]
            if h not in HEADER_LAYER:
                errors.append(f"{rel}:{n}: {inc}: unknown gateway header")
                continue
            if HEADER_LAYER[h] <= own:
                continue
            what = (f"{rel}:{n}: {LAYER_NAMES[own]} includes {inc} "
                    f"({LAYER_NAMES[HEADER_LAYER[h]]}, a layer above)")
            if base.endswith(".h"):
                errors.append(what + ": a header may only include its layer or below")
            elif (base, h) in allow:
                seen_allowed.add((base, h))
                upward += 1
                if verbose:
                    print("allowed: " + what)
            else:
                errors.append(what + ": call through a stored callback instead "
                              "(or, if it must stay, list it in scripts/check-layers.allow)")
    for key, n in sorted(allow.items(), key=lambda kv: kv[1]):
        if key not in seen_allowed:
            errors.append(f"scripts/check-layers.allow:{n}: {key[0]} -> {key[1]} no longer "
                          "occurs: delete the line (the list only shrinks)")

    for e in errors:
        print(e, file=sys.stderr)
    print(f"check-layers: {len(errors)} error(s); {upward} upward include(s) still "
          f"allowed (scripts/check-layers.allow)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
