"""Float64 numpy attention, forward and backward: the oracle of the Python tests.

Written from the math, per sequence, independent of libfa3c:
  S = scale * Q K^T, optionally softcap * tanh(S / softcap), masked outside
  keys [i + sk - sq - left, i + sk - sq + right] (causal: right = 0);
  P = softmax(S), O = P V, lse = log sum exp S (-inf and O = 0 for empty rows).
`rnd`, when given, rounds S, P and O to the input precision: the "naive
attention in the input dtype" that the accuracy rule compares against.
"""
import numpy as np


def key_mask(sq, sk, causal, window):
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    ok = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def _expand_kv(x, g):
    return np.repeat(x, g, axis=1)  # (sk, hkv, d) -> (sk, hq, d), head h uses kv head h // g


def fwd_seq(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, rnd=None):
    """One sequence: q (sq, hq, d), k v (sk, hkv, d) float64. Returns out (sq, hq, d),
    lse (hq, sq), p (hq, sq, sk)."""
    rnd = rnd or (lambda x: x)
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    g = hq // hkv
    kk, vv = _expand_kv(k, g), _expand_kv(v, g)
    s = rnd(np.einsum("qhd,khd->hqk", q, kk)) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    ok = key_mask(sq, sk, causal, window)[None]
    s = np.where(ok, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True) if sk > 0 else np.full((hq, sq, 1), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.where(ok, np.exp(s - m_safe), 0.0)
    l = e.sum(-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    p = rnd(p)
    out = rnd(np.einsum("hqk,khd->qhd", p, vv))
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + m_safe[..., 0],
                       -np.inf)
    return out, lse, p


def bwd_seq(q, k, v, dout, scale, causal=False, window=(-1, -1), softcap=0.0):
    """Gradients (dq, dk, dv) of sum(out * dout) for one sequence, float64."""
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    g = hq // hkv
    out, _, p = fwd_seq(q, k, v, scale, causal, window, softcap)
    kk, vv = _expand_kv(k, g), _expand_kv(v, g)
    dvv = np.einsum("hqk,qhd->khd", p, dout)
    dp = np.einsum("qhd,khd->hqk", dout, vv)
    delta = np.einsum("qhd,qhd->hq", dout, out)[..., None]
    ds = p * (dp - delta)
    if softcap > 0:
        t = np.tanh(np.einsum("qhd,khd->hqk", q, kk) * scale / softcap)
        ds = ds * (1 - t * t)
    dq = np.einsum("hqk,khd->qhd", ds, kk) * scale
    dkk = np.einsum("hqk,qhd->khd", ds, q) * scale
    dk = dkk.reshape(sk, hkv, g, d).sum(2)
    dv = dvv.reshape(sk, hkv, g, dvv.shape[-1]).sum(2)   # v's head dim may differ from d
    return dq, dk, dv


def fwd(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, rnd=None):
    """Batched (b, s, h, d). Returns out (b, sq, hq, d), lse (b, hq, sq)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    outs, lses = [], []
    for b in range(q.shape[0]):
        o, l, _ = fwd_seq(q[b], k[b], v[b], scale, causal, window, softcap, rnd)
        outs.append(o)
        lses.append(l)
    return np.stack(outs), np.stack(lses)


def bwd(q, k, v, dout, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    res = [bwd_seq(q[b], k[b], v[b], dout[b], scale, causal, window, softcap) for b in range(q.shape[0])]
    return tuple(np.stack([r[i] for r in res]) for i in range(3))


def fwd_varlen(q, k, v, cu_q, cu_k, scale=None, causal=False, window=(-1, -1), softcap=0.0, rnd=None):
    """Packed (total, h, d). Returns out (total_q, hq, d), lse (hq, total_q)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = np.zeros(q.shape)
    lse = np.zeros((q.shape[1], q.shape[0]))
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        o, l, _ = fwd_seq(q[qs:qe], k[ks:ke], v[ks:ke], scale, causal, window, softcap, rnd)
        out[qs:qe] = o
        lse[:, qs:qe] = l
    return out, lse


def bwd_varlen(q, k, v, dout, cu_q, cu_k, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        dq[qs:qe], dk[ks:ke], dv[ks:ke] = bwd_seq(q[qs:qe], k[ks:ke], v[ks:ke], dout[qs:qe], scale,
                                                  causal, window, softcap)
    return dq, dk, dv


def rounder(dtype):
    """Round float64 values to `dtype` (a numpy / ml_dtypes dtype) and back."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return None
    return lambda x: np.asarray(x).astype(dtype).astype(np.float64)
