"""torch front end: CUDA tensors run on the CUDA backend on the current stream,
CPU tensors on the CPU backend.

The forward and backward are torch.library custom ops (fa3c::fwd, fa3c::bwd)
with fake implementations, so torch.compile traces through them without a
graph break, and autograd is attached with register_autograd.
"""
import contextlib
from typing import Optional, Tuple

import torch

from . import _core, _lib
from ._core import bad

_TO_CODE = {
    torch.float32: _lib.DTYPE_FP32,
    torch.float16: _lib.DTYPE_FP16,
    torch.bfloat16: _lib.DTYPE_BF16,
}
if hasattr(torch, "float8_e4m3fn"):
    _TO_CODE[torch.float8_e4m3fn] = _lib.DTYPE_E4M3
_FROM_CODE = {c: t for t, c in _TO_CODE.items()}


def _out_dtype(dt):
    return torch.bfloat16 if dt == getattr(torch, "float8_e4m3fn", None) else dt


class TorchOps:
    @staticmethod
    def prepare(x):
        # Like FA3, a non-unit stride on headdim forces a copy. Strides of 0
        # elsewhere (expand) pass through on the CPU, which broadcasts them; the
        # CUDA kernels read with TMA, which needs positive strides, so copy there.
        if x.stride(-1) != 1:
            return x.contiguous()
        if x.is_cuda and any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)):
            return x.contiguous()
        return x

    @staticmethod
    def ptr(x):
        return x.data_ptr()

    @staticmethod
    def shape(x):
        return tuple(int(s) for s in x.shape)

    @staticmethod
    def strides(x):
        return tuple(x.stride())

    @staticmethod
    def dtype_code(x):
        try:
            return _TO_CODE[x.dtype]
        except KeyError:
            raise TypeError("fa3c: unsupported dtype %s; use float32, float16, bfloat16 or "
                            "float8_e4m3fn" % x.dtype) from None

    @staticmethod
    def dtype_name(x):
        return str(x.dtype)

    @staticmethod
    def empty(shape, code, like):
        return torch.empty(shape, dtype=_FROM_CODE[code], device=like.device)

    @staticmethod
    def zeros_f32(n, like):
        return torch.zeros((n,), dtype=torch.float32, device=like.device)

    @staticmethod
    def int32(x, like):
        if x is None:
            return None
        if x.device != like.device:
            raise bad("cu_seqlens / seqused_q / seqused_k / page_table must be on %s like q (got %s)"
                      % (like.device, x.device))
        if x.dtype not in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8):
            raise bad("cu_seqlens / seqused_q / seqused_k / page_table must be integer tensors (got %s)" % x.dtype)
        return x.to(torch.int32).contiguous()

    @staticmethod
    def max_diff(cu):
        return int((cu[1:] - cu[:-1]).max().item()) if cu.shape[0] > 1 else 0

    @staticmethod
    def descale(d, shape, like, name):
        if d is None:
            return None
        if not isinstance(d, torch.Tensor):
            d = torch.tensor(d, dtype=torch.float32, device=like.device)
        try:
            return d.to(device=like.device, dtype=torch.float32).expand(shape).contiguous()
        except RuntimeError:
            raise bad("%s must broadcast to %s (got shape %s)"
                      % (name, shape, tuple(d.shape)))

    @staticmethod
    def contiguous_f32(x):
        return x.to(torch.float32).contiguous()


OPS = TorchOps()


def _launch(q):
    """(backend, stream pointer, device guard) for tensors living where q lives."""
    if q.device.type == "cuda":
        return "cuda", torch.cuda.current_stream(q.device).cuda_stream, torch.cuda.device(q.device)
    if q.device.type == "cpu":
        return "cpu", None, contextlib.nullcontext()
    raise bad("fa3c: tensors must be on a CUDA device or the CPU (got %s)" % q.device)


# ---- custom ops -----------------------------------------------------------------
# One fwd op for every entry point (fixed, varlen, kv cache); unused optional
# tensors are None and max_seqlen_* are 0 when not varlen.

def _fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, q_descale, k_descale,
              v_descale, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, num_splits, deterministic, sinks=None, seqused_q=None,
              leftpad_k=None, qv=None):
    """The forward itself: what the fa3c::fwd op runs, and what eager calls that need no
    gradient run directly (the op's dispatch costs tens of microseconds per call)."""
    backend, stream, guard = _launch(q)
    with guard:
        return _core.forward(
            OPS, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q if cu_seqlens_q is not None else None,
            max_seqlen_k=max_seqlen_k if cu_seqlens_k is not None else None,
            seqused_k=seqused_k, page_table=page_table, softmax_scale=softmax_scale,
            causal=causal, window_size=(window_left, window_right), softcap=softcap,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            num_splits=num_splits, backend=backend, stream=stream, sinks=sinks, seqused_q=seqused_q,
            leftpad_k=leftpad_k, qv=qv)


@torch.library.custom_op("fa3c::fwd", mutates_args=())
def fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
           seqused_k: Optional[torch.Tensor], page_table: Optional[torch.Tensor],
           q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
           v_descale: Optional[torch.Tensor],
           max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
           window_left: int, window_right: int, softcap: float, num_splits: int,
           deterministic: bool, sinks: Optional[torch.Tensor],
           seqused_q: Optional[torch.Tensor] = None,
           leftpad_k: Optional[torch.Tensor] = None,
           qv: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, q_descale,
                     k_descale, v_descale, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, num_splits, deterministic, sinks, seqused_q,
                     leftpad_k, qv)


@fwd_op.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, q_descale, k_descale,
              v_descale, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, num_splits, deterministic, sinks, seqused_q=None, leftpad_k=None,
              qv=None):
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=_out_dtype(q.dtype))
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("fa3c::bwd", mutates_args=())
def bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           out: torch.Tensor, lse: torch.Tensor,
           cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
           seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
           softmax_scale: float, causal: bool, window_left: int, window_right: int,
           softcap: float, deterministic: bool, sinks: Optional[torch.Tensor],
           seqused_q: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks); dsinks is empty without sinks."""
    backend, stream, guard = _launch(q)
    with guard:
        grads = _core.backward(
            OPS, dout, q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q if cu_seqlens_q is not None else None,
            max_seqlen_k=max_seqlen_k if cu_seqlens_k is not None else None,
            seqused_k=seqused_k, softmax_scale=softmax_scale, causal=causal,
            window_size=(window_left, window_right), softcap=softcap,
            deterministic=deterministic, backend=backend, stream=stream, sinks=sinks,
            seqused_q=seqused_q)
    if sinks is None:
        grads = tuple(grads) + (q.new_empty((0,), dtype=torch.float32),)
    return tuple(grads)


@bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
              max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
              deterministic, sinks, seqused_q=None):
    dsinks = q.new_empty((0 if sinks is None else sinks.shape[0],), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output):
    inputs = tuple(inputs) + (None,) * (23 - len(inputs))   # seqused_q, leftpad_k, qv left at their defaults
    (q, k, v, cu_q, cu_k, used_k, page_table, qd, kd, vd, msq, msk, scale, causal, wl, wr,
     softcap, num_splits, deterministic, sinks, used_q, leftpad_k, qv) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used_k, sinks, used_q)
    ctx.paged = page_table is not None
    ctx.leftpad = leftpad_k is not None
    ctx.qv = qv is not None
    ctx.fp8 = qd is not None or q.dtype == getattr(torch, "float8_e4m3fn", None)
    ctx.args = (msq, msk, scale, causal, wl, wr, softcap, deterministic)


def _backward(ctx, dout, dlse):
    # The gradient through lse (dlse) is ignored, as in FA3: lse is returned
    # for inspection and merging, not as a differentiable output.
    q, k, v, out, lse, cu_q, cu_k, used_k, sinks, used_q = ctx.saved_tensors
    if ctx.paged:
        raise NotImplementedError("fa3c: no backward through a paged KV cache (page_table)")
    if ctx.leftpad:
        raise NotImplementedError("fa3c: no backward through a left-padded KV cache (cache_leftpad), as in FA3")
    if ctx.fp8:
        raise NotImplementedError("fa3c: float8_e4m3fn attention is forward only")
    if ctx.qv:
        raise NotImplementedError("fa3c: no backward through qv (absorbed decode's second query) yet")
    msq, msk, scale, causal, wl, wr, softcap, deterministic = ctx.args
    dq, dk, dv, dsinks = torch.ops.fa3c.bwd(dout, q, k, v, out, lse, cu_q, cu_k, used_k, msq, msk,
                                            scale, causal, wl, wr, softcap, deterministic, sinks, used_q)
    return (dq, dk, dv) + (None,) * 16 + (dsinks.to(sinks.dtype) if sinks is not None else None, None, None, None)


fwd_op.register_autograd(_backward, setup_context=_setup_context)


# ---- entry points used by fa3c.interface ------------------------------------------

def _descales(q, k, q_descale, k_descale, v_descale, batch, heads_kv):
    out = []
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None:
            out.append(None)
            continue
        if not isinstance(d, torch.Tensor):
            d = torch.tensor(d, dtype=torch.float32, device=q.device)
        out.append(d.to(device=q.device, dtype=torch.float32).expand(batch, heads_kv).contiguous())
    return out


class _Attention(torch.autograd.Function):
    """The differentiable entry point. Same math as fwd_op's register_autograd, but a
    plain autograd.Function costs about half the per-call Python of the custom op's
    generated autograd wrapper; dynamo traces it (and the ops inside) with fullgraph."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, used_k, page_table, qd, kd, vd, msq, msk, scale, causal,
                wl, wr, softcap, num_splits, deterministic, sinks, used_q, leftpad_k, qv):
        out, lse = torch.ops.fa3c.fwd(q, k, v, cu_q, cu_k, used_k, page_table, qd, kd, vd, msq, msk,
                                      scale, causal, wl, wr, softcap, num_splits, deterministic, sinks,
                                      used_q, leftpad_k, qv)
        _setup_context(ctx, (q, k, v, cu_q, cu_k, used_k, page_table, qd, kd, vd, msq, msk, scale,
                             causal, wl, wr, softcap, num_splits, deterministic, sinks, used_q, leftpad_k,
                             qv), (out, lse))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


def attention(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, seqused_k=None, page_table=None, softmax_scale=None,
              causal=False, window_size=(-1, -1), softcap=0.0, q_descale=None, k_descale=None,
              v_descale=None, num_splits=1, deterministic=False, sinks=None, seqused_q=None,
              leftpad_k=None, qv=None):
    """Differentiable attention through the custom ops. Returns (out, lse). sinks:
    (heads_q,) logits, differentiable. seqused_q: queries used per sequence; out and lse
    rows past them are not written, their dq rows are zeros. leftpad_k: rows of each
    sequence's KV cache before its first key (forward only). qv: FA3's, forward only."""
    if softmax_scale is None:   # with qv, FA3's 1/sqrt(headdim + headdim_v)
        softmax_scale = _core.default_scale(q.shape[-1] + (v.shape[-1] if qv is not None else 0))
    if cu_seqlens_q is not None and max_seqlen_q is None:
        max_seqlen_q = OPS.max_diff(cu_seqlens_q)
    if cu_seqlens_k is not None and max_seqlen_k is None:
        max_seqlen_k = OPS.max_diff(cu_seqlens_k)
    if q_descale is not None or k_descale is not None or v_descale is not None:
        batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else q.shape[0]
        qd, kd, vd = _descales(q, k, q_descale, k_descale, v_descale, batch, k.shape[-2])
    else:
        qd = kd = vd = None
    wl, wr = window_size
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks, dtype=torch.float32, device=q.device)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, qd, kd, vd,
            int(max_seqlen_q or 0), int(max_seqlen_k or 0), float(softmax_scale), bool(causal),
            int(wl), int(wr), float(softcap or 0.0), int(num_splits), bool(deterministic), sinks,
            seqused_q, leftpad_k, qv)
    needs_grad = (q.requires_grad or k.requires_grad or v.requires_grad or (sinks is not None and sinks.requires_grad)
                  or (qv is not None and qv.requires_grad))
    if torch.is_grad_enabled() and needs_grad:
        return _Attention.apply(*args)
    if torch.compiler.is_compiling():
        return torch.ops.fa3c.fwd(*args)   # traced: the graph must see the op
    return _fwd_impl(*args)                 # eager, no autograd: skip the dispatcher


def to_int32_tensor(x, like):
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(x, dtype=torch.int32, device=like.device)
