#!/usr/bin/env python3
"""fa3c against its peers on one GPU, in one process, on the same random inputs.

    python3 bench/bench.py --out DIR            # full grid (several minutes)
    python3 bench/bench.py --quick --out DIR    # a handful of shapes, < 2 minutes

libfa3c comes from FA3C_LIBRARY=/path/to/libfa3c.so or the installed fa3c package
(the source tree's python/ is used when fa3c is not installed).

Implementations (each skipped with a note when unavailable):
  fa3c        the C ABI, one prepared fa3c_fwd / fa3c_bwd call (kernel time, ~µs of Python)
  fa3c_torch  fa3c.flash_attn_func through the torch custom op and autograd (what users call)
  cudnn, fa2, mem_eff   torch SDPA with CUDNN_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION
  flex        FlexAttention under torch.compile (forward; a subset of shapes: compiles are slow)
  fa3         the official FlashAttention-3, if flash_attn_interface is importable
  torch_step  (decode step rows only) the same step written in PyTorch: rotary, the new
              k/v written into the paged cache, the cache gathered, SDPA
  fa3c_nosink (sinks rows only) fa3c's call without the sinks: the sinks' cost
Shapes: the FA3 paper grid (16k tokens, heads = 2048 / hdim, seqlen 512..16k, hdim
64/128/256, causal and not), GQA prefill, decode (seqlen_q 1, long KV) from a contiguous
cache and from paged caches (--page-sizes; fa3c only, its GB/s also against its own
contiguous row), a full decode step (append one token's k/v to a paged cache, rotary on q
and k, attention: fa3c_with_kvcache against torch_step), attention sinks (hdim 128, forward
and backward, against the same call without them; checked against float32 math), chunked
prefill (a varlen batch mixing prefill chunks and decode tokens over packed keys and over
paged caches of --page-sizes; fa3c only, against its packed row; checked against float32
per sequence), fp8 forward.
FLOPs: 4·b·h·sq·sk·d forward (halved for causal), backward 2.5x that.

Before timing, every implementation's output (and gradients) is compared with the
reference (cuDNN, else the next SDPA backend that runs): a row whose error is out of
tolerance is marked FAILED and not timed. Timing: triton.testing.do_bench, median,
after warm-up, fresh random inputs per shape. Per-shape errors (NOT_SUPPORTED, OOM...)
are recorded and the run goes on.

Writes DIR/results.json (after every shape, so a cut-off run keeps what it measured),
DIR/results.md, DIR/plot.png (forward) and DIR/plot_bwd.png; prints the markdown last.
"""
import argparse
import contextlib
import datetime
import importlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import fa3c
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import fa3c

IMPL_ORDER = ["fa3c", "fa3c_torch", "cudnn", "fa2", "mem_eff", "flex", "fa3", "torch_step", "fa3c_nosink",
              "fa3c_fp8_call", "fa3c_fp8_blocks"]
# Shapes with implementations of their own: the paged decode runs fa3c alone (the others
# have no paged cache; its contiguous row has them), the decode step fa3c and torch_step.
KIND_IMPLS = {"decode_paged": ("fa3c",), "decode_step": ("fa3c", "torch_step"), "sinks": ("fa3c", "fa3c_nosink"),
              "chunked": ("fa3c",)}
BASE_IMPL = {"decode_step": "torch_step", "sinks": "fa3c_nosink"}   # the ratio column's baseline (else cuDNN)
# Implementations that run only on these kinds of shape: a baseline of their own, or fp8's one-call paths
# (fa3c.fp8_attention from the bf16 tensors: quantization, with the rotation, and the e4m3 forward).
ONLY_FOR = {"torch_step": ("decode_step",), "fa3c_nosink": ("sinks",), "fa3c_fp8_call": ("fp8",),
            "fa3c_fp8_blocks": ("fp8",)}
REF_ORDER = ["cudnn", "fa2", "mem_eff", "math"]  # first that runs is the reference


# ---- shapes ------------------------------------------------------------------------------

def causal_pairs(sq, sk):
    """(query, key) pairs a bottom-right aligned causal mask leaves; sq*sk/2 when sq == sk,
    the FA papers' convention, else the exact count (query i sees i + sk - sq + 1 keys)."""
    if sq == sk:
        return sq * sk / 2.0
    if sq <= sk:
        return sq * (sk - sq) + sq * (sq + 1) / 2.0
    return sk * (sk + 1) / 2.0


def shape(kind, b, sq, sk, hq, hkv, d, causal, dtype="bf16", bwd=True, flex=False, dv=None, page=0):
    """dv: v's (and out's) head dim, d's by default (MLA prefill: d 192, dv 128). page: the
    KV cache's page size (decode_paged, decode_step), 0 = contiguous."""
    dv = dv or d
    fl = 2.0 * b * hq * (d + dv) * (causal_pairs(sq, sk) if causal else sq * sk)
    el = 1 if dtype == "fp8" else 2
    # bytes a decode step must move: q, k, v read once, out written
    nbytes = el * (b * sq * hq * d + b * sk * hkv * (d + dv)) + 2 * b * sq * hq * dv
    return dict(kind=kind, batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, hdim=d,
                hdim_v=dv, causal=causal, dtype=dtype, bwd=bwd, flex=flex, flops=fl, bytes=nbytes, page=page)


def chunked_lengths(b, chunk, sk):
    """A serving engine's mixed batch (chunked prefill): every fourth sequence a prefill chunk of
    `chunk` queries, the others one decode token each; sequence i holds sk - 37 i keys (the new
    queries' included), so that no two end alike."""
    q = [chunk if i % 4 == 0 else 1 for i in range(b)]
    k = [max(sk - 37 * i, qi) for i, qi in enumerate(q)]
    return q, k


def chunked_shape(b, chunk, sk, hq, hkv, d, page):
    """Rows of the chunked prefill (causal, bottom-right aligned per sequence): the FLOPs and
    bytes of the true lengths; page 0 = keys packed contiguously (cu_seqlens_k), the baseline."""
    sh = shape("chunked", b, chunk, sk, hq, hkv, d, True, bwd=False, page=page)
    qs, ks = chunked_lengths(b, chunk, sk)
    sh["flops"] = sum(4.0 * hq * d * causal_pairs(qi, ki) for qi, ki in zip(qs, ks))
    sh["bytes"] = 2 * (sum(qs) * hq * d * 2 + sum(ks) * hkv * d * 2)
    return sh


def make_shapes(args):
    out = []
    if args.device == "cpu":  # smoke test of this script, no GPU needed
        for s in (64, 128):
            out.append(shape("grid", 1, s, s, 2, 2, 64, False, dtype=args.dtype))
            out.append(shape("grid", 1, s, s, 2, 2, 64, True, dtype=args.dtype))
        out.append(shape("decode", 2, 1, 256, 4, 2, 64, False, bwd=False))
        for p in args.page_sizes:
            out.append(shape("decode_paged", 2, 1, 256, 4, 2, 64, False, bwd=False, page=p))
        out.append(shape("decode_step", 2, 1, 255, 4, 2, 64, False, bwd=False, page=16))
        for p in [0] + list(args.page_sizes):
            out.append(chunked_shape(5, 40, 200, 4, 2, 64, p))
        out.append(shape("sinks", 1, 64, 64, 2, 2, 64, True, dtype=args.dtype))
        if not args.no_mla:
            out.append(shape("mla", 1, 64, 64, 2, 2, 32, True, dtype=args.dtype, dv=16))
        if not args.no_fp8:
            out.append(shape("fp8", 1, 128, 128, 2, 2, 128, False, dtype="fp8", bwd=False))
        return out
    if args.quick:
        grid = [(128, False, 2048), (128, True, 2048), (128, False, 8192), (128, True, 8192),
                (64, False, 4096), (256, True, 4096)]
    else:
        grid = [(d, c, s) for d in args.hdims for c in (False, True) for s in args.seqlens]
    flex_seqlens = set(args.seqlens) if args.flex == "all" else {8192} if args.flex == "some" else set()
    for d, c, s in grid:
        if d not in args.hdims or s not in args.seqlens:
            continue
        out.append(shape("grid", 16384 // s, s, s, 2048 // d, 2048 // d, d, c, dtype=args.dtype,
                         flex=(s in flex_seqlens and not args.quick)))
    if not args.no_gqa:
        for c in ((True,) if args.quick else (False, True)):
            out.append(shape("gqa", 4, 4096, 4096, 32, 8, 128, c, dtype=args.dtype,
                             flex=args.flex != "none" and not args.quick))
    if not args.no_mla:   # MLA prefill (DeepSeek): q, k 192, v 128, 16k tokens
        for c in ((True,) if args.quick else (False, True)):
            out.append(shape("mla", 4, 4096, 4096, 16, 16, 192, c, dtype=args.dtype, dv=128))
    if not args.no_sinks:   # gpt-oss style sinks: what they cost (issue: at most 3%)
        for s in ((4096,) if args.quick else (1024, 4096)):
            for c in (False, True):
                out.append(shape("sinks", 16384 // s // 4, s, s, 16, 16, 128, c, dtype=args.dtype))
    if not args.no_decode:
        dec = [(8, 8192, 32, 8, 128)] if args.quick else [
            (8, 8192, 32, 8, 128), (8, 32768, 32, 8, 128), (1, 131072, 64, 8, 128),
            (32, 4096, 32, 32, 128), (16, 16384, 16, 2, 64), (4, 16384, 32, 4, 256)]
        for b, sk, hq, hkv, d in dec:
            out.append(shape("decode", b, 1, sk, hq, hkv, d, False, bwd=False))
        for b, sk, hq, hkv, d in dec:
            for p in args.page_sizes:
                out.append(shape("decode_paged", b, 1, sk, hq, hkv, d, False, bwd=False, page=p))
        for b, sk, hq, hkv, d in dec:
            # the cache holds sk - 1 tokens; the step appends one and attends over sk
            out.append(shape("decode_step", b, 1, sk, hq, hkv, d, False, bwd=False, page=16))
        # chunked prefill: prefill chunks of 512 queries and decode tokens in one varlen call
        chunked = [(32, 512, 8192, 32, 8, 128)] if args.quick else [
            (32, 512, 8192, 32, 8, 128), (64, 256, 4096, 32, 8, 128), (16, 1024, 32768, 16, 2, 64)]
        for b, chunk, sk, hq, hkv, d in chunked:
            for p in [0] + list(args.page_sizes):
                out.append(chunked_shape(b, chunk, sk, hq, hkv, d, p))
    if not args.no_fp8:
        f8 = [(128, 8192)] if args.quick else [(128, 8192), (128, 16384), (256, 8192), (256, 16384)]
        for d, s in f8:
            out.append(shape("fp8", 16384 // s, s, s, 2048 // d, 2048 // d, d, False, dtype="fp8", bwd=False))
    return out


# ---- timing ------------------------------------------------------------------------------

class Timer:
    def __init__(self, device, quick):
        self.device = device
        self.warmup, self.rep = (25, 100) if quick else (50, 200)
        if device == "cuda":
            import triton.testing
            self._do_bench = triton.testing.do_bench

    def __call__(self, fn):
        """Median milliseconds per call."""
        if self.device == "cuda":
            return self._do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")
        fn()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[len(ts) // 2]


# ---- implementations -----------------------------------------------------------------------
# setup(sh, inp) returns a Runner or raises. A runner's fwd/bwd are the timed callables;
# out()/grads() give results in (b, s, h, d) layout with k/v gradients over heads_kv.

class Runner:
    def __init__(self, fwd, out, bwd=None, grads=None, ctx=None, note=""):
        self.fwd, self.out, self.bwd, self.grads = fwd, out, bwd, grads
        self.ctx = ctx or contextlib.nullcontext
        self.note = note


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def setup_fa3c(sh, inp):
    if sh["kind"] == "decode_paged":   # one prepared call, as the contiguous decode row's
        fc = fa3c.prepare_forward(inp["q"], inp["k_cache"], inp["v_cache"], page_table=inp["page_table"],
                                  seqused_k=inp["seqlens"], num_splits=0)
        fc.run()
        return Runner(fc.run, lambda: fc.run()[0])
    if sh["kind"] == "decode_step":   # what an engine calls: append + rotary + attention
        f = lambda: fa3c.flash_attn_with_kvcache(  # noqa: E731
            inp["q"], inp["k_cache"], inp["v_cache"], k=inp["k_new"], v=inp["v_new"], rotary_cos=inp["cos"],
            rotary_sin=inp["sin"], cache_seqlens=inp["seqlens"], page_table=inp["page_table"],
            rotary_interleaved=False, num_splits=0)
        return Runner(f, f)
    if sh["kind"] == "chunked":   # one prepared varlen call over a paged or packed cache
        kw = dict(cu_seqlens_q=inp["cu_q"], max_seqlen_q=sh["seqlen_q"], causal=True)
        if sh["page"]:
            kw.update(page_table=inp["page_table"], seqused_k=inp["seqlens"])
            fc = fa3c.prepare_forward(inp["q"], inp["k_cache"], inp["v_cache"], **kw)
        else:
            kw.update(cu_seqlens_k=inp["cu_k"], max_seqlen_k=sh["seqlen_k"])
            fc = fa3c.prepare_forward(inp["q"], inp["k"], inp["v"], **kw)
        fc.run()
        return Runner(fc.run, lambda: fc.run()[0])
    return _setup_fa3c_call(sh, inp, inp.get("sinks"))


def _setup_fa3c_fp8_call(block_scales):
    """fp8's one call for bf16 holders: fa3c.fp8_attention on the bf16 values (quantization with the
    Hadamard rotation, then the e4m3 forward), timed whole: the cost beside the kernel's row."""
    def setup(sh, inp):
        if sh["kind"] != "fp8":
            raise NotImplementedError("the one-call fp8 path runs the fp8 shapes only")
        q, k, v = inp["deq"]
        f = lambda: fa3c.fp8_attention(q, k, v, causal=sh["causal"], block_scales=block_scales)  # noqa: E731
        return Runner(f, f)
    return setup


def setup_fa3c_nosink(sh, inp):
    if sh["kind"] != "sinks":
        raise NotImplementedError("fa3c_nosink runs the sinks shapes only")
    return _setup_fa3c_call(sh, inp, None)


def _setup_fa3c_call(sh, inp, sinks):
    ns = 0 if sh["kind"] == "decode" else 1
    kw = dict(causal=sh["causal"], num_splits=ns, sinks=sinks)
    fc = fa3c.prepare_forward(inp["q"], inp["k"], inp["v"], **kw)
    out, lse = fc.run()

    def bwd_setup():
        bc = fa3c.prepare_backward(inp["dout"], inp["q"], inp["k"], inp["v"], out, lse, causal=sh["causal"],
                                   sinks=sinks)
        return bc.run, lambda: bc.run()
    if sh["bwd"]:
        brun, bgrads = bwd_setup()
    else:
        brun = bgrads = None
    return Runner(fc.run, lambda: fc.run()[0], brun, bgrads)


def setup_fa3c_torch(sh, inp):
    q, k, v = (_leaf(inp[n]) if sh["bwd"] else inp[n] for n in "qkv")
    ns = 0 if sh["kind"] == "decode" else 1
    f = lambda: fa3c.flash_attn_func(q, k, v, causal=sh["causal"], num_splits=ns)  # noqa: E731
    r = Runner(f, f)
    if sh["bwd"]:
        o = f()
        r.bwd = lambda: torch.autograd.grad(o, (q, k, v), inp["dout"], retain_graph=True)
        r.grads = r.bwd
    return r


def _sdpa_setup(backend_name):
    def setup(sh, inp):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION,
              "mem_eff": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend_name]
        if sh["causal"] and sh["seqlen_q"] != sh["seqlen_k"]:
            raise NotImplementedError("SDPA's is_causal is top-left aligned; shape needs bottom-right")
        g = sh["heads_q"] // sh["heads_kv"]
        q, k, v = (inp[n] for n in "qkv")
        if inp.get("deq") is not None:  # fp8 shape: the peers run bf16 on the dequantized values
            q, k, v = inp["deq"]
        # (b, h, s, d) contiguous, as the peers of PEERS.md were measured
        qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        if sh["bwd"]:
            qh, kh, vh = (_leaf(x) for x in (qh, kh, vh))
        ctx = lambda: sdpa_kernel([be])  # noqa: E731
        note = ""

        def call(kk, vv, gqa):
            return F.scaled_dot_product_attention(qh, kk, vv, is_causal=sh["causal"], enable_gqa=gqa)
        kk, vv, gqa = kh, vh, g > 1
        try:
            with ctx():
                o = call(kk, vv, gqa)
        except RuntimeError:
            if g == 1:
                raise
            # this backend refuses enable_gqa: expand the kv heads (more memory traffic)
            kk = kh.detach().repeat_interleave(g, dim=1)
            vv = vh.detach().repeat_interleave(g, dim=1)
            if sh["bwd"]:
                kk, vv = _leaf(kk), _leaf(vv)
            gqa = False
            note = "kv heads expanded"
            with ctx():
                o = call(kk, vv, gqa)
        f = lambda: call(kk, vv, gqa)  # noqa: E731
        r = Runner(f, lambda: f().transpose(1, 2), ctx=ctx, note=note)
        if sh["bwd"]:
            dout_h = inp["dout"].transpose(1, 2).contiguous()
            r.bwd = lambda: torch.autograd.grad(o, (qh, kk, vv), dout_h, retain_graph=True)

            def grads():
                with ctx():
                    dq, dk, dv = r.bwd()
                if kk.shape[1] != kh.shape[1]:  # fold expanded heads back onto heads_kv
                    b, _, s, d = dk.shape
                    dk = dk.view(b, -1, g, s, d).sum(2)
                    dv = dv.view(b, -1, g, s, d).sum(2)
                return tuple(x.transpose(1, 2) for x in (dq, dk, dv))
            r.grads = grads
        return r
    return setup


_flex_fn = None


def setup_flex(sh, inp):
    global _flex_fn
    if not sh["flex"]:
        raise NotImplementedError("not measured on this shape (compile time; --flex all for every shape)")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex_fn is None:
        # one compile per shape (static shapes, as the peers were measured): lift
        # dynamo's recompile limit so later shapes don't fall back to eager
        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
        _flex_fn = torch.compile(flex_attention, dynamic=False)
    q, k, v = (inp[n].transpose(1, 2).contiguous() for n in "qkv")
    bm = None
    if sh["causal"]:
        off = sh["seqlen_k"] - sh["seqlen_q"]
        bm = create_block_mask(lambda b, h, qi, ki: qi + off >= ki, None, None, sh["seqlen_q"],
                               sh["seqlen_k"], device=q.device)
    gqa = sh["heads_q"] != sh["heads_kv"]
    f = lambda: _flex_fn(q, k, v, block_mask=bm, enable_gqa=gqa)  # noqa: E731
    f()  # compile outside the timing
    return Runner(f, lambda: f().transpose(1, 2), note="forward only")


_fa3_mod = None


def load_fa3(path):
    global _fa3_mod
    if path:
        sys.path.insert(0, path)
    for name in ("flash_attn_interface", "flash_attn_3.flash_attn_interface", "hopper.flash_attn_interface"):
        try:
            _fa3_mod = importlib.import_module(name)
            return "%s (%s)" % (name, getattr(_fa3_mod, "__file__", "?"))
        except Exception:  # ImportError, or a broken build raising anything else
            continue
    return None


def setup_fa3(sh, inp):
    if _fa3_mod is None:
        raise NotImplementedError("official FA3 (flash_attn_interface) not importable")
    bwd = sh["bwd"]
    q, k, v = (_leaf(inp[n]) if bwd else inp[n] for n in "qkv")
    kw = dict(causal=sh["causal"])
    if sh["kind"] == "decode":
        kw["num_splits"] = 0

    def f():
        o = _fa3_mod.flash_attn_func(q, k, v, **kw)
        return o[0] if isinstance(o, tuple) else o  # older versions return (out, lse)
    r = Runner(f, f)
    if bwd:
        o = f()
        r.bwd = lambda: torch.autograd.grad(o, (q, k, v), inp["dout"], retain_graph=True)
        r.grads = r.bwd
    return r


def _rotate(x, cos, sin):
    """FA3's non-interleaved rotary on the last dim (rotary_dim = head dim) at one position's
    cos, sin (head dim / 2 each)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def setup_torch_step(sh, inp):
    """The decode step of decode_step shapes in PyTorch: q and the new k rotated at position
    cache_seqlens, the new k, v written into the paged cache, the sequences' pages gathered
    into a contiguous cache, SDPA (GQA) over it."""
    if sh["kind"] != "decode_step":
        raise NotImplementedError("torch_step runs the decode step shapes only")
    b, sk, hkv, d = sh["batch"], sh["seqlen_k"], sh["heads_kv"], sh["hdim"]
    page, pos = sh["page"], sh["seqlen_k"] - 1   # every sequence holds sk - 1 tokens before the step
    table = inp["page_table"].long()
    rows = torch.arange(b, device=table.device)
    cos, sin = inp["cos"][pos], inp["sin"][pos]

    def f():
        kc, vc = inp["k_cache"], inp["v_cache"]
        slot = table[rows, pos // page]
        kc[slot, pos % page] = _rotate(inp["k_new"][:, 0], cos, sin)
        vc[slot, pos % page] = inp["v_new"][:, 0]
        n = (sk + page - 1) // page
        kk = kc[table[:, :n]].reshape(b, n * page, hkv, d)[:, :sk]
        vv = vc[table[:, :n]].reshape(b, n * page, hkv, -1)[:, :sk]
        qr = _rotate(inp["q"], cos, sin)
        o = F.scaled_dot_product_attention(qr.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                           enable_gqa=sh["heads_q"] != hkv)
        return o.transpose(1, 2)
    return Runner(f, f)


def sinks_reference(sh, inp, sinks):
    """out and (dq, dk, dv) of attention with sinks (one logit per query head joining every row's
    softmax denominator; None: without) in float32 math, from (b, s, h, d) inputs (heads_q ==
    heads_kv; causal: sq == sk)."""
    q, k, v = (inp[n].float().requires_grad_(True) for n in "qkv")
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(sh["hdim"])
    if sh["causal"]:
        sq = s.shape[-1]
        s = s.masked_fill(torch.ones(sq, sq, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if sinks is not None:
        s = torch.cat((s, sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)), dim=-1)
    p = torch.softmax(s, dim=-1)[..., :k.shape[1]]
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    grads = torch.autograd.grad(out, (q, k, v), inp["dout"].float()) if sh["bwd"] else None
    return out.detach(), grads


def chunked_reference(sh, inp):
    """The chunked prefill's output in float32, sequence by sequence (causal, bottom-right)."""
    outs = []
    cq, ck = inp["cu_q"].tolist(), inp["cu_k"].tolist()
    g = sh["heads_q"] // sh["heads_kv"]
    for i in range(sh["batch"]):
        q = inp["q"][cq[i]:cq[i + 1]].float()
        k = inp["k"][ck[i]:ck[i + 1]].float().repeat_interleave(g, dim=1)
        v = inp["v"][ck[i]:ck[i + 1]].float().repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(sh["hdim"])
        nq, nk = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(nk - nq + 1), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v))
    return torch.cat(outs)


def step_reference(sh, inp):
    """decode_step's output in float32 from the inputs as made (before any step ran)."""
    pos, g = sh["seqlen_k"] - 1, sh["heads_q"] // sh["heads_kv"]
    cos, sin = inp["cos"][pos].float(), inp["sin"][pos].float()
    k = torch.cat((inp["k"][:, :pos].float(), _rotate(inp["k_new"].float(), cos, sin)), dim=1)
    v = torch.cat((inp["v"][:, :pos].float(), inp["v_new"].float()), dim=1)
    q = _rotate(inp["q"].float(), cos, sin)
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(sh["hdim"])
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


SETUP = {"fa3c": setup_fa3c, "fa3c_torch": setup_fa3c_torch, "cudnn": _sdpa_setup("cudnn"),
         "fa2": _sdpa_setup("fa2"), "mem_eff": _sdpa_setup("mem_eff"), "math": _sdpa_setup("math"),
         "flex": setup_flex, "fa3": setup_fa3, "torch_step": setup_torch_step, "fa3c_nosink": setup_fa3c_nosink,
         "fa3c_fp8_call": _setup_fa3c_fp8_call(False), "fa3c_fp8_blocks": _setup_fa3c_fp8_call(True)}


# ---- checks ------------------------------------------------------------------------------

def compare(got, want):
    got, want = got.float(), want.float()
    diff = (got - want).abs()
    return (diff.max().item(), (diff.norm() / want.norm().clamp_min(1e-30)).item(), want.abs().max().item())


def fwd_ok(err, rel, ref_max, fp8):
    # bf16 implementations of the same attention differ by a few ulps (~4e-3 at |x| ~ 1);
    # garbage is off by O(1). fp8 quantizes P too, so it gets a wider band.
    if fp8:
        return rel < 5e-2
    return rel < 2e-2 and err <= 2e-2 + 1e-2 * ref_max


def bwd_ok(err, rel, ref_max):
    return rel < 5e-2 and err <= 1e-1 * ref_max + 1e-2


def classify(e):
    if isinstance(e, fa3c.Fa3cError):
        return ("unsupported" if e.status == fa3c.STATUS_NOT_SUPPORTED else "error"), str(e)
    if isinstance(e, NotImplementedError):
        return "skipped", str(e)
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "oom", str(e).split("\n")[0]
    return "error", "%s: %s" % (type(e).__name__, str(e).split("\n")[0])


# ---- one shape -----------------------------------------------------------------------------

def make_chunked_inputs(sh, device):
    """Packed queries (total_q, hq, d) and keys (total_k, hkv, d) of chunked_lengths, with
    cu_seqlens; with a page size also the keys as a paged cache (pages shuffled over the pool)."""
    b, hq, hkv, d = sh["batch"], sh["heads_q"], sh["heads_kv"], sh["hdim"]
    dt = torch.float16 if sh["dtype"] == "fp16" else torch.bfloat16
    qs, ks = chunked_lengths(b, sh["seqlen_q"], sh["seqlen_k"])
    cu = lambda n: torch.tensor([0] + list(itertools.accumulate(n)), device=device, dtype=torch.int32)  # noqa: E731
    inp = dict(q=torch.randn(sum(qs), hq, d, device=device, dtype=dt), k=torch.randn(sum(ks), hkv, d, device=device,
               dtype=dt), v=torch.randn(sum(ks), hkv, d, device=device, dtype=dt), cu_q=cu(qs), cu_k=cu(ks), dout=None,
               deq=None)
    page = sh["page"]
    if page:
        n = (max(ks) + page - 1) // page
        table = torch.randperm(b * n, device=device).view(b, n)
        kc = torch.zeros(b * n, page, hkv, d, device=device, dtype=dt)
        vc = torch.zeros(b * n, page, hkv, d, device=device, dtype=dt)
        for i, (k0, ki) in enumerate(zip(inp["cu_k"].tolist(), ks)):
            pad = n * page - ki
            kc[table[i]] = F.pad(inp["k"][k0:k0 + ki], (0, 0, 0, 0, 0, pad)).view(n, page, hkv, d)
            vc[table[i]] = F.pad(inp["v"][k0:k0 + ki], (0, 0, 0, 0, 0, pad)).view(n, page, hkv, d)
        inp.update(k_cache=kc, v_cache=vc, page_table=table.to(torch.int32),
                   seqlens=torch.tensor(ks, device=device, dtype=torch.int32))
    return inp


def make_inputs(sh, device):
    if sh["kind"] == "chunked":
        return make_chunked_inputs(sh, device)
    b, sq, sk, hq, hkv, d = (sh[n] for n in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "hdim"))
    dv = sh.get("hdim_v", d)
    dt = torch.float16 if sh["dtype"] == "fp16" else torch.bfloat16   # fp8: made from bf16
    q = torch.randn(b, sq, hq, d, device=device, dtype=dt)
    k = torch.randn(b, sk, hkv, d, device=device, dtype=dt)
    v = torch.randn(b, sk, hkv, dv, device=device, dtype=dt)
    dout = torch.randn(b, sq, hq, dv, device=device, dtype=dt) if sh["bwd"] else None
    inp = dict(q=q, k=k, v=v, dout=dout, deq=None)
    if sh["dtype"] == "fp8":
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        inp.update(q=q8, k=k8, v=v8, deq=tuple(x.to(dt) for x in (q8, k8, v8)))
    if sh.get("page"):
        # k, v as a paged cache: each sequence's pages scattered over a shuffled pool
        page, filled = sh["page"], sk - 1 if sh["kind"] == "decode_step" else sk
        n = (sk + page - 1) // page
        table = torch.randperm(b * n, device=device).view(b, n)
        pad = n * page - sk
        kc = torch.empty(b * n, page, hkv, d, device=device, dtype=dt)
        vc = torch.empty(b * n, page, hkv, dv, device=device, dtype=dt)
        kc[table] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(b, n, page, hkv, d)
        vc[table] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(b, n, page, hkv, dv)
        inp.update(k_cache=kc, v_cache=vc, page_table=table.to(torch.int32),
                   seqlens=torch.full((b,), filled, device=device, dtype=torch.int32))
    if sh["kind"] == "sinks":   # one logit per query head
        inp.update(sinks=torch.randn(hq, device=device, dtype=torch.float32))
    if sh["kind"] == "decode_step":   # one new token per sequence, and rotary tables of sk rows
        ang = torch.arange(sk, device=device, dtype=torch.float32)[:, None] * \
            (10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))[None, :]
        inp.update(k_new=torch.randn(b, 1, hkv, d, device=device, dtype=dt),
                   v_new=torch.randn(b, 1, hkv, dv, device=device, dtype=dt),
                   cos=torch.cos(ang).to(dt), sin=torch.sin(ang).to(dt))
    return inp


def run_shape(sh, impls, timer, log, deadline):
    inp = make_inputs(sh, DEVICE)
    rows = []

    def row(impl, direction, status, **kw):
        r = dict(shape={k: sh[k] for k in ("kind", "batch", "seqlen_q", "seqlen_k", "heads_q",
                                           "heads_kv", "hdim", "hdim_v", "causal", "dtype", "page")},
                 impl=impl, dir=direction, status=status)
        r.update(kw)
        rows.append(r)
        log(r)
        return r

    # reference: the first SDPA backend that runs this shape (on dequantized inputs for fp8)
    ref_name, ref_out, ref_grads = None, None, None
    ref_sh = dict(sh, dtype="bf16") if sh["dtype"] == "fp8" else sh
    ref_inp = dict(inp, q=inp["deq"][0], k=inp["deq"][1], v=inp["deq"][2]) if inp["deq"] else inp
    if sh["kind"] == "decode_step":
        ref_name, ref_out = "float32 step", step_reference(sh, inp)
    if sh["kind"] == "chunked":
        ref_name, ref_out = "float32 per sequence", chunked_reference(sh, inp)
    impls = [i for i in impls if i in KIND_IMPLS.get(sh["kind"], IMPL_ORDER) and sh["kind"] in ONLY_FOR.get(i, (sh["kind"],))]
    if "fa3c" in impls and BASE_IMPL.get(sh["kind"]) not in (None, *impls):
        impls.append(BASE_IMPL[sh["kind"]])   # these rows' ratio is to their own baseline: run it too
    sink_refs = {}
    if sh["kind"] == "sinks":   # each implementation against its own math: with the sinks, or without
        for name in impls:
            sink_refs[name] = sinks_reference(sh, inp, inp["sinks"] if name == "fa3c" else None)
        ref_name, ref_out = "float32 math", True
    for name in REF_ORDER if ref_out is None else ():
        try:
            r = SETUP[name](ref_sh, ref_inp)
            with r.ctx():
                ref_out = r.out().detach()
                ref_grads = [g.detach() for g in r.grads()] if sh["bwd"] else None
            ref_name = name
            break
        except Exception:
            continue

    for name in impls:
        if sink_refs:
            ref_out, ref_grads = sink_refs[name]
        # --no-fwd: the forward runs for the backward's inputs and its check, but gets no row of
        # its own, not even an error's (the backward's row says it).
        fwd_row = row if sh.get("time_fwd", True) else (lambda *a, **k: None)
        t_left = deadline - time.time()
        if t_left < 0:
            fwd_row(name, "fwd", "skipped", note="time budget spent")
            if sh["bwd"] and not sh.get("time_fwd", True):
                row(name, "bwd", "skipped", note="time budget spent")
            continue
        try:
            r = SETUP[name](sh, inp)
        except Exception as e:
            st, msg = classify(e)
            fwd_row(name, "fwd", st, note=msg[:300])
            if sh["bwd"]:
                row(name, "bwd", st, note=msg[:300])
            continue
        # forward: check, then time
        try:
            with r.ctx():
                out = r.out()
            if ref_out is not None:
                err, rel, mx = compare(out, ref_out)
                if not fwd_ok(err, rel, mx, sh["dtype"] == "fp8"):
                    fwd_row(name, "fwd", "FAILED", max_err=err, rel_l2=rel, ref=ref_name, note=r.note)
                    if sh["bwd"]:
                        row(name, "bwd", "skipped", note="forward FAILED")
                    continue
            else:
                err = rel = None   # no reference ran for this shape: time it, but say so
            if sh.get("time_fwd", True):   # --no-fwd: checked above (the backward needs it), not timed
                with r.ctx():
                    ms = timer(r.fwd)
                row(name, "fwd", "ok" if ref_out is not None else "unchecked", ms=ms, tflops=sh["flops"] / ms / 1e9,
                    gbps=sh["bytes"] / ms / 1e6, max_err=err, rel_l2=rel, ref=ref_name, note=r.note)
        except Exception as e:
            st, msg = classify(e)
            fwd_row(name, "fwd", st, note=msg[:300])
            if sh["bwd"]:
                row(name, "bwd", "skipped", note="forward did not run")
            continue
        if not sh["bwd"]:
            continue
        if r.bwd is None:
            row(name, "bwd", "skipped", note=r.note or "no backward")
            continue
        try:
            with r.ctx():
                grads = r.grads()
            err = rel = None
            if ref_grads is not None:
                worst = None
                for gname, g, w in zip(("dq", "dk", "dv"), grads, ref_grads):
                    e_, rl, mx = compare(g, w)
                    if not bwd_ok(e_, rl, mx):
                        worst = (gname, e_, rl)
                    err = max(err or 0.0, e_)
                    rel = max(rel or 0.0, rl)
                if worst:
                    row(name, "bwd", "FAILED", max_err=err, rel_l2=rel, ref=ref_name,
                        note="%s max err %.3g rel L2 %.3g" % worst)
                    continue
            with r.ctx():
                ms = timer(r.bwd)
            fl = 2.5 * sh["flops"]
            row(name, "bwd", "ok" if ref_out is not None else "unchecked", ms=ms, tflops=fl / ms / 1e9, max_err=err, rel_l2=rel, ref=ref_name,
                note=r.note)
        except Exception as e:
            st, msg = classify(e)
            row(name, "bwd", st, note=msg[:300])
    del inp
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


# ---- reporting -----------------------------------------------------------------------------

def load_targets(peers_dir):
    """{(dir, hdim, causal, seqlen): official FA3's ratio to cuDNN} from stored runs of the official
    FA3 (--peers DIR: its JSON files, the runs bench/PEERS.md tabulates), for PEERS.md's bar:
    fa3c/cuDNN >= max(1, FA3's ratio) forward and >= FA3's ratio backward. Empty without them."""
    out = {}
    if not peers_dir:
        return out
    for fname, key, direction in (("h200-2026-12-02-fa3-official.json", "summary_bf16", "fwd"),
                                  ("h200-2026-12-02-fa3-official-bwd.json", "summary_bf16_bwd", "bwd")):
        try:
            with open(os.path.join(peers_dir, fname)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for r in data.get(key, []):
            ratio = r.get("ratio_fa3_rawop_over_cudnn_mean", r.get("ratio_fa3_api_over_cudnn_mean"))
            if ratio:
                out[(direction, r["hdim"], bool(r["causal"]), r["seqlen"])] = ratio
    return out


def _key(r):
    s = r["shape"]
    return (s["kind"], s["hdim"], s["causal"], s["seqlen_q"], s["seqlen_k"], s["batch"], s["heads_q"], s["heads_kv"],
            s.get("page", 0))


def _cell(r, base, metric):
    if r is None:
        return "-"
    if r["status"] == "unchecked":   # timed, but no reference ran to check it
        return ("%.0f" % r[metric]) + " (unchecked)"
    if r["status"] != "ok":
        if r["status"] == "FAILED":
            return "FAILED (err %.2g)" % (r.get("max_err") or float("nan"))
        return r["status"]
    v = r[metric]
    if base is not None and base.get("status") == "ok" and base[metric]:
        return "%.0f (%.2f)" % (v, v / base[metric]) if v >= 10 else "%.3g (%.2f)" % (v, v / base[metric])
    return "%.0f" % v if v >= 10 else "%.3g" % v


def markdown(results, impls, targets=None):
    targets = targets or {}
    lines = []
    by = {}
    for r in results["rows"]:
        by.setdefault((r["shape"]["kind"], r["dir"]), {}).setdefault(_key(r), {})[r["impl"]] = r
    env = results["env"]
    lines.append("## fa3c benchmark, %s" % env["date"])
    lines.append("")
    lines.append("%s; torch %s, cuDNN %s; fa3c %s (%s); official FA3: %s" % (
        env["gpu"], env["torch"], env["cudnn"], env["fa3c"], env["fa3c_library"], env["fa3"] or "not available"))
    lines.append("Cells: TFLOPS (ratio to cuDNN in this run); decode: GB/s (ratio). fa3c = C ABI call, "
                 "fa3c_torch = fa3c.flash_attn_func via the torch custom op.")
    dt = next((r["shape"]["dtype"] for r in results["rows"] if r["shape"]["kind"] in ("grid", "gqa")), "bf16")
    titles = [("grid", "fwd", "Forward, %s, 16k tokens, hidden 2048" % dt, "tflops"),
              ("grid", "bwd", "Backward, %s, 16k tokens, hidden 2048" % dt, "tflops"),
              ("gqa", "fwd", "GQA prefill forward, %s (32 q heads / 8 kv heads)" % dt, "tflops"),
              ("gqa", "bwd", "GQA prefill backward, %s" % dt, "tflops"),
              ("mla", "fwd", "MLA prefill forward, %s (q, k head dim 192, v 128)" % dt, "tflops"),
              ("mla", "bwd", "MLA prefill backward, %s" % dt, "tflops"),
              ("decode", "fwd", "Decode (seqlen_q 1), GB/s of q, k, v, out", "gbps"),
              ("decode_paged", "fwd", "Decode from a paged cache (fa3c; ratio to its contiguous row above)", "gbps"),
              ("sinks", "fwd", "Attention sinks, forward, %s (ratio to the same call without sinks)" % dt, "tflops"),
              ("sinks", "bwd", "Attention sinks, backward (dsinks included), %s" % dt, "tflops"),
              ("decode_step", "fwd", "Decode step: append one token's k, v to a paged cache (pages of 16), rotary "
               "on q and k, attention (as users call them; ratio to the same step in PyTorch)", "gbps"),
              ("chunked", "fwd", "Chunked prefill, %s: every fourth sequence a chunk of sq queries, the others one "
               "decode token, sk - 37 i keys for sequence i (fa3c; ratio to the packed contiguous keys, page 0)" % dt,
               "tflops"),
              ("fp8", "fwd", "fp8 e4m3 forward (peers: bf16 on the dequantized values; fa3c_fp8_call and "
               "fa3c_fp8_blocks: fa3c.fp8_attention from those bf16 values, quantization with the rotation "
               "included, per-head and per-block scales)", "tflops")]
    for kind, direction, title, metric in titles:
        table = by.get((kind, direction))
        if not table:
            continue
        base_impl = BASE_IMPL.get(kind, "cudnn")
        cols = [i for i in impls + [base_impl] * (base_impl not in impls) if any(i in v for v in table.values())]
        with_target = kind == "grid" and any(k[0] == direction for k in targets)
        paged = kind in ("decode_paged", "decode_step", "chunked")
        lines += ["", "### " + title, ""]
        lines.append(("| page " if paged else "") + "| hdim | causal | b | sq | sk | hq/hkv | " + " | ".join(cols) +
                     (" | target | met |" if with_target else " |"))
        lines.append("|" + "---|" * (6 + paged + len(cols) + (2 if with_target else 0)))
        ratios = []
        met = []
        for key in sorted(table):
            rs = table[key]
            s = next(iter(rs.values()))["shape"]
            base = rs.get(base_impl)
            if kind == "decode_paged":   # fa3c on the same cache, contiguous
                base = by.get(("decode", direction), {}).get(("decode",) + key[1:-1] + (0,), {}).get("fa3c")
            if kind == "chunked":   # fa3c on the same keys, packed contiguously (the page-0 row)
                base = table.get(key[:-1] + (0,), {}).get("fa3c") if key[-1] else None
            f = rs.get("fa3c")
            if f and base and f["status"] == "ok" and base["status"] == "ok":
                ratios.append(f[metric] / base[metric])
            tail = ""
            if with_target:
                fa3_ratio = targets.get((direction, s["hdim"], s["causal"], s["seqlen_q"]))
                if fa3_ratio is None:
                    tail = " - | - |"
                else:
                    # PEERS.md's targets: forward >= max(1, FA3's ratio), backward >= FA3's ratio
                    tgt = max(1.0, fa3_ratio) if direction == "fwd" else fa3_ratio
                    ok = bool(f and base and f["status"] == "ok" and base["status"] == "ok"
                              and f[metric] / base[metric] >= tgt)
                    met.append(ok)
                    tail = " %.2f | %s |" % (tgt, "yes" if ok else "no")
            lines.append(("| %d " % s["page"] if paged else "") + "| %d | %s | %d | %d | %d | %d/%d | %s |%s" % (
                s["hdim"], "yes" if s["causal"] else "no", s["batch"], s["seqlen_q"], s["seqlen_k"],
                s["heads_q"], s["heads_kv"], " | ".join(_cell(rs.get(i), base, metric) for i in cols),
                tail or ""))
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            lines.append("")
            lines.append("fa3c / %s: geometric mean %.3f, min %.3f, max %.3f over %d shapes%s"
                         % ({"cudnn": "cuDNN", "torch_step": "the PyTorch step",
                                "fa3c_nosink": "fa3c without sinks"}.get(base_impl, base_impl)
                            if kind not in ("decode_paged", "chunked") else "fa3c contiguous", gm, min(ratios), max(ratios), len(ratios),
                            "; PEERS.md bar met on %d of %d" % (sum(met), len(met)) if met else ""))
    bad = [r for r in results["rows"] if r["status"] in ("FAILED", "error")]
    if bad:
        lines += ["", "### Problems", ""]
        for r in bad:
            s = r["shape"]
            lines.append("- %s %s %s hdim%d causal=%s sq%d sk%d: %s %s" % (
                r["impl"], r["dir"], s["kind"], s["hdim"], s["causal"], s["seqlen_q"], s["seqlen_k"],
                r["status"], r.get("note") or "err %.3g" % (r.get("max_err") or 0)))
    uns = sorted({(r["impl"], r["dir"], (r.get("note") or "")[:120]) for r in results["rows"]
                  if r["status"] == "unsupported"})
    if uns:
        lines += ["", "Unsupported: " + "; ".join("%s %s: %s" % u for u in uns)]
    return "\n".join(lines) + "\n"


def plot(results, impls, path, direction):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot", flush=True)
        return
    rows = [r for r in results["rows"] if r["shape"]["kind"] == "grid" and r["dir"] == direction and r["status"] == "ok"]
    if not rows:
        return
    hdims = sorted({r["shape"]["hdim"] for r in rows})
    fig, axes = plt.subplots(2, len(hdims), figsize=(5 * len(hdims), 8), squeeze=False)
    for ci, d in enumerate(hdims):
        for ri, causal in enumerate((False, True)):
            ax = axes[ri][ci]
            for impl in impls:
                pts = sorted((r["shape"]["seqlen_q"], r["tflops"]) for r in rows
                             if r["impl"] == impl and r["shape"]["hdim"] == d and r["shape"]["causal"] == causal)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                            linewidth=2.5 if impl == "fa3c" else 1.2)
            ax.set_xscale("log", base=2)
            ax.set_title("%s hdim %d, %s" % (direction, d, "causal" if causal else "non-causal"))
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOPS")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("%s: %s" % (results["env"]["gpu"], direction))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ------------------------------------------------------------------------------------

def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "uncommitted"
    except Exception:
        return "unknown"


DEVICE = "cuda"


def main():
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a handful of shapes, no flex (< 2 minutes)")
    ap.add_argument("--out", default=os.path.join(REPO, "build-bench"), help="output folder (default build-bench/)")
    ap.add_argument("--impls", default=",".join(IMPL_ORDER), help="comma list of: " + ",".join(IMPL_ORDER))
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--flex", choices=("none", "some", "all"), default="some",
                    help="FlexAttention shapes: none, some (seqlen 8k + GQA; default), all")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="of the grid, GQA and MLA shapes (fp8 shapes stay e4m3; decode stays bf16)")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--no-fwd", action="store_true",
                    help="time only the backward of the grid, GQA and MLA shapes (the forward still runs once)")
    ap.add_argument("--no-decode", action="store_true", help="no decode, decode-step or chunked-prefill shapes")
    ap.add_argument("--page-sizes", default="1,16,64",
                    help="page sizes of the paged-cache decode rows (comma list; empty: none)")
    ap.add_argument("--no-gqa", action="store_true")
    ap.add_argument("--no-mla", action="store_true", help="no MLA prefill shapes (q, k 192 / v 128)")
    ap.add_argument("--no-sinks", action="store_true", help="no attention-sink shapes")
    ap.add_argument("--no-fp8", action="store_true")
    ap.add_argument("--fa3-path", default=os.environ.get("FA3_PATH"),
                    help="folder to put on sys.path for the official flash_attn_interface")
    ap.add_argument("--peers", default=None,
                    help="folder with stored official-FA3 runs (JSON), for the target columns (bench/PEERS.md)")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds; shapes after this are recorded as skipped (default 540: one 10-minute device call)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke test of this script on tiny shapes (no GPU)")
    args = ap.parse_args()
    args.hdims = [int(x) for x in args.hdims.split(",")]
    args.seqlens = [int(x) for x in args.seqlens.split(",")]
    args.page_sizes = [int(x) for x in args.page_sizes.split(",") if x]
    DEVICE = args.device
    t0 = time.time()
    deadline = t0 + args.budget
    os.makedirs(args.out, exist_ok=True)
    impls = [i for i in args.impls.split(",") if i]
    for i in impls:
        if i not in SETUP:
            ap.error("unknown implementation %r" % i)
    if args.device == "cpu":
        impls = [i for i in impls if i in ("fa3c", "fa3c_torch", *ONLY_FOR)]   # fa3c's own calls and baselines
    fa3_desc = load_fa3(args.fa3_path) if "fa3" in impls else None
    if fa3_desc is None and "fa3" in impls:
        impls.remove("fa3")  # not importable: no column of "skipped"
    if (args.quick or args.flex == "none") and "flex" in impls:
        impls.remove("flex")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench.py: no CUDA device (use --device cpu for a smoke test)")
        gpu = torch.cuda.get_device_name()
    else:
        gpu = "cpu (smoke test)"
    try:
        lib, libver = fa3c.library_path(), fa3c.version()
        cuda_ok = fa3c.cuda_available()
    except OSError as e:
        sys.exit("bench.py: %s" % e)
    results = dict(env=dict(date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), gpu=gpu,
                            torch=torch.__version__,
                            cudnn=torch.backends.cudnn.version() if args.device == "cuda" else None,
                            fa3c=libver, fa3c_library=lib, fa3c_cuda_available=cuda_ok,
                            commit=git_commit(), fa3=fa3_desc, quick=args.quick,
                            argv=sys.argv[1:]), rows=[])
    print("bench: %s, torch %s, fa3c %s at %s (CUDA backend usable: %s), official FA3: %s"
          % (gpu, torch.__version__, libver, lib, cuda_ok, fa3_desc or "no"), flush=True)

    def log(r):
        s = r["shape"]
        extra = ("%.3f ms %.1f TFLOPS" % (r["ms"], r["tflops"])) if r["status"] == "ok" else (r.get("note") or "")
        err = (" err %.2g" % r["max_err"]) if r.get("max_err") is not None else ""
        print("%-6s %-3s d%-3d %-5s b%-3d sq%-6d sk%-6d h%d/%d %-10s %-4s %-11s %s%s" % (
            s["kind"] + ("/p%d" % s["page"] if s.get("page") else ""), s["dtype"], s["hdim"], "causal" if s["causal"] else "", s["batch"], s["seqlen_q"],
            s["seqlen_k"], s["heads_q"], s["heads_kv"], r["impl"], r["dir"], r["status"], extra, err),
            flush=True)

    shapes = make_shapes(args)
    if args.no_bwd and args.no_fwd:
        ap.error("--no-bwd and --no-fwd leave nothing to time")
    if args.no_bwd:
        for sh in shapes:
            sh["bwd"] = False
    if args.no_fwd:
        shapes = [dict(sh, time_fwd=False) for sh in shapes if sh["bwd"]]
    elif not args.no_bwd:
        # Two passes: every shape's forwards, then every backward (its forward run once for the
        # check, not timed), as --no-bwd and --no-fwd would. Timed right after its own forward,
        # cuDNN's backward measured up to 13% slower than alone or than the peers measured on
        # their own (bench/RESULTS.md runs 127-128); fa3c's did not move.
        shapes = [dict(sh, bwd=False) for sh in shapes] + [dict(sh, time_fwd=False) for sh in shapes if sh["bwd"]]
    timer = Timer(args.device, args.quick)
    path_json = os.path.join(args.out, "results.json")
    for sh in shapes:
        try:
            results["rows"] += run_shape(sh, impls, timer, log, deadline)
        except Exception:  # a bug in this script or a broken context: keep the other shapes
            traceback.print_exc()
            results["rows"].append(dict(shape={k: sh[k] for k in ("kind", "batch", "seqlen_q", "seqlen_k",
                                                                   "heads_q", "heads_kv", "hdim", "hdim_v", "causal",
                                                                   "dtype", "page")},
                                        impl="*", dir="*", status="error", note=traceback.format_exc()[-300:]))
        results["elapsed_s"] = time.time() - t0
        with open(path_json, "w") as f:
            json.dump(results, f, indent=1)
    md = markdown(results, impls, load_targets(args.peers))
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    plot(results, impls, os.path.join(args.out, "plot.png"), "fwd")
    plot(results, impls, os.path.join(args.out, "plot_bwd.png"), "bwd")
    print("\nwrote %s/{results.json,results.md,plot.png,plot_bwd.png} in %.0f s\n" % (args.out, time.time() - t0))
    print(md)


if __name__ == "__main__":
    main()
