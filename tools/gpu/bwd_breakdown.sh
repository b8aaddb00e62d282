#!/usr/bin/env bash
# Where a backward call's time goes, per kernel, on the GPU machine: for this
# tree ("new") and any others in AB_TREES ("label:dir ...", e.g. trees made
# with `git archive` under .ab/, carried), a release build of the bf16
# backward instances; then per shape (16k tokens, heads 2048 / hdim; a label
# "128:512c" is causal), for each tree in turn:
#   - fa3c-run's event-timed backward: median ms and TFLOPS (the host's work
#     inside the call counts: the GPU waits for it), PASS / FAIL with
#     CHECK_ROWS > 0 (rows per (batch, head) against float64; "new" only
#     unless CHECK_ALL=1);
#   - with NCU=1 (default; "new" only unless NCU_ALL=1) ncu's
#     gpu__time_duration of each backward kernel of one call.
#   AB_TREES="old:.ab/old" SHAPES="64:512 128:512c" bash tools/gpu.sh bwd-breakdown
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
insts=${BREAKDOWN_INSTANCES:-bf16_hdim64;bf16_hdim128;bf16_hdim256}
shapes=${SHAPES:-64:512 64:2048 64:16384 128:512 128:2048 128:16384 256:512 256:16384}
trees=("new:." ${AB_TREES:-})
for tr in "${trees[@]}"; do
  label=${tr%%:*}; dir=${tr#*:}
  (cd "$dir" && timeout 300 cmake -S . -B build-breakdown -DFA3C_BUILD_TESTS=OFF "-DFA3C_INSTANCES=$insts" >/dev/null 2>&1 &&
    timeout 300 cmake --build build-breakdown -j"$(nproc)" --target fa3c-run >"$OUT/breakdown_build_$label.log" 2>&1) ||
    echo "build of $label ($dir) failed"
done
run() {   # label dir hdim seqlen causal
  local label=$1 bin=$2/build-breakdown/fa3c-run d=$3 s=$4 c=$5 args perf kern="" rows=0
  [ -x "$bin" ] || return
  args=(--device cuda --batch $((16384 / s)) --seqlen "$s" --heads $((2048 / d)) --hdim "$d" --backward)
  [ "$c" = 1 ] && args+=(--causal)
  { [ "$label" = new ] || [ "${CHECK_ALL:-0}" = 1 ]; } && rows=${CHECK_ROWS:-0}
  perf=$(timeout 120 "$bin" "${args[@]}" --check-rows "$rows" --iters "${ITERS:-20}" --warmup 3 2>&1 |
    grep -oE "perf +[0-9.]+|time +[0-9.]+ ms|PASS|FAIL" | tr -s ' ' | tr '\n' ' ')
  if [ "${NCU:-1}" = 1 ] && { [ "$label" = new ] || [ "${NCU_ALL:-0}" = 1 ]; } && command -v ncu >/dev/null; then
    kern=$(timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"bwd" -c 3 \
      "$bin" "${args[@]}" --check-rows 0 --iters 1 --warmup 0 2>/dev/null |
      awk '/bwd_[a-z_]*kernel/ {match($0, /bwd_[a-z_]*kernel/); k=substr($0, RSTART, RLENGTH)}
           /gpu__time_duration.sum/ {printf "%s %s %s; ", k, $(NF), $(NF-1)}')
  fi
  printf "%-4s %-8s %s| %s\n" "$label" "$d:$s$([ "$c" = 1 ] && echo c)" "$perf" "$kern"
}
# Clocks up first: the first shape after the builds would run on an idle GPU's.
timeout 60 build-breakdown/fa3c-run --device cuda --batch 8 --seqlen 2048 --heads 16 --hdim 128 --backward \
  --check-rows 0 --iters 400 --warmup 0 >/dev/null 2>&1
for shp in $shapes; do
  d=${shp%%:*}; s=${shp#*:}; c=0
  case $s in *c) c=1; s=${s%c} ;; esac
  for tr in "${trees[@]}"; do run "${tr%%:*}" "${tr#*:}" "$d" "$s" "$c"; done
done
