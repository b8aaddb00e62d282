#!/usr/bin/env bash
# Nsight Compute profile of one forward call on the GPU machine, with
# per-instruction warp-stall sampling (SourceCounters), to place the stalls in
# the SASS. Builds one instance (bf16 hdim 128 by default) without tests.
#   bash tools/gpu.sh profile [extra fa3c-run args, e.g. --causal]
# PROFILE_INSTANCES picks the instances, PROFILE_FLAGS extra -D knobs,
# PROFILE_KERNEL the kernel (default fwd_kernel; bwd_kernel with --backward,
# fwd_fp8_kernel with --dtype e4m3) and PROFILE_OBJ its object's name prefix
# for the SASS dump (default fwd; bwd for the backward).
# Results in $OUT: details.txt (the section tables), source_sass.csv.gz (stall
# samples per SASS instruction), sass.txt.gz (the kernel's SASS).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
dir=build-profile
flags=${PROFILE_FLAGS:-}
timeout 300 cmake -S . -B $dir -DFA3C_BUILD_TESTS=OFF "-DFA3C_INSTANCES=${PROFILE_INSTANCES:-bf16_hdim128}" \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags -lineinfo" >"$OUT/profile_build.log" 2>&1 &&
  timeout 300 cmake --build $dir -j"$(nproc)" >>"$OUT/profile_build.log" 2>&1 || { tail -20 "$OUT/profile_build.log"; exit 1; }
args=(--device cuda --batch 2 --seqlen 8192 --heads 16 --hdim 128 --iters 1 --warmup 1 --check-rows 0 "$@")
timeout 300 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
  --section InstructionStats -k regex:"${PROFILE_KERNEL:-fwd_kernel}" -s 1 -c 1 -f -o "$OUT/prof" $dir/fa3c-run "${args[@]}" \
  >"$OUT/profile_run.log" 2>&1
echo "ncu rc=$?"; tail -3 "$OUT/profile_run.log"
ncu --import "$OUT/prof.ncu-rep" --page details >"$OUT/details.txt" 2>&1
{ ncu --import "$OUT/prof.ncu-rep" --page source --csv --print-source sass 2>&1 ||
  ncu --import "$OUT/prof.ncu-rep" --page source --csv 2>&1; } | gzip >"$OUT/source_sass.csv.gz"
inst=${PROFILE_INSTANCES:-bf16_hdim128}
obj=$(find $dir -name "${PROFILE_OBJ:-fwd}_${inst%%;*}.cu.o" | head -1)
[ -n "$obj" ] && cuobjdump --dump-sass "$obj" | gzip >"$OUT/sass.txt.gz"
rm -f "$OUT/prof.ncu-rep"
grep -E "^ +(Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|One or More Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction)" "$OUT/details.txt" | head -20
zcat "$OUT/source_sass.csv.gz" | head -3 | cut -c1-600
