#!/usr/bin/env bash
# Tile-size / scheduling ablations on the GPU machine: builds the bf16
# forward instances once per variant (compile-time knobs of
# src/cuda/forward/fwd_tiles.h), then times the variants in interleaved rounds
# (A B C, A B C, ...) with bench_fwd_gpu --quick, so that a drift of the
# card's clock between runs hits every variant alike. The table printed last
# has the median TFLOPS per variant over the rounds and, for each variant,
# the spread (max - min) in percent: a difference smaller than the spread is noise.
#   bash tools/gpu.sh tune "name[@srcdir]:-DKNOB=V -DKNOB2=W[:inst1;inst2]" ...
# "name@dir" builds another source tree (e.g. an export of an older commit:
# git archive HEAD~1 | tar -x -C .ab/old), to compare versions in one run.
# TUNE_INSTANCES: default instance list; TUNE_BENCH_ARGS: extra bench flags
# (--hdim 128, or --decode for the six decode shapes in GB/s, with --page-size P... for
# paged caches: the page column; 0 = contiguous); TUNE_ROUNDS: rounds (default 3).
set -u
OUT=${OUT:-$PWD/gpu-out}
T="$OUT/tune.d"   # per-variant logs, packed into $OUT/tune_logs.tar.gz at the end
mkdir -p "$T"
J=$(nproc)
[ $# -gt 0 ] || set -- "base:" "nonpersistent:-DFA3C_FWD_PERSISTENT=0"
# The variants build at the same time (one TU per instance: a variant alone
# leaves most of the cores idle), then each is checked; the timed rounds
# start only once all are built. Keep other work off the machine while they
# run: a build beside them skewed run 76's numbers by up to 10%.
specs=() pids=()
for spec in "$@"; do
  name=${spec%%:*}; flags=${spec#*:}
  src=.
  case "$name" in *@*) src=${name#*@}; name=${name%%@*} ;; esac
  dir=$PWD/build-tune-$name
  # A variant may name its own instance list: "name:flags:instances".
  case "$flags" in *:*) insts=${flags#*:}; flags=${flags%%:*} ;; *) insts=${TUNE_INSTANCES:-bf16_hdim64;bf16_hdim128;bf16_hdim256} ;; esac
  { timeout 300 cmake -S "$src" -B "$dir" -DFA3C_BUILD_TESTS=OFF -DFA3C_BUILD_CLI=OFF "-DFA3C_INSTANCES=$insts" \
      "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags" >"$T/build_$name.log" 2>&1 &&
      timeout 300 cmake --build "$dir" -j"$J" --target bench_fwd_gpu >>"$T/build_$name.log" 2>&1; } &
  pids+=($!); specs+=("$name|$flags")
done
names=()
for i in "${!pids[@]}"; do
  name=${specs[$i]%%|*}; flags=${specs[$i]#*|}
  wait "${pids[$i]}" || { echo "variant $name: build failed"; tail -5 "$T/build_$name.log"; continue; }
  echo "variant $name ($flags): spills: $(grep -E 'spill' "$T/build_$name.log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads')"
  names+=("$name")
done
for round in $(seq 1 "${TUNE_ROUNDS:-3}"); do
  for name in "${names[@]}"; do
    timeout 120 "build-tune-$name/bench_fwd_gpu" --quick ${TUNE_BENCH_ARGS:-} --csv "$T/${name}_r$round.csv" \
      >"$T/${name}_r$round.log" 2>&1 || echo "variant $name round $round: bench failed"
    # A shape the variant could not run prints its error instead of a row: say so, not an empty table.
    [ "$(wc -l <"$T/${name}_r$round.csv" 2>/dev/null || echo 0)" -gt 1 ] ||
      { echo "variant $name round $round: no timings; the bench said:"; head -5 "$T/${name}_r$round.log"; }
  done
done
python3 - "$T" "${names[@]}" <<'PY' | tee "$OUT/tune_summary.txt"
import csv, glob, os, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for n in names:
    for p in sorted(glob.glob(os.path.join(out, f"{n}_r*.csv"))):
        for r in csv.DictReader(open(p)):
            key = (int(r.get("page") or 0), int(r["hdim"]), int(r["causal"]), int(r["seqlen"]))
            rows.setdefault(key, {}).setdefault(n, []).append(float(r["tflops"]))
print("median TFLOPS over rounds (spread = (max - min) / median, %)")
print("page hdim causal seqlen " + " ".join(f"{n:>16}" for n in names))
for k in sorted(rows):
    cells = []
    for n in names:
        v = rows[k].get(n)
        cells.append(f"{statistics.median(v):9.1f} ({(max(v) - min(v)) / statistics.median(v) * 100:3.0f}%)" if v else f"{'-':>16}")
    print(f"{k[0]:4} {k[1]:4} {k[2]:6} {k[3]:6} " + " ".join(f"{c:>16}" for c in cells))
PY
(cd "$OUT" && tar czf tune_logs.tar.gz tune.d && rm -rf tune.d)
