#!/usr/bin/env python3
"""Warp-stall samples of an ncu source page, summed per stretch of SASS.

tools/gpu.sh profile writes source_sass.csv.gz (ncu --page source --csv
--print-source sass). This splits the kernel's SASS at the instructions that
mark the algorithm's steps (barrier waits and arrivals, wgmma waits, HGMMA,
TMA, branches) and prints each stretch with its samples, the marker's own
samples (a wait's samples are time spent waiting) and its execution count,
largest first, so the time can be placed without reading 4000 lines:
    python3 tools/gpu/ncu_regions.py source_sass.csv.gz [--top 40]
"""
import argparse, csv, gzip

MARKERS = ("BAR.", "DEPBAR", "SYNCS", "HGMMA", "WARPGROUP.ARRIVE", "UTMA", "BRA", "EXIT")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv_gz")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    rows = list(csv.reader(gzip.open(a.csv_gz, "rt")))
    h = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    head, data = rows[h], rows[h + 1:]
    src, samp = head.index("Source"), head.index("Warp Stall Sampling (All Samples)")
    execd = head.index("Instructions Executed")
    total = sum(int(r[samp] or 0) for r in data)
    stretches, start, acc = [], 0, 0
    for i, r in enumerate(data):
        s = int(r[samp] or 0)
        if any(m in r[src] for m in MARKERS):
            stretches.append((acc, s, int(r[execd] or 0), start, i, r[src].strip()))
            start, acc = i + 1, 0
        else:
            acc += s
    print(f"{len(data)} instructions, {total} samples; stretches by samples (before the marker + the marker):")
    print(f"{'samples':>8} {'%':>5} {'marker':>7} {'executed':>9}  lines       marker instruction")
    for before, own, ex, s0, s1, text in sorted(stretches, key=lambda x: -(x[0] + x[1]))[:a.top]:
        print(f"{before + own:8d} {100 * (before + own) / max(total, 1):5.1f} {own:7d} {ex:9d}  {s0:5d}-{s1:<5d} {text[:60]}")

if __name__ == "__main__":
    main()
