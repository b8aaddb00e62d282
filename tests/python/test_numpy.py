"""numpy arrays on the CPU backend, checked against the float64 reference.

Accuracy rule (docs/ARCHITECTURE.md): max |fa3c - ref64| <= 2 x max |naive - ref64| + atol,
where naive is the same attention computed in the input precision.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import fa3c
import attn_reference as ref
from conftest import ml_dtypes_or_skip

ATOL = {"float32": 1e-5, "float16": 1e-4, "bfloat16": 1e-3}


def np_dtype(name):
    if name in ("bfloat16", "float8_e4m3fn"):
        return np.dtype(getattr(ml_dtypes_or_skip(), name))
    return np.dtype(name)


def randn(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def assert_accurate(got, want, naive, atol, what):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, got.shape, want.shape)
    assert np.all(np.isfinite(got)), "%s: non-finite values" % what
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    nerr = float(np.max(np.abs(naive - want))) if got.size else 0.0
    rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    assert err <= 2 * nerr + atol, ("%s: max error %.3g > 2 x naive %.3g + atol %g (rel L2 %.3g)"
                                    % (what, err, nerr, atol, rel))


def assert_lse(got, want, what="lse"):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, got.shape, want.shape)
    inf = np.isneginf(want)
    assert np.array_equal(np.isneginf(got), inf), "%s: -inf rows differ" % what
    diff = np.abs(got[~inf] - want[~inf])
    tol = 1e-4 + 1e-5 * np.abs(want[~inf])
    assert np.all(diff <= tol), "%s: max error %.3g" % (what, diff.max() if diff.size else 0)


def run_case(rng, dtype_name, b, sq, sk, hq, hkv, d, causal=False, window=(-1, -1), softcap=0.0,
             scale=None):
    dt = np_dtype(dtype_name)
    q, k, v = randn(rng, (b, sq, hq, d), dt), randn(rng, (b, sk, hkv, d), dt), randn(rng, (b, sk, hkv, d), dt)
    out, lse = fa3c.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                    softcap=softcap, return_attn_probs=True)
    assert out.dtype == dt and out.shape == q.shape
    want, want_lse = ref.fwd(q, k, v, scale, causal, window, softcap)
    naive, _ = ref.fwd(q, k, v, scale, causal, window, softcap, rnd=ref.rounder(dt))
    tag = "%s b%d sq%d sk%d h%d/%d d%d causal=%s window=%s softcap=%s" % (
        dtype_name, b, sq, sk, hq, hkv, d, causal, window, softcap)
    assert_accurate(out, want, naive, ATOL[dtype_name], tag)
    assert_lse(lse, want_lse, tag + " lse")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 70), (17, 17), (33, 64), (64, 33), (128, 128)])
def test_forward(rng, dtype, causal, sq, sk):
    run_case(rng, dtype, 2, sq, sk, 4, 4, 64, causal=causal)


@pytest.mark.parametrize("d", [8, 32, 96, 128, 256])
def test_head_dims(rng, d):
    run_case(rng, "bfloat16", 1, 40, 52, 2, 2, d, causal=True)


@pytest.mark.parametrize("hq,hkv", [(4, 1), (6, 2), (6, 3), (8, 2)])
def test_gqa(rng, hq, hkv):
    run_case(rng, "bfloat16", 2, 37, 45, hq, hkv, 64, causal=True)


@pytest.mark.parametrize("window", [(3, 0), (5, 2), (0, 0), (-1, 4), (8, -1)])
@pytest.mark.parametrize("sq,sk", [(40, 40), (24, 61), (61, 24)])
def test_window(rng, window, sq, sk):
    run_case(rng, "float32", 2, sq, sk, 2, 1, 32, window=window)


@pytest.mark.parametrize("causal", [False, True])
def test_softcap(rng, causal):
    # large logits so that the cap matters
    dt = np.float32
    q, k, v = randn(rng, (2, 30, 2, 32), dt, 4.0), randn(rng, (2, 50, 2, 32), dt, 4.0), randn(rng, (2, 50, 2, 32), dt)
    out, lse = fa3c.flash_attn_func(q, k, v, causal=causal, softcap=5.0, return_attn_probs=True)
    want, want_lse = ref.fwd(q, k, v, None, causal, (-1, -1), 5.0)
    no_cap, _ = ref.fwd(q, k, v, None, causal)
    assert np.max(np.abs(want - no_cap)) > 1e-2  # the cap changed something
    assert_accurate(out, want, want, 1e-4, "softcap")
    assert_lse(lse, want_lse)


def test_scale_and_return_values(rng):
    q, k, v = randn(rng, (1, 9, 2, 16), np.float32), randn(rng, (1, 12, 2, 16), np.float32), randn(rng, (1, 12, 2, 16), np.float32)
    out = fa3c.flash_attn_func(q, k, v, softmax_scale=0.3)
    assert isinstance(out, np.ndarray)  # FA3: out only unless return_attn_probs
    want, _ = ref.fwd(q, k, v, 0.3)
    assert_accurate(out, want, want, 1e-5, "softmax_scale")
    res = fa3c.flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 2 and res[1].dtype == np.float32 and res[1].shape == (1, 2, 9)


def test_fully_masked_rows(rng):
    # causal with sq > sk: the first sq - sk query rows see no key (bottom-right alignment)
    q, k, v = randn(rng, (1, 10, 2, 16), np.float32), randn(rng, (1, 4, 2, 16), np.float32), randn(rng, (1, 4, 2, 16), np.float32)
    out, lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[:, :6] == 0)
    assert np.all(np.isneginf(lse[:, :, :6]))
    want, want_lse = ref.fwd(q, k, v, None, True)
    assert_accurate(out, want, want, 1e-5, "masked rows")
    assert_lse(lse, want_lse)


def test_strided_packed_qkv(rng):
    qkv = randn(rng, (2, 33, 3, 4, 32), np.float32)
    out = fa3c.flash_attn_qkvpacked_func(qkv, causal=True)
    want, _ = ref.fwd(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None, True)
    assert_accurate(out, want, want, 1e-5, "packed qkv")
    # 4-D packing with GQA: heads_q + 2 * heads_kv
    qkv4 = randn(rng, (2, 21, 4 + 2 * 2, 32), np.float32)
    out4 = fa3c.flash_attn_qkvpacked_func(qkv4, num_heads_q=4)
    want4, _ = ref.fwd(qkv4[:, :, :4], qkv4[:, :, 4:6], qkv4[:, :, 6:], None)
    assert_accurate(out4, want4, want4, 1e-5, "packed qkv gqa")


def test_non_unit_headdim_stride_is_copied(rng):
    q = randn(rng, (1, 8, 2, 64), np.float32)[..., ::2]  # stride 2 on headdim
    k, v = randn(rng, (1, 8, 2, 32), np.float32), randn(rng, (1, 8, 2, 32), np.float32)
    want, _ = ref.fwd(q, k, v)
    assert_accurate(fa3c.flash_attn_func(q, k, v), want, want, 1e-5, "strided headdim")


def _varlen_inputs(rng, dt, lens_q, lens_k, hq, hkv, d):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], hq, d), dt)
    k = randn(rng, (cu_k[-1], hkv, d), dt)
    v = randn(rng, (cu_k[-1], hkv, d), dt)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_varlen(rng, causal, dtype):
    dt = np_dtype(dtype)
    lens_q, lens_k = [5, 1, 17, 30], [9, 4, 17, 12]
    q, k, v, cu_q, cu_k = _varlen_inputs(rng, dt, lens_q, lens_k, 6, 2, 32)
    out, lse = fa3c.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                           return_attn_probs=True)
    want, want_lse = ref.fwd_varlen(q, k, v, cu_q, cu_k, None, causal)
    naive, _ = ref.fwd_varlen(q, k, v, cu_q, cu_k, None, causal, rnd=ref.rounder(dt))
    assert_accurate(out, want, naive, ATOL[dtype], "varlen")
    assert lse.shape == (6, cu_q[-1])
    assert_lse(lse, want_lse)


def test_kvcache(rng):
    b, hq, hkv, d, cap = 3, 4, 2, 32, 40
    q = randn(rng, (b, 1, hq, d), np.float32)
    kc, vc = randn(rng, (b, cap, hkv, d), np.float32), randn(rng, (b, cap, hkv, d), np.float32)
    lens = np.array([7, 40, 1], dtype=np.int32)
    out, lse, *_ = fa3c.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_softmax_lse=True)
    for i in range(b):
        want, want_lse = ref.fwd(q[i:i + 1], kc[i:i + 1, :lens[i]], vc[i:i + 1, :lens[i]], None, True)
        assert_accurate(out[i:i + 1], want, want, 1e-5, "kvcache seq %d" % i)
        assert_lse(lse[i:i + 1], want_lse)


def test_kvcache_append_and_paged(rng):
    b, hq, hkv, d, ps, npages = 2, 4, 1, 32, 4, 12
    q = randn(rng, (b, 2, hq, d), np.float32)
    kp, vp = randn(rng, (npages, ps, hkv, d), np.float32), randn(rng, (npages, ps, hkv, d), np.float32)
    page_table = np.array([[5, 0, 9, 3], [1, 11, 2, 7]], dtype=np.int32)
    lens = np.array([6, 13], dtype=np.int32)
    knew, vnew = randn(rng, (b, 2, hkv, d), np.float32), randn(rng, (b, 2, hkv, d), np.float32)
    out = fa3c.flash_attn_with_kvcache(q, kp, vp, k=knew, v=vnew, cache_seqlens=lens,
                                       page_table=page_table, causal=True)
    for i in range(b):
        # gather this sequence's keys through its pages, then check the append landed
        kseq = np.concatenate([kp[p] for p in page_table[i]])[:lens[i] + 2]
        vseq = np.concatenate([vp[p] for p in page_table[i]])[:lens[i] + 2]
        np.testing.assert_array_equal(kseq[lens[i]:], knew[i])
        np.testing.assert_array_equal(vseq[lens[i]:], vnew[i])
        want, _ = ref.fwd(q[i:i + 1], kseq[None], vseq[None], None, True)
        assert_accurate(out[i:i + 1], want, want, 1e-5, "paged seq %d" % i)


@pytest.mark.parametrize("page_size", [1, 4])
def test_kvcache_packed_queries_paged(rng, page_size):
    # SGLang's call: queries packed with cu_seqlens_q (a sequence may have none), keys in a
    # paged cache filled to cache_seqlens, each sequence's queries the last of its keys.
    b, hq, hkv, d, pages_per_seq = 3, 4, 2, 32, 12
    lens_q, lens = [3, 1, 0], np.array([10, 7, 5], dtype=np.int32)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    npages = b * pages_per_seq
    kp, vp = randn(rng, (npages, page_size, hkv, d), np.float32), randn(rng, (npages, page_size, hkv, d), np.float32)
    page_table = rng.permutation(npages).astype(np.int32).reshape(b, pages_per_seq)
    q = randn(rng, (cu_q[-1], hq, d), np.float32)
    knew, vnew = randn(rng, (b, 2, hkv, d), np.float32), randn(rng, (b, 2, hkv, d), np.float32)
    for append in (False, True):
        kw = dict(k=knew, v=vnew) if append else {}
        out, lse, *_ = fa3c.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=page_table,
                                                    cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q), causal=True,
                                                    return_softmax_lse=True, **kw)
        assert out.shape == q.shape and lse.shape == (hq, cu_q[-1])
        used = lens + (2 if append else 0)
        for i in range(b):
            kseq = np.concatenate([kp[p] for p in page_table[i]])[:used[i]]
            vseq = np.concatenate([vp[p] for p in page_table[i]])[:used[i]]
            qi = q[None, cu_q[i]:cu_q[i + 1]]
            want, want_lse = ref.fwd(qi, kseq[None], vseq[None], None, True)
            what = "page size %d, append %s, seq %d" % (page_size, append, i)
            assert_accurate(out[cu_q[i]:cu_q[i + 1]], want[0], want[0], 1e-5, what)
            assert_lse(lse[:, cu_q[i]:cu_q[i + 1]], want_lse[0], what + " lse")
    # new keys packed too (cu_seqlens_k_new: 2, 0 and 1 of them), over the rows appended above
    cu_k = np.array([0, 2, 2, 3], dtype=np.int32)
    kpk, vpk = randn(rng, (3, hkv, d), np.float32), randn(rng, (3, hkv, d), np.float32)
    start = lens
    out = fa3c.flash_attn_with_kvcache(q, kp, vp, k=kpk, v=vpk, cache_seqlens=start, page_table=page_table,
                                       cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q), cu_seqlens_k_new=cu_k,
                                       causal=True)
    for i in range(b):
        used = start[i] + cu_k[i + 1] - cu_k[i]
        kseq = np.concatenate([kp[p] for p in page_table[i]])[:used]
        vseq = np.concatenate([vp[p] for p in page_table[i]])[:used]
        np.testing.assert_array_equal(kseq[start[i]:], kpk[cu_k[i]:cu_k[i + 1]])
        np.testing.assert_array_equal(vseq[start[i]:], vpk[cu_k[i]:cu_k[i + 1]])
        want, _ = ref.fwd(q[None, cu_q[i]:cu_q[i + 1]], kseq[None], vseq[None], None, True)
        assert_accurate(out[cu_q[i]:cu_q[i + 1]], want[0], want[0], 1e-5, "packed new keys, seq %d" % i)


def test_kvcache_append_writes_nothing_on_error(rng):
    # The C API's promise (nothing written on error) holds for the in-place append too.
    b, hq, hkv, d, cap = 2, 2, 1, 16, 8
    q = randn(rng, (b, 1, hq, d), np.float32)
    kc, vc = randn(rng, (b, cap, hkv, d), np.float32), randn(rng, (b, cap, hkv, d), np.float32)
    knew, vnew = randn(rng, (b, 2, hkv, d), np.float32), randn(rng, (b, 2, hkv, d), np.float32)
    before = kc.copy(), vc.copy()
    with pytest.raises(fa3c.Fa3cError, match="seqused_k|too small|cache_seqlens"):   # sequence 1 does not fit
        fa3c.flash_attn_with_kvcache(q, kc, vc, k=knew, v=vnew, cache_seqlens=np.array([3, 7], np.int32))
    with pytest.raises(fa3c.Fa3cError, match="window"):           # the call itself is invalid
        fa3c.flash_attn_with_kvcache(q, kc, vc, k=knew, v=vnew, cache_seqlens=np.array([1, 1], np.int32),
                                     window_size=(-2, 0))
    np.testing.assert_array_equal(kc, before[0])
    np.testing.assert_array_equal(vc, before[1])


def test_fp8_with_descale(rng):
    ml = ml_dtypes_or_skip()
    b, s, hq, hkv, d = 2, 48, 4, 2, 64
    e4m3 = np.dtype(ml.float8_e4m3fn)
    q8, k8, v8 = (randn(rng, (b, s, h, d), e4m3) for h in (hq, hkv, hkv))
    qd, kd, vd = (rng.uniform(0.5, 2.0, (b, hkv)).astype(np.float32) for _ in range(3))
    out, lse = fa3c.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                                    return_attn_probs=True)
    assert out.dtype == np.dtype(ml.bfloat16)  # e4m3 in -> bf16 out
    g = hq // hkv
    deq = lambda x, sc, gg: x.astype(np.float64) * np.repeat(sc, gg, axis=1)[:, None, :, None]
    q64, k64, v64 = deq(q8, qd, g), deq(k8, kd, 1), deq(v8, vd, 1)
    want, want_lse = ref.fwd(q64, k64, v64, None, True)
    # naive fp8: P rounded to e4m3 before P V, output to bf16
    naive_out = []
    for i in range(b):
        o, _, p = ref.fwd_seq(q64[i], k64[i], v64[i], d ** -0.5, True)
        p8 = p.astype(e4m3).astype(np.float64)
        vv = np.repeat(v64[i], g, axis=1)
        naive_out.append(np.einsum("hqk,khd->qhd", p8, vv).astype(ml.bfloat16).astype(np.float64))
    assert_accurate(out, want, np.stack(naive_out), 1e-3, "fp8")
    # lse: from the same dequantized scores, so only accumulation error
    fin = np.isfinite(want_lse)
    assert np.max(np.abs(lse[fin] - want_lse[fin])) < 2e-2
    # descale must matter: without it the result is that of the raw fp8 values
    raw = fa3c.flash_attn_func(q8, k8, v8, causal=True)
    assert np.max(np.abs(raw.astype(np.float64) - want)) > 1e-2


def test_cpu_reference_backend_agrees(rng):
    q, k, v = (randn(rng, (2, 29, 2, 64), np.float32) for _ in range(3))
    o1, l1 = fa3c.forward(q, k, v, causal=True, backend="cpu")
    o2, l2 = fa3c.forward(q, k, v, causal=True, backend="cpu_reference")
    np.testing.assert_allclose(o1, o2, atol=1e-5)
    np.testing.assert_allclose(l1, l2, atol=1e-5)


# ---- errors -----------------------------------------------------------------------

def test_bad_headdim_carries_c_message(rng):
    q, k, v = (randn(rng, (1, 8, 2, 12), np.float32) for _ in range(3))
    with pytest.raises(fa3c.Fa3cError) as ei:
        fa3c.flash_attn_func(q, k, v)
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.status == fa3c.STATUS_INVALID_ARGUMENT
    assert str(e) == fa3c.last_error() != ""  # the C message, verbatim
    assert "12" in str(e)


def test_error_pickles_with_status(rng):
    import pickle
    q = randn(rng, (1, 8, 2, 12), np.float32)
    with pytest.raises(fa3c.Fa3cError) as ei:
        fa3c.flash_attn_func(q, q, q)
    e2 = pickle.loads(pickle.dumps(ei.value))
    assert e2.status == ei.value.status and str(e2) == str(ei.value)


def test_bad_head_ratio_carries_c_message(rng):
    q = randn(rng, (1, 8, 3, 16), np.float32)
    k = v = randn(rng, (1, 8, 2, 16), np.float32)
    with pytest.raises(fa3c.Fa3cError) as ei:
        fa3c.flash_attn_func(q, k, v)
    assert ei.value.status == fa3c.STATUS_INVALID_ARGUMENT
    assert str(ei.value) == fa3c.last_error() != ""


def test_bad_shapes_and_types(rng):
    q = randn(rng, (1, 8, 2, 16), np.float32)
    with pytest.raises(fa3c.Fa3cError, match="same shape"):
        fa3c.flash_attn_func(q, q, q[:, :4])
    with pytest.raises(fa3c.Fa3cError, match="same head dim"):
        fa3c.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(fa3c.Fa3cError, match="same dtype"):
        fa3c.flash_attn_func(q, q, q.astype(np.float16))
    with pytest.raises(TypeError, match="unsupported dtype"):
        fa3c.flash_attn_func(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64))
    with pytest.raises(fa3c.Fa3cError, match="batch"):
        fa3c.flash_attn_func(q, np.concatenate([q, q]), np.concatenate([q, q]))


@pytest.mark.parametrize("kw", [dict(attention_chunk=4), dict(sm_margin=8)])
def test_unsupported_fa3_arguments(rng, kw):
    q = randn(rng, (1, 8, 2, 16), np.float32)
    with pytest.raises(NotImplementedError, match=list(kw)[0]):
        fa3c.flash_attn_func(q, q, q, **kw)


def test_pack_gqa_and_num_splits_accepted(rng):
    q = randn(rng, (1, 1, 4, 16), np.float32)
    k = v = randn(rng, (1, 100, 1, 16), np.float32)
    want, _ = ref.fwd(q, k, v)
    for ns in (0, 1, 3):
        out = fa3c.flash_attn_func(q, k, v, num_splits=ns, pack_gqa=True)
        assert_accurate(out, want, want, 1e-5, "num_splits=%d" % ns)


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, fa3c\n"
            "q = np.ones((1, 2, 1, 8), np.float32)\n"
            "print(fa3c.flash_attn_func(q, q, q).shape)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "(1, 2, 1, 8)" in r.stdout


# ---- backward ---------------------------------------------------------------------

BWD_CASES = [
    dict(sq=17, sk=17, hq=2, hkv=2, d=32),
    dict(sq=33, sk=64, hq=4, hkv=2, d=64, causal=True),
    dict(sq=64, sk=33, hq=6, hkv=3, d=32, causal=True),
    dict(sq=40, sk=50, hq=2, hkv=1, d=32, window=(7, 3)),
    dict(sq=30, sk=30, hq=2, hkv=2, d=16, softcap=3.0),
]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "-".join("%s%s" % kv for kv in c.items()))
def test_backward_fp32(rng, case):
    c = dict(causal=False, window=(-1, -1), softcap=0.0)
    c.update(case)
    b = 2
    q = randn(rng, (b, c["sq"], c["hq"], c["d"]), np.float32)
    k = randn(rng, (b, c["sk"], c["hkv"], c["d"]), np.float32)
    v = randn(rng, (b, c["sk"], c["hkv"], c["d"]), np.float32)
    dout = randn(rng, q.shape, np.float32)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    out, lse = fa3c.forward(q, k, v, **kw)
    dq, dk, dv = fa3c.backward(dout, q, k, v, out, lse, **kw)
    want = ref.bwd(q, k, v, dout, None, c["causal"], c["window"], c["softcap"])
    for name, got, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert got.shape == w.shape and got.dtype == np.float32
        err = np.max(np.abs(got - w))
        assert err <= 1e-4 * max(1.0, np.max(np.abs(w))), "%s: max error %.3g" % (name, err)


def test_backward_bf16(rng):
    dt = np_dtype("bfloat16")
    q, k, v = randn(rng, (2, 40, 4, 64), dt), randn(rng, (2, 56, 2, 64), dt), randn(rng, (2, 56, 2, 64), dt)
    dout = randn(rng, q.shape, dt)
    out, lse = fa3c.forward(q, k, v, causal=True)
    grads = fa3c.backward(dout, q, k, v, out, lse, causal=True)
    want = ref.bwd(q, k, v, dout, None, True)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        assert got.dtype == dt
        g = got.astype(np.float64)
        rel = np.linalg.norm(g - w) / np.linalg.norm(w)
        assert rel < 1e-2, "%s: rel L2 error %.3g" % (name, rel)


def test_backward_varlen(rng):
    lens_q, lens_k = [3, 20, 9], [7, 20, 1]
    q, k, v, cu_q, cu_k = _varlen_inputs(rng, np.float32, lens_q, lens_k, 4, 2, 32)
    dout = randn(rng, q.shape, np.float32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=20, max_seqlen_k=20, causal=True)
    out, lse = fa3c.forward(q, k, v, **kw)
    grads = fa3c.backward(dout, q, k, v, out, lse, **kw)
    want = ref.bwd_varlen(q, k, v, dout, cu_q, cu_k, None, True)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        err = np.max(np.abs(got - w))
        assert err <= 1e-4 * max(1.0, np.max(np.abs(w))), "%s: max error %.3g" % (name, err)


def test_backward_finite_differences(rng):
    """The gradient of L = sum(out * g) against central differences of fa3c's own forward."""
    b, sq, sk, hq, hkv, d = 1, 5, 7, 2, 1, 8
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    g = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    kw = dict(causal=True, softcap=2.0)
    out, lse = fa3c.forward(q, k, v, **kw)
    grads = fa3c.backward(g, q, k, v, out, lse, **kw)

    def loss(qq, kk, vv):
        o, _ = fa3c.forward(qq, kk, vv, **kw)
        return float(np.sum(o.astype(np.float64) * g))

    eps = 1e-2
    for idx, (name, x) in enumerate((("q", q), ("k", k), ("v", v))):
        fd = np.zeros(x.shape)
        for pos in np.ndindex(x.shape):
            args = [q, k, v]
            xp, xm = x.copy(), x.copy()
            xp[pos] += eps
            xm[pos] -= eps
            args[idx] = xp
            lp = loss(*args)
            args[idx] = xm
            lm = loss(*args)
            fd[pos] = (lp - lm) / (2 * eps)
        err = np.max(np.abs(grads[idx] - fd))
        assert err < 2e-3 * max(1.0, np.max(np.abs(fd))), "d%s vs finite differences: %.3g" % (name, err)


@pytest.mark.skipif(os.environ.get("FA3C_EXPECT_INSTALLED") != "1",
                    reason="checks the pip-installed package (tools/test_python.sh sets FA3C_EXPECT_INSTALLED=1)")
def test_installed_package_ships_library():
    pkg = os.path.dirname(os.path.abspath(fa3c.__file__))
    assert "site-packages" in pkg, "fa3c imported from %s, not the installed package" % pkg
    assert os.path.dirname(os.path.abspath(fa3c.library_path())) == pkg
    assert fa3c.version() == fa3c.__version__


def test_prepared_call_reruns_on_updated_inputs(rng):
    q, k, v = (randn(rng, (1, 20, 2, 32), np.float32) for _ in range(3))
    call = fa3c.prepare_forward(q, k, v, causal=True)
    out, lse = call.run()
    want, _ = ref.fwd(q, k, v, None, True)
    assert_accurate(out, want, want, 1e-5, "prepared")
    q[...] = randn(rng, q.shape, np.float32)  # in place: the call sees the new values
    out2, _ = call.run()
    assert out2 is out
    want2, _ = ref.fwd(q, k, v, None, True)
    assert_accurate(out2, want2, want2, 1e-5, "prepared rerun")
    dout = randn(rng, q.shape, np.float32)
    dq, dk, dv = fa3c.prepare_backward(dout, q, k, v, out, lse, causal=True).run()
    for got, w in zip((dq, dk, dv), ref.bwd(q, k, v, dout, None, True)):
        assert np.max(np.abs(got - w)) < 1e-4 * max(1.0, np.max(np.abs(w)))


def test_append_kv_rotates_q_and_keys(rng):
    # fa3c.append_kv on its own: GPT-NeoX pairs over the first 8 of 16 columns, positions from
    # rotary_seqlens, q at one position per sequence
    b, hkv, hq, d, cap = 2, 1, 2, 16, 8
    kc, vc = randn(rng, (b, cap, hkv, d), np.float32), randn(rng, (b, cap, hkv, d), np.float32)
    kn, vn = randn(rng, (b, 2, hkv, d), np.float32), randn(rng, (b, 2, hkv, d), np.float32)
    q = randn(rng, (b, 3, hq, d), np.float32)
    ang = np.arange(12)[:, None] * 0.3 * (np.arange(4) + 1)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    lens, pos = np.array([1, 5], dtype=np.int32), np.array([7, 2], dtype=np.int32)
    q_rot = fa3c.append_kv(kc, vc, kn, vn, lens, rotary_cos=cos, rotary_sin=sin, rotary_seqlens=pos,
                           rotary_interleaved=False, q=q)

    def rot(x, p):
        y = x.astype(np.float64).copy()
        c, s = cos[p], sin[p]
        y[..., :4], y[..., 4:8] = x[..., :4] * c - x[..., 4:8] * s, x[..., :4] * s + x[..., 4:8] * c
        return y

    for i in range(b):
        for j in range(2):
            np.testing.assert_allclose(kc[i, lens[i] + j], rot(kn[i, j], pos[i] + j), rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(vc[i, lens[i] + j], vn[i, j])
        for r in range(3):
            np.testing.assert_allclose(q_rot[i, r], rot(q[i, r], pos[i]), rtol=1e-6, atol=1e-6)
    assert fa3c.append_kv(kc, vc, kn, vn, lens) is None
