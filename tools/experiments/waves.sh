#!/usr/bin/env bash
# Wave quantization on the GPU machine (bench/RESULTS.md, run 29): times the
# forward kernel (fa3c-run, median of 40) at head counts that make the tile
# count just under, at and just over a multiple of the 132 SMs. When the time
# follows the rounds (ceil(tiles / 132)) rather than the tiles, a partly empty
# last round is costing that much. The 16k shapes take most of the time:
# fa3c-run fills its inputs on the host (about 5 minutes in all).
#   bash tools/experiments/waves.sh
set -u
J=$(nproc)
cmake -S . -B build-waves -DFA3C_BUILD_TESTS=OFF "-DFA3C_INSTANCES=bf16_hdim64;bf16_hdim128;bf16_hdim256" >/dev/null 2>&1 && cmake --build build-waves -j$J --target fa3c-run >/dev/null 2>&1 || echo build failed
r() { timeout 60 $1/fa3c-run --device cuda --iters 40 --warmup 5 --check-rows 0 "${@:2}" 2>&1 | grep -iE "ms|TFLOPS" | head -1; }
for rep in 1 2; do
for h in 125 128 132; do echo "hd128 s2k b1 h$h: $(r build-waves --batch 1 --seqlen 2048 --heads $h --hdim 128)"; done
for h in 31 32 33; do echo "hd128 s16k b1 h$h: $(r build-waves --batch 1 --seqlen 16384 --heads $h --hdim 128)"; done
for h in 276 280 288; do echo "hd64 s2k b1 h$h: $(r build-waves --batch 1 --seqlen 2048 --heads $h --hdim 64)"; done
for h in 132 128 136; do echo "hd256 s4k b1 h$h/4k: $(r build-waves --batch 1 --seqlen 4096 --heads $h --hdim 256)"; done
done
