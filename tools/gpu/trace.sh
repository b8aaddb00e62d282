#!/usr/bin/env bash
# Phase trace of the forward kernel on the GPU machine: builds fa3c-run with
# -DFA3C_FWD_TRACE=1 (src/cuda/forward/trace.cuh) and without, runs a few shapes of
# the bench/PEERS.md grid with each, and prints per shape the plain and traced
# TFLOPS (the trace's cost) and tools/gpu/trace_report.py's table: median cycles
# per phase of a key block, of a tile's first block and of its end, and
# FLOP per clock per SM of the traced CTAs (clock-independent, unlike TFLOPS
# under the card's power cap). With TRACE_ABLATE=1 (default) also a traced
# build without the softmax (FA3C_FWD_ABLATE_SOFTMAX=1: wrong outputs).
#   bash tools/gpu.sh trace            (TRACE_SHAPES=quick for three shapes, or
#   a list of shape labels, e.g. "h256_nc_8k h256_nc_512" or "dec_h128_8k dec_h128_32k";
#   TRACE_FLAGS="-DKNOB=V" adds knobs to every build)
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
insts=${TRACE_INSTANCES:-bf16_hdim64;bf16_hdim128;bf16_hdim256}
built=()
build() {   # name flags
  timeout 300 cmake -S . -B "build-trace-$1" -DFA3C_BUILD_TESTS=OFF "-DFA3C_INSTANCES=$insts" \
    "-DCMAKE_C_FLAGS=$2 ${TRACE_FLAGS:-}" "-DCMAKE_CUDA_FLAGS=$2 ${TRACE_FLAGS:-}" >"$OUT/build_$1.log" 2>&1 &&
    timeout 300 cmake --build "build-trace-$1" -j"$(nproc)" --target fa3c-run >>"$OUT/build_$1.log" 2>&1 &&
    built+=("$1") || { echo "build $1 failed"; tail -5 "$OUT/build_$1.log"; }
}
build plain ""
build trace "-DFA3C_FWD_TRACE=1"
[ "${TRACE_ABLATE:-1}" = 1 ] && build nosoftmax "-DFA3C_FWD_TRACE=1 -DFA3C_FWD_ABLATE_SOFTMAX=1"

perf() { grep -oE "perf +[0-9.]+" | grep -oE "[0-9.]+$"; }
# label hdim block_n batch seqlen heads [variant] [extra fa3c-run args]
shape() {
  local label=$1 hd=$2 bn=$3 b=$4 s=$5 h=$6 variant=${7:-trace}
  case "${TRACE_SHAPES:-all}" in
    all) ;;
    quick) case "$label" in h128_nc_8k|h128_c_8k|h64_nc_8k|*_nosoftmax) ;; *) return ;; esac ;;
    *) [[ " $TRACE_SHAPES " == *" $label "* ]] || return ;;
  esac
  shift 6; [ $# -gt 0 ] && shift
  local args=(--device cuda --batch "$b" --seqlen "$s" --heads "$h" --hdim "$hd" --iters 5 --warmup 3 --check-rows 0 "$@")
  local p t
  p=$(timeout 60 build-trace-plain/fa3c-run "${args[@]}" 2>>"$OUT/run.log" | perf)
  t=$(FA3C_TRACE_OUT="$OUT/$label.trace" timeout 60 "build-trace-$variant/fa3c-run" "${args[@]}" 2>>"$OUT/run.log" | perf)
  echo "== $label ($variant): plain ${p:-?} TFLOPS, traced ${t:-?} TFLOPS"
  [ -f "$OUT/$label.trace" ] && python3 tools/gpu/trace_report.py "$OUT/$label.trace" --block-flops $((4 * 64 * bn * hd))
}
{
  shape h128_nc_8k 128 128 2 8192 16
  shape h128_c_8k 128 128 2 8192 16 trace --causal
  shape h64_nc_8k 64 128 2 8192 32
  shape h128_nc_2k 128 128 8 2048 16
  shape h128_c_2k 128 128 8 2048 16 trace --causal
  shape h128_nc_512 128 128 32 512 16
  shape h64_c_512 64 128 32 512 32 trace --causal
  shape h256_nc_8k 256 80 2 8192 8
  shape h256_nc_512 256 80 32 512 8
  # Decode (bench.py's shapes 3 and 4: GQA 4 packed into a tile, split-KV on auto): is the one
  # computing warpgroup's chain per key block (S, softmax, P·V) longer than the block's DRAM time?
  shape dec_h128_8k 128 128 8 1 32 trace --seqlen-k 8192 --heads-kv 8
  shape dec_h128_32k 128 128 8 1 32 trace --seqlen-k 32768 --heads-kv 8
  if [[ " ${built[*]} " == *" nosoftmax "* ]]; then
    shape h128_nc_8k_nosoftmax 128 128 2 8192 16 nosoftmax
    shape h64_nc_8k_nosoftmax 64 128 2 8192 32 nosoftmax
  fi
} 2>&1 | tee "$OUT/trace_report.txt"
(cd "$OUT" && tar czf traces.tar.gz ./*.trace build_*.log run.log 2>/dev/null && rm -f ./*.trace build_*.log run.log)
