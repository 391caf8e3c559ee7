#!/usr/bin/env python3
"""Turns the results of tools/bench/compare.sh into a table (compare.txt,
also printed), one JSON document (compare.json) and an SVG plot
(compare.svg: MiB/s against payload size, one panel per queue depth, one
line per system; the raw single-stream ciphers have no queue depth and
appear in every panel). Standard library only."""

import argparse
import json
import math
import os

SYSTEMS = [
    ("ours", "our daemon", "#d62728"),
    ("dpdk", "DPDK 22.11 vhost_crypto", "#1f77b4"),
    ("openssl", "openssl speed (raw, single stream)", "#2ca02c"),
    ("algos", "algorithms single stream (raw)", "#9467bd"),
]


# The cells besides plain encrypt (compare.sh --cells): key in compare.json,
# system suffix (ours-SUFFIX, dpdk-SUFFIX), table title.
CELLS = [
    ("decrypt", "dec", "ours-dec / dpdk-dec: AES-128-CBC decrypt"),
    ("chaining", "hmac", "ours-hmac / dpdk-hmac: AES-128-CBC + HMAC-SHA1 (12-byte digest) encrypt, chained, in place"),
    (
        "chaining_decrypt",
        "hmac-dec",
        "ours-hmac-dec / dpdk-hmac-dec: HMAC-SHA1 (12-byte digest) verify, then AES-128-CBC decrypt, chained, in place",
    ),
    (
        "chaining_sha256",
        "hmac256",
        "ours-hmac256 / dpdk-hmac256: AES-128-CBC + HMAC-SHA-256 (16-byte digest) encrypt, chained, in place",
    ),
]


def cell_table(lines, rows, get, ours, dpdk, title):
    """Appends the table of one group of cells (size, depth, ours and DPDK,
    ratio ours/DPDK of ops/s) to lines; returns its rows."""
    sizes = sorted({r["size"] for r in rows if r["system"] in (ours, dpdk)})
    depths = sorted({r["depth"] for r in rows if r["system"] in (ours, dpdk)})
    out = []
    if not sizes:
        return out
    lines.append("")
    lines.append(title + ":")
    ch = (
        f"{'size':>6} {'depth':>5} | {'ours ops/s':>10} {'MiB/s':>7} {'d-cpu':>5} {'p50us':>6} |"
        f" {'DPDK ops/s':>10} {'MiB/s':>7} {'d-cpu':>5} {'p50us':>6} | {'ours/DPDK':>9}"
    )
    lines.append(ch)
    lines.append("-" * len(ch))
    v = lambda r, k: None if r is None else r.get(k)
    for size in sizes:
        for depth in depths:
            o, d = get(ours, size, depth), get(dpdk, size, depth)
            if o is None and d is None and not any(r["system"] in (ours, dpdk) and r["size"] == size and r["depth"] == depth for r in rows):
                continue
            rt = ratio(v(o, "ops_per_sec"), v(d, "ops_per_sec"))
            out.append({"size": size, "depth": depth, "ours": o, "dpdk": d, "ours_over_dpdk": rt})
            lines.append(
                f"{size:>6} {depth:>5} | {fmt_ops(v(o, 'ops_per_sec')):>10} {fmt(v(o, 'mib_per_sec'), '.1f'):>7}"
                f" {fmt(v(o, 'backend_cpu_s'), '.2f'):>5} {fmt(v(o, 'p50_us'), '.0f'):>6} |"
                f" {fmt_ops(v(d, 'ops_per_sec')):>10} {fmt(v(d, 'mib_per_sec'), '.1f'):>7}"
                f" {fmt(v(d, 'backend_cpu_s'), '.2f'):>5} {fmt(v(d, 'p50_us'), '.0f'):>6} | {fmt(rt, '.2f'):>9}"
            )
    return out


def fmt_ops(v):
    if v is None:
        return "n/a"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta", default="{}")
    a = ap.parse_args()
    meta = json.loads(a.meta)
    rows = [json.loads(l) for l in open(a.results) if l.strip()]

    def get(system, size, depth):
        """The run of this cell with the median ops/s (with --reps R, the
        lower median for even R); None if every run failed."""
        runs = [
            r
            for r in rows
            if r["system"] == system
            and r["size"] == size
            and (r.get("depth") == depth or system in ("openssl", "algos"))
            and "error" not in r
        ]
        if not runs:
            return None
        runs.sort(key=lambda r: r["ops_per_sec"])
        return runs[(len(runs) - 1) // 2]

    def spread(system, size, depth):
        ops = [
            r["ops_per_sec"]
            for r in rows
            if r["system"] == system and r["size"] == size and r.get("depth") == depth and "error" not in r
        ]
        return (min(ops), max(ops)) if len(ops) > 1 else None

    failed = [r for r in rows if "error" in r]

    main_systems = [k for k, _, _ in SYSTEMS]
    sizes = sorted({r["size"] for r in rows if r["system"] in main_systems})
    depths = sorted({r["depth"] for r in rows if r.get("depth") is not None and r["system"] in main_systems})

    table = []
    lines = []
    hdr = (
        f"{'size':>6} {'depth':>5} | {'ours ops/s':>10} {'MiB/s':>7} {'d-cpu':>5} {'r-cpu':>5} {'p50us':>6} |"
        f" {'DPDK ops/s':>10} {'MiB/s':>7} {'d-cpu':>5} {'r-cpu':>5} {'p50us':>6} |"
        f" {'openssl':>8} {'MiB/s':>7} | {'algos':>8} {'MiB/s':>7} |"
        f" {'ours/DPDK':>9} {'ours/ossl':>9} {'ours/algos':>10}"
    )
    if sizes:
        lines.append(hdr)
        lines.append("-" * len(hdr))
    for size in sizes:
        for depth in depths:
            o, d = get("ours", size, depth), get("dpdk", size, depth)
            s, g = get("openssl", size, None), get("algos", size, None)
            v = lambda r, k: None if r is None else r.get(k)
            row = {
                "size": size,
                "depth": depth,
                "ours": o,
                "dpdk": d,
                "openssl_ops_per_sec": v(s, "ops_per_sec"),
                "algos_ops_per_sec": v(g, "ops_per_sec"),
                "ours_over_dpdk": ratio(v(o, "ops_per_sec"), v(d, "ops_per_sec")),
                "ours_over_openssl": ratio(v(o, "ops_per_sec"), v(s, "ops_per_sec")),
                "ours_over_algos": ratio(v(o, "ops_per_sec"), v(g, "ops_per_sec")),
                "ours_runs_min_max": spread("ours", size, depth),
                "dpdk_runs_min_max": spread("dpdk", size, depth),
            }
            table.append(row)
            dpdk_na = "n/a (>2048)" if size > 2048 else "n/a"
            lines.append(
                f"{size:>6} {depth:>5} | {fmt_ops(v(o, 'ops_per_sec')):>10} {fmt(v(o, 'mib_per_sec'), '.1f'):>7}"
                f" {fmt(v(o, 'backend_cpu_s'), '.2f'):>5} {fmt(v(o, 'replay_cpu_s'), '.2f'):>5} {fmt(v(o, 'p50_us'), '.0f'):>6} |"
                + (
                    f" {fmt_ops(v(d, 'ops_per_sec')):>10} {fmt(v(d, 'mib_per_sec'), '.1f'):>7}"
                    f" {fmt(v(d, 'backend_cpu_s'), '.2f'):>5} {fmt(v(d, 'replay_cpu_s'), '.2f'):>5} {fmt(v(d, 'p50_us'), '.0f'):>6} |"
                    if d
                    else f" {dpdk_na:>38} |"
                )
                + f" {fmt_ops(v(s, 'ops_per_sec')):>8} {fmt(v(s, 'mib_per_sec'), '.0f'):>7} |"
                f" {fmt_ops(v(g, 'ops_per_sec')):>8} {fmt(v(g, 'mib_per_sec'), '.0f'):>7} |"
                f" {fmt(row['ours_over_dpdk'], '.2f'):>9} {fmt(row['ours_over_openssl'], '.3f'):>9}"
                f" {fmt(row['ours_over_algos'], '.3f'):>10}"
            )
    lines.append("")
    reps = meta.get("reps", 1)
    if reps and reps > 1:
        lines.append(f"ours and DPDK: median of {reps} runs per cell (min-max of ops/s in compare.json)")
        for t in table:
            for k in ("ours", "dpdk"):
                mm = t[f"{k}_runs_min_max"]
                if mm:
                    lines.append(f"  {k:>4} {t['size']:>5} B depth {t['depth']:>3}: {fmt_ops(mm[0])} .. {fmt_ops(mm[1])} ops/s")
    placement = placement_summary(rows, meta)
    if placement:
        lines.append("")
        lines.extend(placement)
    for r in failed:
        lines.append(f"FAILED: {r['system']} size {r['size']} depth {r['depth']}: {r['error']}")
    lines.append(
        "d-cpu: backend CPU seconds (utime+stime from /proc/PID/stat over the replay run);"
        " r-cpu: replay tool cpu_s; ratios are of ops/s."
    )
    # The ratios depend on the CPU generation (DPDK's aesni_mb picks its
    # VAES / AVX-512 code paths from the CPU), so the run names it.
    if meta.get("host") or meta.get("cpu"):
        lines.append(
            f"machine: {meta.get('host', 'n/a')}, {meta.get('cpu', 'n/a')};"
            f" libipsec-mb {meta.get('ipsec_mb', 'n/a')}; commit {meta.get('commit', 'n/a')}, {meta.get('date', 'n/a')}"
        )
        lines.append(
            f"ours' engines: {meta.get('engines', 'n/a')}; CPU flags that pick engines"
            f" (ours and intel-ipsec-mb's): {meta.get('cpu_flags', 'n/a')}"
        )

    # The targets of docs/PERFORMANCE.md.
    targets = []

    def target(name, got, want):
        ok = None if got is None else got >= want
        targets.append({"target": name, "value": got, "need": want, "met": ok})
        lines.append(
            f"target {name}: {fmt(got, '.3f')} (need >= {want}) "
            + ("n/a" if ok is None else ("MET" if ok else "NOT MET"))
        )

    lines.append("")
    r256 = next((t for t in table if t["size"] == 256 and t["depth"] == 256), None)
    r16k = next((t for t in table if t["size"] == 16384 and t["depth"] == 32), None)
    if sizes:  # (encrypt cells run: compare.sh --cells with enc)
        target("256 B depth 256 ours/DPDK", r256 and r256["ours_over_dpdk"], 1.5)
        target("256 B depth 256 ours/openssl", r256 and r256["ours_over_openssl"], 1.0)
        for size in (1024, 2048):
            for depth in (32, 256):
                r = next((t for t in table if t["size"] == size and t["depth"] == depth), None)
                target(f"{size} B depth {depth} ours/DPDK", r and r["ours_over_dpdk"], 1.5)
        target("16 KiB depth 32 ours/openssl", r16k and r16k["ours_over_openssl"], 4.5)

    # The other cells: decrypt and algorithm chaining, ours and DPDK side by side.
    cells = {}
    for key, suffix, title in CELLS:
        cells[key] = cell_table(lines, rows, get, f"ours-{suffix}", f"dpdk-{suffix}", title)

    # AlgChain encrypt (HMAC-SHA1-96), every cell.
    if cells.get("chaining"):
        lines.append("")
        for c in cells["chaining"]:
            target(f"AlgChain HMAC-SHA1 {c['size']} B depth {c['depth']} ours/DPDK", c["ours_over_dpdk"], 1.2)

    text = "\n".join(lines) + "\n"
    print(text, end="")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "compare.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump(
            {"meta": meta, "results": rows, "table": table, **cells, "targets": targets},
            f,
            indent=1,
        )
        f.write("\n")
    with open(os.path.join(a.out, "compare.svg"), "w") as f:
        f.write(svg(rows, sizes, depths, meta, get))


def placement_of(run, near_min, far):
    """close / near / far (round trip under near_min, from near_min to
    far, from far up) when the round trips measured before and after the
    run (compare.sh, vuc-xcpu-rtt) agree, else mixed; unknown when not
    measured."""
    rtt = run.get("xcpu_rtt_ns") or []
    if len(rtt) != 2 or None in rtt:
        return "unknown"
    c = {"close" if v < near_min else "near" if v < far else "far" for v in rtt}
    return c.pop() if len(c) == 1 else "mixed"


def placement_summary(rows, meta):
    """Lines on the vCPU placement the kept runs had, per backend."""
    far = meta.get("far_rtt_ns", 200)
    near_min = meta.get("near_min_rtt_ns", 0)
    out = []
    systems = ["ours", "dpdk"] + [f"{b}-{suffix}" for _, suffix, _ in CELLS for b in ("ours", "dpdk")]
    for system in systems:
        runs = [r for r in rows if r["system"] == system and "error" not in r and "xcpu_rtt_ns" in r]
        if not runs:
            continue
        classes = {}
        for r in runs:
            c = placement_of(r, near_min, far)
            classes[c] = classes.get(c, 0) + 1
        rtts = sorted(v for r in runs for v in r["xcpu_rtt_ns"] if v is not None)
        extra = sum(r.get("attempts", 1) - 1 for r in runs)
        med = f"{rtts[(len(rtts) - 1) // 2]:.0f} ns" if rtts else "n/a"
        out.append(
            f"  {system:>13}: {len(runs)} runs kept, "
            + ", ".join(f"{n} {c}" for c, n in sorted(classes.items()))
            + f"; round trip median {med}; {extra} runs made again"
        )
    if out:
        out.insert(
            0,
            f"vCPU placement (cache-line round trip CPU 0 <-> CPU 1 before/after each run;"
            f" close < {near_min} ns <= near < {far} ns <= far;"
            f" --placement {meta.get('placement', 'n/a')}"
            + (f", given up at {meta['placement_gave_up']}: a whole wait without a near round trip" if meta.get("placement_gave_up") else "")
            + "):",
        )
    return out


def svg(rows, sizes, depths, meta, get):
    pw, ph, ml, mr, mt, mb = 380, 300, 60, 15, 40, 45
    W = ml + len(depths) * (pw + mr) + 10
    H = mt + ph + mb + 30 + 18 * len(SYSTEMS)
    ys = [r["mib_per_sec"] for r in rows if r.get("mib_per_sec")]
    if not ys or not sizes:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40"><text x="5" y="20">no data</text></svg>\n'
    lo = 10 ** math.floor(math.log10(min(ys)))
    hi = 10 ** math.ceil(math.log10(max(ys)))
    xl, xh = math.log2(sizes[0]), math.log2(sizes[-1])
    if xh == xl:
        xh = xl + 1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">AES-128-CBC encrypt throughput (MiB/s, log) vs payload size'
        f' — {meta.get("date", "")}, load {meta.get("load_before", "?")}</text>',
    ]
    for i, depth in enumerate(depths):
        x0 = ml + i * (pw + mr)
        X = lambda s: x0 + (math.log2(s) - xl) / (xh - xl) * pw
        Y = lambda v: mt + ph - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * ph
        out.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        out.append(f'<text x="{x0 + pw / 2}" y="{mt - 6}" text-anchor="middle" font-size="12">queue depth {depth}</text>')
        e = int(math.log10(lo))
        while 10**e <= hi:
            for m in (1, 2, 5):
                v = m * 10**e
                if lo <= v <= hi:
                    y = Y(v)
                    out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
                    if i == 0:
                        out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
            e += 1
        for s in sizes:
            out.append(f'<line x1="{X(s):.1f}" x2="{X(s):.1f}" y1="{mt}" y2="{mt + ph}" stroke="#eee"/>')
            out.append(f'<text x="{X(s):.1f}" y="{mt + ph + 14}" text-anchor="middle">{s}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{mt + ph + 30}" text-anchor="middle">payload bytes</text>')
        for key, _, color in SYSTEMS:
            pts = []
            for s in sizes:
                r = get(key, s, depth)
                if r and r.get("mib_per_sec"):
                    pts.append((X(s), Y(r["mib_per_sec"])))
            if not pts:
                continue
            dash = ' stroke-dasharray="5,3"' if key in ("openssl", "algos") else ""
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="'
                + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                + '"/>'
            )
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in pts]
    ly = mt + ph + mb + 10
    for j, (key, label, color) in enumerate(SYSTEMS):
        y = ly + 18 * j
        dash = ' stroke-dasharray="5,3"' if key in ("openssl", "algos") else ""
        out.append(f'<line x1="{ml}" x2="{ml + 30}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{ml + 36}" y="{y + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
