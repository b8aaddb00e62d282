#!/usr/bin/env bash
# This session's one device call (kept so it can be rerun): correctness
# (tools/gpu_check.sh quick: build, GPU tests, sanitizer, quick bench), the
# decode benchmark against the peers, with GRID=1 the full forward grid
# against the peers (carry .peers/ for the stored peer runs), then
# interleaved A/B variants
# (tools/gpu_tune.sh). Short tables last; logs under $OUT (the main ones as
# files, the rest in session_logs.tar.gz: at most 8 files come back).
#   bash tools/gpu_session.sh "variant spec" ...   (gpu_tune.sh syntax)
# Environment: EXTRA_FLAGS (knobs for the tested build), SKIP_PY, DECODE=0,
# CHECK=0 (skip gpu_check.sh: for a second call that only tunes or runs the
# cluster tests; one call may last 600 s at most),
# GRID=1, CLUSTER=1 (tools/gpu_cluster.sh: the cluster build's tests), NEW=1
# (tools/gpu_bwd_fp8.sh: the backward's and the fp8 forward's tests and
# benchmark), BWD_PROFILE="64 128" (tools/gpu_profile.sh on the backward of
# those head dims, bf16, 8k, non-causal: $OUT/prof_bwd<hdim>.tar.gz), TUNE_ROUNDS,
# TUNE_TIMEOUT (seconds for the A/B part, default 300), and gpu_tune.sh's
# TUNE_INSTANCES / TUNE_BENCH_ARGS.
set -u
OUT=${OUT:-$PWD/gpu-out}
export OUT
mkdir -p "$OUT"
# gpu_check.sh packs and clears $OUT at its end: its stdout goes elsewhere first.
if [ "${CHECK:-1}" = 1 ]; then
  SKIP_PY=${SKIP_PY:-1} SKIP_PEERS=1 timeout 520 bash tools/gpu_check.sh quick >/tmp/check_stdout.txt 2>&1
  echo "== gpu_check rc=$?"
  cp /tmp/check_stdout.txt "$OUT/check_stdout.txt"
elif [ "${DECODE:-1}" = 1 ] || [ "${GRID:-0}" = 1 ]; then   # they time build-gpu: build it
  cmake -S . -B build-gpu -DFA3C_BUILD_TESTS=OFF "-DCMAKE_C_FLAGS=${EXTRA_FLAGS:-}" "-DCMAKE_CUDA_FLAGS=${EXTRA_FLAGS:-}" \
    >/dev/null 2>&1 && cmake --build build-gpu -j"$(nproc)" >/dev/null 2>&1
fi
if [ "${DECODE:-1}" = 1 ] && [ -f build-gpu/libfa3c.so ]; then
  FA3C_LIBRARY=$PWD/build-gpu/libfa3c.so PYTHONPATH=$PWD/python timeout 150 python3 bench/bench.py --hdims 64 \
    --seqlens 512 --no-gqa --no-bwd --no-fp8 --flex none --impls fa3c,cudnn,fa2 \
    $([ -d .peers ] && echo --peers .peers) --budget 100 --out "$OUT/decode" >"$OUT/decode_bench.log" 2>&1
  echo "== decode bench rc=$?"
fi
if [ "${GRID:-0}" = 1 ] && [ -f build-gpu/libfa3c.so ]; then
  # The full bench/PEERS.md grid against the peers (forward, bf16), in one process.
  FA3C_LIBRARY=$PWD/build-gpu/libfa3c.so PYTHONPATH=$PWD/python timeout 260 python3 bench/bench.py --flex none \
    --no-bwd --no-fp8 --impls fa3c,cudnn,fa2 $([ -d .peers ] && echo --peers .peers) --budget 200 \
    --out "$OUT/grid" >"$OUT/grid_bench.log" 2>&1
  echo "== grid bench rc=$?"
fi
if [ "${CLUSTER:-0}" = 1 ]; then
  timeout 480 bash tools/gpu_cluster.sh >"$OUT/cluster_stdout.txt" 2>&1
  echo "== cluster tests rc=$?"
fi
if [ "${NEW:-0}" = 1 ]; then
  timeout 560 bash tools/gpu_bwd_fp8.sh >"$OUT/new_stdout.txt" 2>&1
  echo "== backward and fp8 rc=$?"
fi
for d in ${BWD_PROFILE:-}; do
  other=$([ "$d" = 64 ] && echo 128 || echo 64)
  OUT="$OUT/prof_bwd$d" PROFILE_INSTANCES="bf16_hdim$d;bf16_hdim$other" PROFILE_KERNEL=bwd_kernel PROFILE_OBJ=bwd \
    timeout 200 bash tools/gpu_profile.sh --backward --hdim "$d" --heads $((2048 / d)) \
    >"$OUT/prof_bwd$d.txt" 2>&1
  echo "== backward profile hdim $d rc=$?"
  grep -E "^ncu rc|^ +[A-Z]" "$OUT/prof_bwd$d.txt" | head -20
  (cd "$OUT" && tar czf "prof_bwd$d.tar.gz" "prof_bwd$d" "prof_bwd$d.txt" && rm -rf "prof_bwd$d" "prof_bwd$d.txt")
done
if [ $# -gt 0 ]; then
  TUNE_ROUNDS=${TUNE_ROUNDS:-3} timeout "${TUNE_TIMEOUT:-300}" bash tools/gpu_tune.sh "$@" >"$OUT/tune_stdout.txt" 2>&1
  echo "== tune rc=$?"
fi
[ -f "$OUT/check_stdout.txt" ] && sed -n '/==== summary/,/==== fa3c forward/p' "$OUT/check_stdout.txt"
[ -f "$OUT/gpu_tests.log" ] && grep -E "Failed|FAIL" "$OUT/gpu_tests.log" | head -20
[ -f "$OUT/decode/results.md" ] && sed -n '/### Decode/,$p' "$OUT/decode/results.md" | head -14
[ -f "$OUT/grid/results.md" ] && grep -E "geometric mean" "$OUT/grid/results.md"
[ -f "$OUT/cluster_stdout.txt" ] && grep -E "^(==|   )" "$OUT/cluster_stdout.txt"
[ -f "$OUT/new_stdout.txt" ] && cat "$OUT/new_stdout.txt"
[ -f "$OUT/tune_stdout.txt" ] && { grep -E "^variant" "$OUT/tune_stdout.txt"; [ -f "$OUT/tune_summary.txt" ] && cat "$OUT/tune_summary.txt" || tail -14 "$OUT/tune_stdout.txt"; }
# At most 8 files come back from the machine: keep the ones read first, pack the rest.
(cd "$OUT" && keep='^(check_stdout\.txt|gpu_tests\.log|tune_summary\.txt|bench_fwd_gpu\.log|cluster_stdout\.txt|new_stdout\.txt|decode|grid|prof_bwd[0-9]+\.tar\.gz)$' &&
  rest="$(ls | grep -vE "$keep|^session_logs\.tar\.gz$") $(ls decode/results.json decode/plot.png grid/plot.png 2>/dev/null; true)" &&
  { [ -z "${rest// /}" ] || { tar czf session_logs.tar.gz $rest && rm -rf $rest; }; })
exit 0
