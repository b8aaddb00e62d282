#!/usr/bin/env bash
# Everything run on a Hopper machine goes through here; each command is a
# script in tools/gpu/ (its header lists its environment knobs). Run from
# anywhere; logs go to $OUT (default ./gpu-out of the repository).
#   bash tools/gpu.sh check [quick|full]   build (hang-trap tests and release), every GPU test, the
#                                          differential, sanitizers, Python, benchmarks against the peers
#   bash tools/gpu.sh bwd-fp8              the backward and the fp8 forward at every head dim: tests,
#                                          sanitizers, bench.py's backward rows
#   bash tools/gpu.sh tune SPEC...         A/B of compile-time knobs or source trees, interleaved rounds
#   bash tools/gpu.sh profile [ARGS]       Nsight Compute stall samples of one call (gpu/ncu_regions.py sums them)
#   bash tools/gpu.sh trace                the forward kernel's phase trace (gpu/trace_report.py)
#   bash tools/gpu.sh bwd-breakdown        a backward call's time per kernel
#   bash tools/gpu.sh clocks FA3C_RUN ...  SM clock and board power while a kernel runs
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here/.."
export OUT=${OUT:-$PWD/gpu-out}
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  check|bwd-fp8|tune|profile|trace|bwd-breakdown|clocks) exec bash "$here/gpu/${cmd//-/_}.sh" "$@" ;;
  *) sed -n '2,/^set -u/p' "$here/gpu.sh" | sed '$d; s/^# \{0,1\}//'
     [ -z "$cmd" ] || { echo "tools/gpu.sh: no command '$cmd'" >&2; exit 2; } ;;
esac
