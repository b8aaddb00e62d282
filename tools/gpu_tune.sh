#!/usr/bin/env bash
# Tile-size / scheduling ablations on the GPU machine: builds the bf16
# forward instances once per variant (compile-time knobs of
# src/cuda/fwd_tiles.h) and times each with bench_fwd_gpu --quick.
# Results: $OUT/tune_<variant>.csv and a side-by-side table printed last.
#   bash tools/gpu_tune.sh "name:-DKNOB=V -DKNOB2=W[:inst1;inst2]" ...
# TUNE_INSTANCES sets the default instance list, TUNE_BENCH_ARGS extra bench flags (--hdim 128).
set -u
OUT=${OUT:-$PWD/gpu-out}
T="$OUT/tune.d"   # per-variant logs, packed into $OUT/tune_logs.tar.gz at the end
mkdir -p "$T"
J=$(nproc)
[ $# -gt 0 ] || set -- "base:" "nonpersistent:-DFA3C_FWD_PERSISTENT=0"
names=()
for spec in "$@"; do
  name=${spec%%:*}; flags=${spec#*:}
  dir=build-tune-$name
  # A variant may name its own instance list: "name:flags:instances".
  case "$flags" in *:*) insts=${flags#*:}; flags=${flags%%:*} ;; *) insts=${TUNE_INSTANCES:-bf16_hdim64;bf16_hdim128;bf16_hdim256} ;; esac
  timeout 300 cmake -S . -B "$dir" -DFA3C_BUILD_TESTS=OFF -DFA3C_BUILD_CLI=OFF "-DFA3C_INSTANCES=$insts" \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags" >"$T/build_$name.log" 2>&1 &&
    timeout 300 cmake --build "$dir" -j"$J" --target bench_fwd_gpu >>"$T/build_$name.log" 2>&1 ||
    { echo "variant $name: build failed"; tail -5 "$T/build_$name.log"; continue; }
  echo "variant $name ($flags): spills: $(grep -E 'spill' "$T/build_$name.log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads')"
  timeout 120 "$dir/bench_fwd_gpu" --quick ${TUNE_BENCH_ARGS:-} --csv "$T/$name.csv" >/dev/null 2>&1 || echo "variant $name: bench failed"
  names+=("$name")
done
python3 - "$T" "${names[@]}" <<'PY' | tee "$OUT/tune_summary.txt"
import csv, sys, os
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for n in names:
    p = os.path.join(out, f"{n}.csv")
    if not os.path.exists(p): continue
    for r in csv.DictReader(open(p)):
        rows.setdefault((int(r["hdim"]), int(r["causal"]), int(r["seqlen"])), {})[n] = float(r["tflops"])
print("hdim causal seqlen " + " ".join(f"{n:>14}" for n in names))
for k in sorted(rows):
    print(f"{k[0]:4} {k[1]:6} {k[2]:6} " + " ".join(f"{rows[k].get(n, float('nan')):14.1f}" for n in names))
PY
(cd "$OUT" && tar czf tune_logs.tar.gz tune.d && rm -rf tune.d)
