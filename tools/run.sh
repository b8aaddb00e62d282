#!/usr/bin/env bash
# Build fa3c into build/ and run one attention problem with fa3c-run: random
# inputs, median time, TFLOPS and an accuracy check (PASS/FAIL).
#   tools/run.sh                      default shape (GPU when usable, else CPU)
#   tools/run.sh --causal --seqlen 2048 --backward    extra flags go to fa3c-run
#   tools/run.sh --help               every flag
# FA3C_CMAKE_ARGS adds configure options (e.g. -DFA3C_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck disable=SC2086  # FA3C_CMAKE_ARGS is a list of words on purpose
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${FA3C_CMAKE_ARGS:-} > "$log" 2>&1 || { cat "$log"; exit 1; }
cmake --build build -j "$(nproc)" --target fa3c-run

# A shape that takes seconds: large on a Hopper GPU, small on a 2-core CPU.
# Flags given on the command line come later and win.
if [ "$(build/fa3c-run --print-device)" = cuda ]; then
    defaults=(--batch 2 --seqlen 4096 --heads 16 --hdim 128 --dtype bf16)
else
    defaults=(--batch 1 --seqlen 1024 --heads 8 --hdim 128 --dtype bf16)
fi
build/fa3c-run "${defaults[@]}" "$@"
