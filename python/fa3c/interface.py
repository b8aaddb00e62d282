"""The FA3 `flash_attn_interface` functions, on fa3c.

Names, argument order, defaults and return values follow the official
FlashAttention-3 hopper/flash_attn_interface.py: its four attention functions,
flash_attn_combine and get_scheduler_metadata. Arguments fa3c has no
equivalent for raise NotImplementedError when set to a non-default value.
fa3c.flash_attn_interface gathers them into a module that can stand in for
FA3's (fa3c.install_flash_attn_interface).

q, k, v may be torch tensors (CUDA: CUDA backend, on the current stream;
CPU: CPU backend; differentiable), or any other array with __dlpack__ - numpy
(ml_dtypes for bfloat16 / float8_e4m3fn), CuPy, JAX - in CPU or CUDA memory
(forward only - use fa3c.backward for gradients; outputs of q's library, see
_arrays).
"""
import math
import sys

from . import _arrays, _core, _lib

_torch_mod = None


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch():
    global _torch_mod
    if _torch_mod is None:
        from . import _torch as m
        _torch_mod = m
    return _torch_mod


def _launch(q, backend=None):
    """(ops, stream, device guard, backend, finish) for a call on arrays like q: torch's
    front end for torch tensors, the array front end (DLPack) for anything else.
    finish, when not None, runs after each launch."""
    if _is_torch(q):
        be, stream, guard = _torch()._launch(q)
        return _torch().OPS, stream, guard, be if backend is None else backend, None
    ops = _arrays.ArrayOps(q)
    return ops, ops.stream, ops.guard(), ops.backend if backend is None else backend, ops.finish


def _unsupported(**kw):
    """NotImplementedError for FA3 arguments given a value fa3c cannot honour."""
    for name, (value, default) in kw.items():
        # Defaults are None or plain numbers, so arrays and tensors only ever meet None
        # (comparing them with != would be element-wise, or would sync a CUDA tensor).
        bad = value is not None if default is None else value != default
        if bad:
            shown = "a %s" % type(value).__name__ if hasattr(value, "shape") else repr(value)
            raise NotImplementedError("fa3c: %s=%s is not supported (only %r)" % (name, shown, default))


def _common_unsupported(attention_chunk, sm_margin):
    _unsupported(attention_chunk=(attention_chunk, 0), sm_margin=(sm_margin, 0))


def _array_attention(q, k, v, **kw):
    kw.pop("deterministic", None)   # the forward is deterministic
    return forward(q, k, v, **kw)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, s_aux=None):
    """Attention over (batch, seqlen, heads, headdim) q and (batch, seqlen_k, heads_kv, headdim)
    k, v (v may have a head dim of its own, headdim_v: out and dv take it; CPU backend for
    now). causal is bottom-right aligned; window_size=(left, right), -1 = unbounded;
    softcap > 0 applies softcap * tanh(score / softcap). pack_gqa is a tuning hint and is
    ignored. Returns out, or (out, softmax_lse) with return_attn_probs=True; softmax_lse is
    float32 (batch, heads, seqlen_q). s_aux (vLLM's name; not in FA3): attention sinks,
    one float32 logit per query head (heads,), differentiable (CPU, and CUDA in bf16/fp16).
    qv (batch, seqlen, heads, headdim_v), as FA3's: scores softmax_scale * (q k^T + qv v^T),
    the default scale then (headdim + headdim_v) ** -0.5 (absorbed MLA decode; CPU backend for
    now, forward only)."""
    _common_unsupported(attention_chunk, sm_margin)
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
              softcap=softcap, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
              num_splits=num_splits, deterministic=deterministic, sinks=s_aux, qv=qv)
    if _is_torch(q):
        out, lse = _torch().attention(q, k, v, **kw)
    else:
        out, lse = _array_attention(q, k, v, **kw)
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, s_aux=None):
    """Variable-length batches packed along the token axis: q is (total_q, heads, headdim),
    k and v (total_k, heads_kv, headdim), cu_seqlens_* int32 (batch + 1,) prefix sums in the
    same memory as the tensors. Returns out, or (out, softmax_lse) with softmax_lse float32
    (heads, total_q). s_aux: attention sinks, as flash_attn_func's. seqused_q / seqused_k:
    (batch,) int32, the queries / keys used per sequence; out and softmax_lse rows past
    seqused_q are not written and their dq is zeros. qv (total_q, heads,
    headdim_v): as flash_attn_func's."""
    _common_unsupported(attention_chunk, sm_margin)
    kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
              max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
              softmax_scale=softmax_scale,
              causal=causal, window_size=window_size, softcap=softcap, q_descale=q_descale,
              k_descale=k_descale, v_descale=v_descale, num_splits=num_splits,
              deterministic=deterministic, sinks=s_aux, qv=qv)
    if _is_torch(q):
        out, lse = _torch().attention(q, k, v, **kw)
    else:
        out, lse = _array_attention(q, k, v, **kw)
    return (out, lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """qkv (batch, seqlen, 3, heads, headdim), or (batch, seqlen, heads_q + 2*heads_kv,
    headdim) with num_heads_q. The q, k, v views are passed with their strides: no copy."""
    if len(qkv.shape) == 5:
        if qkv.shape[2] != 3:
            raise _core.bad("qkv must be (batch, seqlen, 3, heads, headdim) (got shape %s)"
                            % (tuple(qkv.shape),))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    elif len(qkv.shape) == 4:
        if num_heads_q is None:
            raise _core.bad("a 4-D qkv needs num_heads_q")
        hkv = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q + 2 * hkv != qkv.shape[2] or hkv <= 0:
            raise _core.bad("qkv has %d heads, not num_heads_q + 2 * heads_kv with num_heads_q=%d"
                            % (qkv.shape[2], num_heads_q))
        q = qkv[:, :, :num_heads_q]
        k = qkv[:, :, num_heads_q:num_heads_q + hkv]
        v = qkv[:, :, num_heads_q + hkv:]
    else:
        raise _core.bad("qkv must be 4-D or 5-D (got shape %s)" % (tuple(qkv.shape),))
    return flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                           window_size=window_size, attention_chunk=attention_chunk,
                           softcap=softcap, deterministic=deterministic, sm_margin=sm_margin,
                           return_attn_probs=return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """Decoding against a KV cache: k_cache, v_cache are (batch, seqlen_cache, heads_kv,
    headdim), or (num_pages, page_size, heads_kv, headdim) with page_table (batch,
    max_pages) int32. cache_seqlens (int or (batch,) int32) is the filled length. q is
    (batch, seqlen_q, heads, headdim), or with cu_seqlens_q ((batch + 1,) int32 prefix
    sums) the sequences' queries packed, (total_q, heads, headdim), as SGLang calls it;
    each sequence's queries are the last ones of its cache_seqlens keys (causal masks are
    bottom-right aligned per sequence). If k, v (batch, seqlen_new, heads_kv, headdim) are
    given they are first written into the cache at cache_seqlens, in place, by the library
    (fa3c_append_kv: on the GPU for a GPU cache, no host sync); with cu_seqlens_k_new they
    are packed, (total_new, heads_kv, headdim) (ignored without k, v, as in FA3). With
    rotary_cos, rotary_sin ((rows, rotary_dim / 2), q's dtype) the new keys are rotated at
    positions cache_seqlens + j (or rotary_seqlens + j) as they are written, and a rotated
    copy of q is attended with (q at cache_seqlens + i when causal or local, else every
    query at cache_seqlens; q itself is not changed), as in FA3; not with cu_seqlens_q.
    cache_batch_idx ((batch,) int32) puts sequence b in row cache_batch_idx[b] of a
    contiguous cache (run as a page table of one page per sequence). cache_leftpad ((batch,)
    int32) says how many rows of each sequence's cache come before its first key: its keys
    are rows [cache_leftpad, cache_seqlens), new keys are still written at cache_seqlens, and
    rotary positions count from the padding (cache_seqlens - cache_leftpad, unless
    rotary_seqlens says otherwise), as in FA3 (CUDA: without a page table or
    cache_batch_idx). qv (q's shape, v_cache's head dim): absorbed MLA decode's second query,
    as flash_attn_func's. scheduler_metadata (from get_scheduler_metadata) and pack_gqa are tuning hints
    and are ignored. No backward. Returns out, or with return_softmax_lse=True FA3's
    4-tuple (out, softmax_lse, out_accum, softmax_lse_accum): softmax_lse is (batch, heads,
    seqlen_q), or (heads, total_q) with cu_seqlens_q; out_accum and softmax_lse_accum are
    FA3's split-KV partials, which fa3c merges inside the call, so they are always empty
    float32 arrays, as FA3 returns them when it does not split."""
    _common_unsupported(attention_chunk, sm_margin)
    if (k is None) != (v is None):
        raise _core.bad("give both k and v to append to the cache, or neither")
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary and k is None:
        raise _core.bad("rotary_cos / rotary_sin rotate the new keys and q as k, v are appended: "
                        "give k and v with them (as FA3)")
    if rotary and cu_seqlens_q is not None:
        raise NotImplementedError("fa3c: rotary embedding of packed queries (cu_seqlens_q) is not "
                                  "supported; rotate q before the call")
    if cache_batch_idx is not None:
        # Sequence b in row cache_batch_idx[b] of a contiguous cache: a page table of one
        # page (the whole row) per sequence, for the append and the attention alike.
        if page_table is not None:
            raise _core.bad("cache_batch_idx picks rows of a contiguous cache; with page_table, "
                            "the table says where each sequence lives")
        page_table = cache_batch_idx.reshape(-1, 1)
    torch_path = _is_torch(q)
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, int):
            cache_seqlens = [cache_seqlens] * batch
        if torch_path:
            cache_seqlens = _torch().to_int32_tensor(cache_seqlens, k_cache)
        elif not _arrays.is_array(cache_seqlens):   # a list; arrays stay where they are
            import numpy as np
            cache_seqlens = np.asarray(cache_seqlens, dtype=np.int32)
    if cache_leftpad is not None:
        if cache_seqlens is None:
            raise _core.bad("cache_leftpad needs cache_seqlens (the keys end there)")
        if torch_path:
            cache_leftpad = _torch().to_int32_tensor(cache_leftpad, k_cache)
        elif not _arrays.is_array(cache_leftpad):
            import numpy as np
            cache_leftpad = np.asarray(cache_leftpad, dtype=np.int32)
        if rotary and rotary_seqlens is None:   # positions count from the padding (FA3)
            rotary_seqlens = cache_seqlens - cache_leftpad
    appended_lens = cache_seqlens
    packed_new = k is not None and cu_seqlens_k_new is not None
    if k is not None:
        if cache_seqlens is None:
            raise _core.bad("appending k, v to the cache needs cache_seqlens")
        if packed_new:
            if _is_torch(cu_seqlens_k_new) or _arrays.is_array(cu_seqlens_k_new):
                counts = cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]
            else:
                counts = [b - a for a, b in zip(cu_seqlens_k_new[:-1], cu_seqlens_k_new[1:])]
            appended_lens = cache_seqlens + (counts.to(cache_seqlens.dtype) if torch_path else counts)
        else:
            appended_lens = cache_seqlens + k.shape[1]
    kw = dict(seqused_k=appended_lens, page_table=page_table, softmax_scale=softmax_scale,
              causal=causal, window_size=window_size, softcap=softcap, q_descale=q_descale,
              k_descale=k_descale, v_descale=v_descale, num_splits=num_splits, qv=qv)
    if cache_leftpad is not None:
        kw.update(leftpad_k=cache_leftpad)
    if cu_seqlens_q is not None:
        kw.update(cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
    if k is not None:
        # The C API writes nothing on error; keep that promise for the cache too: check
        # the whole call (as the backend it will run on) before appending in place. The
        # append runs on the GPU where the cache lives (fa3c_append_kv): no host sync.
        ops, stream, guard, backend, finish = _launch(q)
        with guard:
            _core.prepare_forward(ops, q, k_cache, v_cache, backend=backend, **kw).check()
            call = _core.prepare_append(
                ops, k_cache, v_cache, k, v, cache_seqlens, page_table, backend=backend,
                cu_seqlens_new=cu_seqlens_k_new if packed_new else None, rotary_cos=rotary_cos,
                rotary_sin=rotary_sin, rotary_seqlens=rotary_seqlens,
                rotary_interleaved=rotary_interleaved, q=q if rotary else None,
                q_by_row=bool(causal) or tuple(window_size) != (-1, -1))
            call.finish = finish
            outs = call.run(stream)
        if rotary:
            q = outs[2]
    if torch_path:
        out, lse = _torch().attention(q, k_cache, v_cache, **kw)
    else:
        out, lse = _array_attention(q, k_cache, v_cache, **kw)
    if not return_softmax_lse:
        return out
    return (out, lse) + _no_split_partials(out)


def _no_split_partials(out):
    """FA3's (out_accum, softmax_lse_accum) of a call that did not split: two empty float32
    arrays where out lives."""
    if _is_torch(out):
        torch = sys.modules["torch"]
        return tuple(torch.empty(0, dtype=torch.float32, device=out.device) for _ in range(2))
    return tuple(_arrays.empty((0,), "float32", out) for _ in range(2))


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merge attention computed over disjoint parts of the keys (split-KV, or chunks of a
    cache run separately): out_partial (num_splits, batch, seqlen, heads, headdim) and
    lse_partial (num_splits, batch, seqlen, heads), float32. Returns (out, softmax_lse):
    out (batch, seqlen, heads, headdim) in out_dtype (default: out_partial's dtype), written
    into out when given, and softmax_lse float32 (batch, seqlen, heads). A row whose parts
    all have lse -inf (no keys) gets zeros and -inf. Array math in the arrays' library
    (torch, numpy, CuPy, JAX); no libfa3c call."""
    if tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise _core.bad("lse_partial must have shape out_partial.shape[:-1] = %s (got %s)"
                        % (tuple(out_partial.shape[:-1]), tuple(lse_partial.shape)))
    if _is_torch(out_partial):
        torch = sys.modules["torch"]
        lp = lse_partial.float()
        lse = torch.logsumexp(lp, dim=0)
        # exp(-inf - -inf) is NaN: parts of a row without keys weigh nothing
        w = torch.exp(lp - lse).masked_fill(lse == float("-inf"), 0.0)
        res = (w.unsqueeze(-1) * out_partial.float()).sum(0)
        res = res.to(out_partial.dtype if out_dtype is None else out_dtype)
    else:
        # The same math in the arrays' own library (numpy, CuPy, JAX), written so that
        # no step makes a NaN or a warning: rows without keys shift by 0, not -inf.
        xp = _arrays.namespace(out_partial)
        lp = xp.asarray(lse_partial).astype(xp.float32)
        m = xp.max(lp, axis=0)
        m = xp.where(m == -math.inf, 0.0, m)
        s = xp.sum(xp.exp(lp - m), axis=0)
        lse = xp.where(s > 0, xp.log(xp.where(s > 0, s, 1.0)) + m, -math.inf).astype(xp.float32)
        w = xp.exp(lp - xp.where(lse == -math.inf, 0.0, lse))
        res = xp.sum(w[..., None] * xp.asarray(out_partial).astype(xp.float32), axis=0)
        res = res.astype(out_partial.dtype if out_dtype is None else out_dtype)
    if out is not None:
        out[...] = res
        res = out
    return res, lse


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=None, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """FA3 precomputes a kv-cache call's schedule here to pass as scheduler_metadata; fa3c
    schedules each call itself, so there is nothing to precompute: returns an empty int32
    array where cache_seqlens lives, which flash_attn_with_kvcache accepts (and ignores).
    qkv_dtype (FA3's default: torch.bfloat16) and the sizes (headdim_v included: the call
    says whether its backend takes it) are not needed. Arguments fa3c cannot honour in the
    call raise NotImplementedError here already."""
    _common_unsupported(attention_chunk, sm_margin)
    if _is_torch(cache_seqlens):
        torch = sys.modules["torch"]
        return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)
    return _arrays.empty((0,), "int32", cache_seqlens)


# ---- low-level calls: no autograd, any backend -------------------------------------

def forward(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
            max_seqlen_k=None, seqused_k=None, page_table=None, softmax_scale=None, causal=False,
            window_size=(-1, -1), softcap=0.0, q_descale=None, k_descale=None, v_descale=None,
            num_splits=0, backend=None, sinks=None, seqused_q=None, leftpad_k=None, qv=None,
            q_block_descale=None, k_block_descale=None, v_block_descale=None):
    """One fa3c_fwd call on torch tensors or any other arrays (see the module). Returns
    (out, lse). backend: None (CPU for host memory, CUDA for GPU arrays), "auto", "cpu",
    "cuda" or "cpu_reference" (the naive float64 oracle). sinks: one float32 logit per
    query head in every row's softmax (docs/API.md; CPU, and CUDA in bf16/fp16).
    seqused_q: (batch,) queries used per sequence; out and lse rows past them are not
    written. leftpad_k: (batch,) rows of each sequence's KV cache before its first key
    (FA3's cache_leftpad; CUDA: bf16/fp16 without a page table). qv: out's shape, the
    scores becoming softmax_scale * (q k^T + qv v^T) (CPU backends). q_block_descale (batch,
    heads_q, ceil(seqlen_q / 128)), k_block_descale and v_block_descale (batch, heads_kv,
    ceil(seqlen_k / 128)): e4m3 descales per block of 128 rows, multiplying the others
    (quantize_fp8 with block_rows=128 writes them)."""
    ops, stream, guard, backend, finish = _launch(q, backend)
    with guard:
        call = _core.prepare_forward(
            ops, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
            page_table=page_table, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, num_splits=num_splits, backend=backend, sinks=sinks,
            seqused_q=seqused_q, leftpad_k=leftpad_k, qv=qv, q_block_descale=q_block_descale,
            k_block_descale=k_block_descale, v_block_descale=v_block_descale)
        call.finish = finish
        return call.run(stream)


def backward(dout, q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
             max_seqlen_k=None, seqused_k=None, softmax_scale=None, causal=False,
             window_size=(-1, -1), softcap=0.0, deterministic=False, backend=None, sinks=None,
             seqused_q=None):
    """One fa3c_bwd call: (dq, dk, dv) from dout and the forward's q, k, v, out, lse;
    with the forward's sinks, (dq, dk, dv, dsinks). With seqused_q, dq rows past the
    queries used are zeros."""
    ops, stream, guard, backend, finish = _launch(q, backend)
    with guard:
        call = _core.prepare_backward(
            ops, dout, q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, deterministic=deterministic, backend=backend, sinks=sinks,
            seqused_q=seqused_q)
        call.finish = finish
        return call.run(stream)


def prepare_forward(q, k, v, *, backend=None, **kw):
    """Build one fa3c_fwd call (same keywords as forward) without running it. Returns
    a call object: .run() launches it (on the stream current at prepare time, or
    .run(stream)) and returns (out, lse), the same arrays every time. The inputs are
    referenced, not copied: update them in place between runs. For benchmarks and
    repeated launches where per-call Python work matters."""
    ops, stream, guard, backend, finish = _launch(q, backend)
    with guard:
        call = _core.prepare_forward(ops, q, k, v, backend=backend, **kw)
    call.stream, call.finish = stream, finish
    call.guard = None if _is_torch(q) else ops.guard
    return call


def prepare_backward(dout, q, k, v, out, lse, *, backend=None, **kw):
    """As prepare_forward, for fa3c_bwd: .run() returns (dq, dk, dv)."""
    ops, stream, guard, backend, finish = _launch(q, backend)
    with guard:
        call = _core.prepare_backward(ops, dout, q, k, v, out, lse, backend=backend, **kw)
    call.stream, call.finish = stream, finish
    call.guard = None if _is_torch(q) else ops.guard
    return call


def append_kv(k_cache, v_cache, k, v, cache_seqlens, *, page_table=None, cu_seqlens_new=None,
              rotary_cos=None, rotary_sin=None, rotary_seqlens=None, rotary_interleaved=True,
              q=None, q_by_row=False, backend=None):
    """One fa3c_append_kv call (docs/API.md, "KV cache appends"): k, v written in place into
    the caches at cache_seqlens (which is not changed), contiguous or through page_table; k, v
    packed as (total, heads_kv, .) with cu_seqlens_new; with rotary_cos / rotary_sin the new
    keys rotated as they are written. Returns q rotated into a new array when q is given
    (query i at cache_seqlens + i with q_by_row, else every query at cache_seqlens; or at
    rotary_seqlens), else None. On a GPU nothing is read back to the host."""
    ops, stream, guard, backend, finish = _launch(k_cache, backend)
    with guard:
        call = _core.prepare_append(ops, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                    backend=backend, cu_seqlens_new=cu_seqlens_new,
                                    rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                    rotary_seqlens=rotary_seqlens,
                                    rotary_interleaved=rotary_interleaved, q=q, q_by_row=q_by_row)
        call.finish = finish
        outs = call.run(stream)
    return outs[2] if len(outs) > 2 else None


def quantize_fp8(x, *, group=1, hadamard=False, signs=None, block_rows=0, backend=None):
    """x (batch, seqlen, heads, headdim) of float32 / float16 / bfloat16 to e4m3 for the fp8
    forward (fa3c_quantize_fp8, docs/FP8.md). Returns (out, descale): out e4m3 of x's
    shape, descale float32 (batch, heads / group) with out * descale ≈ x (rotated). group:
    heads per descale (heads_q / heads_kv for q, as the forward's q_descale; 1 for k, v).
    block_rows=128: a descale per block of 128 rows too, descale (batch, heads / group,
    ceil(seqlen / 128)): with group 1, the forward's q_block_descale, k_ or v_block_descale.
    hadamard=True rotates each row first (headdim a power of two <= 256) by the signs
    (headdim entries of +1 / -1, or None) and the Hadamard matrix: pass q and k the same
    signs, and leave v as it is (FA3's incoherent processing)."""
    ops, stream, guard, backend, finish = _launch(x, backend)
    with guard:
        call = _core.prepare_quantize(ops, x, group=group, hadamard=hadamard, signs=signs, backend=backend,
                                      block_rows=block_rows)
        call.finish = finish
        return call.run(stream)


def _default_signs(d):
    """A fixed pattern of +1 / -1 for the rotation (the same on every call, so q and k match)."""
    import numpy as np
    return np.where(np.random.RandomState(0x5eed).random_sample(d) < 0.5, -1.0, 1.0).astype(np.float32)


def fp8_attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  hadamard=True, signs=None, block_scales=False, return_lse=False, backend=None):
    """Attention through the e4m3 forward for callers holding bf16 / fp16 / fp32 tensors: q, k,
    v quantized by fa3c.quantize_fp8 (q with one descale per (batch, K/V head) group, as the
    forward takes it), q and k first rotated by the same signs and Hadamard matrix when
    hadamard=True (FA3's incoherent processing; head dim a power of two), then one fa3c_fwd
    call. block_scales=True: a descale per block of 128 rows of each head instead (FA3's
    block quantization; q then per query head). Returns out (bf16), or (out, lse) with
    return_lse=True. signs: head-dim entries of +1 / -1; None takes a fixed pseudo-random
    pattern."""
    heads_q, heads_kv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if hadamard and signs is None:
        signs = _default_signs(d)
    rot = dict(hadamard=hadamard, signs=signs if hadamard else None, backend=backend)
    # Per block: q's descales per query head (group 1), all three named *_block_descale.
    rows = _lib.FP8_BLOCK_ROWS if block_scales else 0
    q_group = 1 if block_scales or not heads_kv else heads_q // heads_kv
    q8, qd = quantize_fp8(q, group=q_group, block_rows=rows, **rot)
    k8, kd = quantize_fp8(k, block_rows=rows, **rot)
    v8, vd = quantize_fp8(v, block_rows=rows, backend=backend)
    kind = "_block_descale" if block_scales else "_descale"
    descales = {"q" + kind: qd, "k" + kind: kd, "v" + kind: vd}
    out, lse = forward(q8, k8, v8, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                       softcap=softcap, backend=backend, **descales)
    return (out, lse) if return_lse else out
