#!/usr/bin/env bash
# The Hopper backward (src/cuda/bwd_sm90.cuh; off by default until this
# passes: FA3C_CUDA_BWD) on the GPU machine, in one call: a hang-trap test
# build of the backward's instances with it on, the step test of its dQ
# GEMM (test_wgmma: stmatrix + wgmma with both operands MN-major), the
# backward suite (test_bwd), compute-sanitizer memcheck and racecheck on
# bwd_small, then a release build, the Python GPU tests that run torch
# autograd through it, and the backward against cuDNN and FA2 (bench.py,
# hdim 64 and 128, bf16; the forward is timed too). Logs to
# $OUT/bwd; a short summary last.
#   bash tools/gpu_bwd.sh          (BWD_BENCH=0: no benchmark; EXTRA_FLAGS: knobs for both builds)
set -u
OUT=${OUT:-$PWD/gpu-out}
L="$OUT/bwd"
mkdir -p "$L"
flags=${EXTRA_FLAGS:-}
insts="bf16_hdim64;bf16_hdim128;fp16_hdim64;fp16_hdim128"   # each brings its backward instance (sources.cmake)
B=build-gpu-bwd
t0=$(date +%s)
timeout 400 cmake -S . -B $B -DFA3C_DEBUG_HANGS=ON -DFA3C_CUDA_BWD=ON -DFA3C_CUDA_VARLEN=OFF "-DFA3C_INSTANCES=$insts" \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags" >"$L/build.log" 2>&1 &&
  timeout 400 cmake --build $B -j"$(nproc)" --target test_wgmma test_bwd >>"$L/build.log" 2>&1
echo "== bwd test build rc=$? in $(( $(date +%s) - t0 )) s"
timeout 60 $B/tests/test_wgmma >"$L/test_wgmma.log" 2>&1
echo "== test_wgmma (dQ step test last): rc=$? $(grep -E '^(ok|FAIL)' "$L/test_wgmma.log" | tr '\n' ' ')"
grep -E "ss_mn" "$L/test_wgmma.log" | sed 's/^/   /'
(cd $B && timeout 400 ctest -R test_bwd --output-on-failure --timeout 150 -j1) >"$L/test_bwd.log" 2>&1
echo "== test_bwd: $(grep -E 'tests passed|tests failed' "$L/test_bwd.log" | tail -1)"
grep -E "^\[|max err|FAIL" $B/Testing/Temporary/LastTest.log 2>/dev/null >"$L/bwd_errors.log"
grep -E "FAIL" "$L/bwd_errors.log" | head -20 | sed 's/^/   /'
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_bwd bwd_small \
      >"$L/sanitizer_$tool.log" 2>&1
    echo "== compute-sanitizer $tool bwd_small: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitizer_$tool.log" | tail -1)"
  done
fi
if [ "${BWD_BENCH:-1}" = 1 ]; then
  R=build-gpu-bwd-release
  timeout 300 cmake -S . -B $R -DFA3C_BUILD_TESTS=OFF -DFA3C_CUDA_BWD=ON -DFA3C_CUDA_VARLEN=OFF "-DFA3C_INSTANCES=$insts" \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags" >"$L/build_release.log" 2>&1 &&
    timeout 300 cmake --build $R -j"$(nproc)" >>"$L/build_release.log" 2>&1
  echo "== release build rc=$?; ptxas: C75xx warnings $(grep -cE 'C7508|C7510|C7515|C7511|C7519' "$L/build_release.log"), backward kernels: $(grep -A3 'bwd_kernel' "$L/build_release.log" | grep -E 'spill|Used' | sort | uniq -c | tr '\n' ';')"
  # torch autograd through the backward (the Python GPU tests that take it, hdim 64 and 128).
  FA3C_LIBRARY=$PWD/$R/libfa3c.so timeout 200 bash tools/test_python.sh -q -k "gpu and (autograd or compile or varlen)" \
    >"$L/python_bwd.log" 2>&1
  echo "== python GPU autograd tests: rc=$? $(grep -E '(passed|failed)' "$L/python_bwd.log" | tail -1)"
  FA3C_LIBRARY=$PWD/$R/libfa3c.so PYTHONPATH=$PWD/python timeout 240 python3 bench/bench.py --hdims 64,128 \
    --seqlens 512,2048,8192 --no-gqa --no-decode --no-fp8 --flex none --impls fa3c,cudnn,fa2 --budget 200 \
    --out "$L/bench" >"$L/bench.log" 2>&1
  echo "== bwd bench rc=$?"
  [ -f "$L/bench/results.md" ] && grep -iE "bwd|backward|^\| *(impl|shape)" "$L/bench/results.md" | head -30
fi
exit 0
