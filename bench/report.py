#!/usr/bin/env python3
"""report.py — turns bench/run.sh's raw results into the tables it prints.

Input: the results file run.sh writes, one record a line:
  meta key=value ...
  throughput WORKLOAD ROUND TARGET BENCH requests=.. duration_us=.. p50_us=..
             p99_us=.. errors=.. non2xx=.. ticks=.. sched_ns=..
  ttfe TARGET ROUND MICROSECONDS
  rss TARGET KIB_BEFORE KIB_AFTER STREAMS
Output: Markdown tables. Each figure is a median over the rounds; "x nginx"
is the median over rounds of (figure / nginx's figure in the same round),
so a noisy round moves both sides of its own ratio.
"""
import statistics
import sys
from collections import defaultdict

TARGETS = ["direct", "nginx", "sluice"]


def kv(fields):
    return {k: int(v) for k, v in (f.split("=", 1) for f in fields)}


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, (len(v) * p) // 100)]


def fmt_ratio(r):
    return "n/a" if r is None else f"{r:.2f}"


def main(path):
    meta, tput, ttfe, rss = {}, defaultdict(dict), defaultdict(list), {}
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "meta":
            meta = dict(x.split("=", 1) for x in f[1:])
        elif f[0] == "throughput":
            d = kv(f[5:])
            tput[(f[1], int(f[2]))][f[3]] = d
        elif f[0] == "ttfe":
            ttfe[f[1]].append(int(f[3]))
        elif f[0] == "rss":
            rss[f[1]] = (int(f[2]), int(f[3]), int(f[4]))
    tck = int(meta.get("tck", "100"))
    warnings = []

    def figures(d, what):
        sec = d["duration_us"] / 1e6
        out = {
            "rps": d["requests"] / sec,
            "p50": d["p50_us"],
            "p99": d["p99_us"],
            "cpu": None,
            "sched": None,
            "busy": None,
        }
        if d["requests"] and (d["ticks"] or d["sched_ns"]):
            out["cpu"] = d["ticks"] * 1e6 / tck / d["requests"]
            out["sched"] = d["sched_ns"] / 1e3 / d["requests"]
            out["busy"] = d["ticks"] / tck / sec
        if d["errors"] or d["non2xx"]:
            warnings.append(f"{what}: {d['errors']} socket errors, {d['non2xx']} non-2xx")
        return out

    for w in ["json", "sse"]:
        rounds = sorted(r for (wl, r) in tput if wl == w)
        if not rounds:
            continue
        targets = TARGETS + (["sluice_b"] if all("sluice_b" in tput[(w, r)] for r in rounds) else [])
        per = {
            t: [figures(tput[(w, r)][t], f"{w} round {r} {t}") for r in rounds] for t in targets
        }
        label = {
            "json": "json (non-streaming chat completion)",
            "sse": "sse (stream of 8 events + [DONE])",
        }[w]
        print(f"### Throughput, {label}: median of {len(rounds)} interleaved rounds\n")
        print(
            "| target | req/s | x nginx | p50 µs | x nginx | p99 µs | x nginx "
            "| proxy CPU µs/req | x nginx | proxy core busy |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for t in targets:
            row = [t]
            for k, nd in [("rps", 0), ("p50", 0), ("p99", 0), ("cpu", 1)]:
                vals = [x[k] for x in per[t]]
                if None in vals:
                    row += ["—", "—"]
                    continue
                med = statistics.median(vals)
                ratios = [a[k] / b[k] for a, b in zip(per[t], per["nginx"]) if b[k]]
                row.append(f"{med:,.{nd}f}")
                row.append(fmt_ratio(statistics.median(ratios)) if ratios else "n/a")
            busy = [x["busy"] for x in per[t]]
            row.append("—" if None in busy else f"{statistics.median(busy) * 100:.0f}%")
            print("| " + " | ".join(row) + " |")
        print()
        for t in [x for x in targets if x != "direct"]:
            cpu = [x["cpu"] for x in per[t]]
            sched = [x["sched"] for x in per[t]]
            print(
                f"- {t} CPU µs/req per round: "
                + ", ".join(f"{c:.1f}" for c in cpu)
                + " (scheduler run time: "
                + ", ".join(f"{s:.1f}" for s in sched)
                + ")"
            )
            for c, s in zip(cpu, sched):
                if s and abs(c - s) / s > 0.10:
                    warnings.append(f"{w} {t}: ticks say {c:.1f} µs/req, schedstat {s:.1f}")
        ratios = [a["cpu"] / b["cpu"] for a, b in zip(per["sluice"], per["nginx"])]
        print(
            "- sluice/nginx CPU per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + "; p99 per round: "
            + ", ".join(f"{a['p99'] / b['p99']:.2f}" for a, b in zip(per["sluice"], per["nginx"]))
        )
        print()

    if ttfe:
        n = len(ttfe["direct"])
        print(f"### SSE time to first event ({n} requests per target)\n")
        print("| target | p50 µs | p99 µs | added p50 µs | added p99 µs | added p50 x nginx |")
        print("|---|---:|---:|---:|---:|---:|")
        d50, d99 = pct(ttfe["direct"], 50), pct(ttfe["direct"], 99)
        n50 = pct(ttfe["nginx"], 50) - d50
        for t in TARGETS + (["sluice_b"] if ttfe.get("sluice_b") else []):
            p50, p99 = pct(ttfe[t], 50), pct(ttfe[t], 99)
            add = "—" if t == "direct" else f"{p50 - d50}"
            add99 = "—" if t == "direct" else f"{p99 - d99}"
            r = "—" if t == "direct" or n50 <= 0 else fmt_ratio((p50 - d50) / n50)
            print(f"| {t} | {p50} | {p99} | {add} | {add99} | {r} |")
        print()

    if rss:
        print("### RSS per idle stream\n")
        print("| proxy | RSS before KiB | RSS with streams KiB | streams | KiB/stream | x nginx |")
        print("|---|---:|---:|---:|---:|---:|")
        per_stream = {t: (a - b) / n for t, (b, a, n) in rss.items()}
        for t in ["nginx", "sluice"]:
            if t not in rss:
                continue
            b, a, n = rss[t]
            r = per_stream[t] / per_stream["nginx"] if per_stream.get("nginx") else None
            print(f"| {t} | {b:,} | {a:,} | {n} | {per_stream[t]:.1f} | {fmt_ratio(r)} |")
        print()

    for w in warnings:
        print("WARNING:", w)


if __name__ == "__main__":
    main(sys.argv[1])
