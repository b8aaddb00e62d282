#!/usr/bin/env python3
"""Summarise a forward-kernel trace (FA3C_FWD_TRACE=1 builds, src/cuda/forward/trace.cuh).

    python3 tools/gpu/trace_report.py TRACE [--block-flops F] [--timeline N]

Per consumer warpgroup, over the traced CTAs: the median cycles of each phase
of a key block in the steady state (not a tile's first block), of a tile's
first block and of its end (last P·V, epilogue), and the period between two
turns. F (optional): FLOPs of one key block of one warpgroup (4 * 64 * BLOCK_N
* D), to print FLOP per clock per SM against the 4096 of dense bf16 wgmma.
--timeline N: also print CTA 0's stamps for N key blocks from its 20th, per
warpgroup, relative to the first (to see how the warpgroups interleave).
The producer's line: cycles from a K load's issue to the consumers' first
check that it has landed (small: the load was late).
Pure Python (no numpy), so it runs anywhere.
"""
import array
import statistics
import struct
import sys

EV = dict(TILE_START=0, DATA=1, TURN=2, S_READY=3, SOFTMAX=4, PV_DONE=5, CONVERTED=6, EPI_BEGIN=7, LAST_DATA=8,
          LAST_TURN=9, LAST_PV_DONE=10, TILE_END=11, K_SLOT_FREE=12, V_SLOT_FREE=13, EPI_STAGE=14, EPI_STAGED=15)


def load(path):
    with open(path, "rb") as f:
        d, ctas, roles, blocks, events = struct.unpack("5i", f.read(20))
        a = array.array("Q")
        a.frombytes(f.read())
    return d, ctas, roles, blocks, events, a


def med(xs):
    return f"{statistics.median(xs):7.0f}" if xs else "      -"


def main():
    path = sys.argv[1]
    flops = float(sys.argv[sys.argv.index("--block-flops") + 1]) if "--block-flops" in sys.argv else 0.0
    d, ctas, roles, blocks, events, a = load(path)

    def stamp(c, r, b, e):
        return a[((c * roles + r) * blocks + b) * events + e] if 0 <= b < blocks else 0

    print(f"trace {path}: hdim {d}, {ctas} CTAs traced")
    steady = {k: [] for k in ("data wait", "turn wait", "issue->S", "softmax", "->PV done", "rescale+cvt", "period")}
    first = {k: [] for k in ("Q+K wait", "turn wait", "issue->S", "softmax+cvt")}
    last = {k: [] for k in ("V wait", "turn wait", "issue->PV", "epilogue", "->next turn")}
    # The epilogue's parts (TMA-store epilogue): to its entry (O in the V ring: the ring's
    # reads), to a free staging buffer (row sums, 1/sum, log; the previous store's read; a barrier), to O
    # staged (stmatrix, proxy fence, a barrier), to the end (TMA store issue, LSE).
    epi = {k: [] for k in ("->entry", "->stage free", "->staged", "->end")}
    rate = []
    for c in range(ctas):
        # Every consumer warpgroup that computed a block (one may idle on its first tiles).
        consumers = [r for r in range(roles - 1) if any(stamp(c, r, b, EV["TURN"]) for b in range(blocks))]
        t0, t1, nblocks = None, 0, 0
        for r in consumers:
            for b in range(blocks):
                g = lambda e, bb=b: stamp(c, r, bb, e)
                if g(EV["TILE_START"]):
                    t0 = g(EV["TILE_START"]) if t0 is None else min(t0, g(EV["TILE_START"]))
                if g(EV["TILE_END"]):
                    t1 = max(t1, g(EV["TILE_END"]))
                if not g(EV["TURN"]):
                    continue
                nblocks += 1
                if g(EV["TILE_START"]):
                    first["Q+K wait"].append(g(EV["DATA"]) - g(EV["TILE_START"]))
                    first["turn wait"].append(g(EV["TURN"]) - g(EV["DATA"]))
                    first["issue->S"].append(g(EV["S_READY"]) - g(EV["TURN"]))
                    first["softmax+cvt"].append(g(EV["CONVERTED"]) - g(EV["S_READY"]))
                elif g(EV["PV_DONE"]):
                    prev_end = stamp(c, r, b - 1, EV["CONVERTED"])
                    if prev_end:
                        steady["data wait"].append(g(EV["DATA"]) - prev_end)
                        steady["period"].append(g(EV["TURN"]) - stamp(c, r, b - 1, EV["TURN"]))
                    steady["turn wait"].append(g(EV["TURN"]) - g(EV["DATA"]))
                    steady["issue->S"].append(g(EV["S_READY"]) - g(EV["TURN"]))
                    steady["softmax"].append(g(EV["SOFTMAX"]) - g(EV["S_READY"]))
                    steady["->PV done"].append(g(EV["PV_DONE"]) - g(EV["SOFTMAX"]))
                    steady["rescale+cvt"].append(g(EV["CONVERTED"]) - g(EV["PV_DONE"]))
            for b in range(blocks):
                g = lambda e, bb=b: stamp(c, r, bb, e)
                if not g(EV["LAST_TURN"]):
                    continue
                prev_end = stamp(c, r, b - 1, EV["CONVERTED"])
                if prev_end:
                    last["V wait"].append(g(EV["LAST_DATA"]) - prev_end)
                last["turn wait"].append(g(EV["LAST_TURN"]) - g(EV["LAST_DATA"]))
                last["issue->PV"].append(g(EV["LAST_PV_DONE"]) - g(EV["LAST_TURN"]))
                last["epilogue"].append(g(EV["TILE_END"]) - g(EV["LAST_PV_DONE"]))
                marks = [g(EV[e]) for e in ("LAST_PV_DONE", "EPI_BEGIN", "EPI_STAGE", "EPI_STAGED", "TILE_END")]
                if all(marks):
                    for k, x, y in zip(epi, marks, marks[1:]):
                        epi[k].append(y - x)
                nxt = stamp(c, r, b, EV["TURN"])   # the next tile's first block has this ring index
                if nxt:
                    last["->next turn"].append(nxt - g(EV["TILE_END"]))
        if t0 is not None and t1 > t0 and nblocks:
            rate.append((c, nblocks, t1 - t0))
    tables = [("steady key block (median cycles)", steady), ("first key block of a tile", first),
              ("end of a tile", last)]
    if epi["->end"]:
        tables.append(("epilogue (TMA store)", epi))
    for title, table in tables:
        print(title + ":")
        print("  " + " ".join(f"{k:>12}" for k in table))
        print("  " + " ".join(f"{med(v):>12}" for v in table.values()) + f"   (n = {len(next(iter(table.values())))})")
    lead = []
    for c in range(ctas):
        for b in range(blocks):
            issued, data = stamp(c, roles - 1, b, EV["K_SLOT_FREE"]), stamp(c, 0, b, EV["DATA"])
            if issued and data:
                lead.append(data - issued)
    if lead:
        print(f"producer: K load issue -> consumer 0's data check, median {med(lead).strip()} cycles, "
              f"10th percentile {sorted(lead)[len(lead) // 10]} (n = {len(lead)})")
    if "--timeline" in sys.argv:
        count = int(sys.argv[sys.argv.index("--timeline") + 1])
        names = ("DATA", "TURN", "S_READY", "SOFTMAX", "PV_DONE", "CONVERTED")
        base = stamp(0, 0, 20, EV["TURN"])
        print("CTA 0 timeline (cycles from warpgroup 0's turn at ring index 20):")
        print("  block wg " + " ".join(f"{n:>9}" for n in names))
        for b in range(20, 20 + count):
            for r in range(roles - 1):
                row = [stamp(0, r, b, EV[n]) for n in names]
                if any(row) and base:
                    print(f"  {b:5} {r:2} " + " ".join(f"{x - base:9d}" if x else f"{'-':>9}" for x in row))
    for c, n, cycles in rate:
        line = f"CTA {c}: {n} warpgroup key blocks in {cycles} cycles"
        if flops:
            line += f": {n * flops / cycles:.0f} FLOP/clk/SM ({n * flops / cycles / 4096 * 100:.0f}% of dense bf16 wgmma)"
        print(line)


if __name__ == "__main__":
    main()
