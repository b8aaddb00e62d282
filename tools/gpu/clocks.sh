#!/usr/bin/env bash
# SM clock and board power while a kernel runs for a few seconds: is a shape
# power-limited (clock below the boost clock) and does a peer run at a higher
# clock on the same shape? fa3c (fa3c-run), cuDNN (torch SDPA) and a bf16
# GEMM, each for ~4 s, sampled by nvidia-smi every 50 ms; medians printed.
#   bash tools/gpu.sh clocks FA3C_RUN_BINARY [hdim seqlen batch heads causal]
set -u
bin=$1; D=${2:-128}; S=${3:-8192}; B=${4:-2}; H=${5:-16}; C=${6:-0}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
sample() {   # sample NAME CMD...: run CMD while sampling, print medians of the busy samples
  local name=$1; shift
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 50 \
    >"$OUT/clocks_$name.csv" 2>/dev/null &
  local smi=$!
  "$@" >"$OUT/clocks_$name.log" 2>&1
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$name" "$OUT/clocks_$name.csv" <<'PY'
import statistics, sys
rows = [l.split(", ") for l in open(sys.argv[2]) if l.count(",") >= 3]
busy = [r for r in rows if float(r[1]) > 200]   # watts: the kernel is running
if not busy: print(f"{sys.argv[1]:>8}: no busy samples"); sys.exit()
clk = statistics.median(float(r[0]) for r in busy); pw = statistics.median(float(r[1]) for r in busy)
reasons = max(set(r[3].strip() for r in busy), key=[r[3].strip() for r in busy].count)
print(f"{sys.argv[1]:>8}: {len(busy):3d} busy samples, SM clock median {clk:.0f} MHz, power median {pw:.0f} W, throttle reasons {reasons}")
PY
}
causal_flag=$([ "$C" = 1 ] && echo --causal)
sample fa3c timeout 60 "$bin" --device cuda --batch "$B" --seqlen "$S" --heads "$H" --hdim "$D" $causal_flag --iters 2000 --warmup 20 --check-rows 0
tail -2 "$OUT/clocks_fa3c.log"
sample cudnn timeout 60 python3 - "$D" "$S" "$B" "$H" "$C" <<'PY'
import sys, time, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
D, S, B, H, C = map(int, sys.argv[1:])
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(C)); torch.cuda.synchronize()
    t = time.time(); n = 0
    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True); e0.record()
    while time.time() - t < 4:
        for _ in range(50): torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(C))
        n += 50; torch.cuda.synchronize()
    e1.record(); torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / n
    print(f"cudnn {ms:.3f} ms {4 * B * H * S * S * D / (2 if C else 1) / ms / 1e9:.1f} TFLOPS")
PY
tail -1 "$OUT/clocks_cudnn.log"
sample gemm timeout 60 python3 - <<'PY'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
a @ b; torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 4:
    for _ in range(20): a @ b
    n += 20; torch.cuda.synchronize()
print(f"gemm {2 * 8192**3 * n / (time.time() - t) / 1e12:.0f} TFLOPS")
PY
tail -1 "$OUT/clocks_gemm.log"
