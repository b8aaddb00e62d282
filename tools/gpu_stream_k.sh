#!/usr/bin/env bash
# The stream-K tail (off by default: src/cuda/fwd_tiles.h, FA3C_FWD_STREAM_K)
# on the Hopper machine: a test build with it on (hang traps, a few
# instances), the scheduler's host checks, the GPU tail tests (every case
# twice, bit-identical) and compute-sanitizer memcheck and racecheck on the
# small decode case. Logs to $OUT/stream_k; a short summary is printed last.
set -u
OUT=${OUT:-$PWD/gpu-out}
L="$OUT/stream_k"
mkdir -p "$L"
B=build-gpu-stream-k
flags="-DFA3C_FWD_STREAM_K=1"
timeout 300 cmake -S . -B $B -DFA3C_DEBUG_HANGS=ON "-DFA3C_INSTANCES=bf16_hdim64;fp16_hdim64;bf16_hdim96;bf16_hdim128;bf16_hdim256" \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags" >"$L/build.log" 2>&1 &&
  timeout 300 cmake --build $B -j"$(nproc)" --target test_scheduler test_fwd >>"$L/build.log" 2>&1
echo "== stream-K build rc=$?"
timeout 60 $B/tests/test_scheduler >"$L/test_scheduler.log" 2>&1
echo "== test_scheduler (stream-K on): rc=$? $(grep -cE '^ok' "$L/test_scheduler.log") ok, $(grep -cE 'FAIL' "$L/test_scheduler.log") failed"
for case in fwd_stream_k_tail fwd_stream_k_tail_decode; do
  timeout 180 $B/tests/test_fwd $case >"$L/$case.log" 2>&1
  echo "== $case: rc=$? $(grep -cE 'runs identical 1' "$L/$case.log") cases bit-identical, $(grep -cE 'FAIL|SKIPPED' "$L/$case.log") failed or skipped"
done
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_fwd fwd_stream_k_tail_decode \
      >"$L/sanitizer_$tool.log" 2>&1
    echo "== compute-sanitizer $tool fwd_stream_k_tail_decode: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitizer_$tool.log" | tail -1)"
  done
fi
