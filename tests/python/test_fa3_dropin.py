"""The FA3 drop-in: fa3c.install_flash_attn_interface() and fa3c.flash_attn_interface.

FA3's own call patterns run through `import flash_attn_interface` after the switch: every
public function and every return form (types, shapes, tuple lengths), values against fa3c's
direct calls and the float64 reference. numpy arrays always (CI has no torch), torch CPU
tensors too when torch is installed. And the switch must not shadow a real FA3 unless forced.
"""
import contextlib
import importlib.util
import inspect
import sys
import types
import warnings

import numpy as np
import pytest

import fa3c
import attn_reference as ref

NAME = "flash_attn_interface"

# FA3's public functions (hopper/flash_attn_interface.py) as inspect prints their
# parameters. Two differences: FA3's qkv_dtype default is torch.bfloat16; fa3c's is None,
# since naming torch there would make `import fa3c` need it (and fa3c ignores qkv_dtype);
# and fa3c adds s_aux=None last to flash_attn_func and flash_attn_varlen_func (attention
# sinks, as vLLM's FA3 fork names them), which FA3 code never passes.
FA3_SIGNATURES = {
    "flash_attn_func":
        "q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, "
        "v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, "
        "pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, s_aux=None",
    "flash_attn_varlen_func":
        "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, "
        "seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, "
        "k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, "
        "num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, "
        "s_aux=None",
    "flash_attn_qkvpacked_func":
        "qkv, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None, "
        "window_size=(-1, -1), attention_chunk=0, softcap=0.0, deterministic=False, "
        "num_heads_q=None, sm_margin=0, return_attn_probs=False",
    "flash_attn_with_kvcache":
        "q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None, "
        "cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None, "
        "cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None, "
        "q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False, "
        "window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True, "
        "scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0, "
        "return_softmax_lse=False",
    "flash_attn_combine":
        "out_partial, lse_partial, out=None, out_dtype=None",
    "get_scheduler_metadata":
        "batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, "
        "cache_seqlens, qkv_dtype=None, headdim_v=None, cu_seqlens_q=None, "
        "cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0, "
        "causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False, "
        "num_splits=0, pack_gqa=None, sm_margin=0",
}


@contextlib.contextmanager
def saved_module():
    """Run with no flash_attn_interface in sys.modules; put back what was there after."""
    had, old = NAME in sys.modules, sys.modules.pop(NAME, None)
    try:
        yield
    finally:
        sys.modules.pop(NAME, None)
        if had:
            sys.modules[NAME] = old


@pytest.fixture
def fai():
    """flash_attn_interface as FA3 code imports it, after the switch."""
    with saved_module():
        if importlib.util.find_spec(NAME) is None:
            with warnings.catch_warnings():
                warnings.simplefilter("error")      # nothing to shadow: no warning
                assert fa3c.install_flash_attn_interface() is True
        else:                                       # a machine with the real FA3 installed
            with pytest.warns(UserWarning, match="replacing"):
                assert fa3c.install_flash_attn_interface(force=True) is True
        import flash_attn_interface
        assert flash_attn_interface is fa3c.flash_attn_interface
        yield flash_attn_interface


class NumpyArrays:
    array = np.ndarray
    float16 = np.float16

    def __init__(self, rng):
        self.rng = rng

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def int32(self, values):
        return np.asarray(values, dtype=np.int32)

    def asarray(self, a):
        return np.asarray(a)

    def stack(self, xs):
        return np.stack(xs)

    def swap12(self, x):
        return np.swapaxes(x, 1, 2)

    @staticmethod
    def np(x):
        return np.asarray(x)


class TorchArrays(NumpyArrays):
    def __init__(self, rng, torch):
        super().__init__(rng)
        self.torch = torch
        self.array = torch.Tensor
        self.float16 = torch.float16

    def randn(self, *shape):
        return self.torch.from_numpy(super().randn(*shape))

    def int32(self, values):
        return self.torch.tensor(np.asarray(values), dtype=self.torch.int32)

    def asarray(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a))

    def stack(self, xs):
        return self.torch.stack(xs)

    def swap12(self, x):
        return x.transpose(1, 2)

    @staticmethod
    def np(x):
        return x.detach().numpy()


@pytest.fixture(params=["numpy", "torch"])
def xp(request, rng):
    if request.param == "numpy":
        return NumpyArrays(rng)
    torch = pytest.importorskip("torch", reason="torch is not installed (the numpy runs cover the drop-in)")
    return TorchArrays(rng, torch)


def assert_same(a, b):
    """Bitwise the same values (fa3c's direct call runs the same backend call)."""
    a, b = NumpyArrays.np(a), NumpyArrays.np(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def assert_close(got, want, atol=1e-5):
    got = NumpyArrays.np(got).astype(np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5)


def check_array(xp, x, shape, dtype=np.float32):
    assert isinstance(x, xp.array), type(x)
    assert tuple(x.shape) == tuple(shape)
    assert NumpyArrays.np(x).dtype == dtype


# ---- the surface ----------------------------------------------------------------------

def test_fa3_public_names_and_signatures(fai):
    assert sorted(fai.__all__) == sorted(FA3_SIGNATURES)
    for name, params in FA3_SIGNATURES.items():
        assert str(inspect.signature(getattr(fai, name))) == "(%s)" % params, name
        assert getattr(fai, name) is getattr(fa3c, name)   # the same functions as fa3c's own


# ---- every function, every return form ------------------------------------------------

def test_flash_attn_func(fai, xp):
    b, sq, sk, hq, hkv, d = 2, 9, 13, 4, 2, 32
    q, k, v = xp.randn(b, sq, hq, d), xp.randn(b, sk, hkv, d), xp.randn(b, sk, hkv, d)
    out = fai.flash_attn_func(q, k, v, causal=True)
    check_array(xp, out, q.shape)
    res = fai.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 2
    check_array(xp, res[1], (b, hq, sq))
    want_out, want_lse = fa3c.forward(q, k, v, causal=True)
    assert_same(out, want_out)
    assert_same(res[0], want_out)
    assert_same(res[1], want_lse)
    assert_same(fai.flash_attn_func(q, k, v, None, True), want_out)  # FA3's positional order
    ref_out, ref_lse = ref.fwd(xp.np(q), xp.np(k), xp.np(v), None, True)
    assert_close(out, ref_out)
    assert_close(res[1], ref_lse, atol=1e-4)
    # the optional arguments FA3 code passes, at values fa3c honours
    out2 = fai.flash_attn_func(q, k, v, softmax_scale=0.3, causal=False, window_size=(3, 2), softcap=5.0,
                               num_splits=0, pack_gqa=True, deterministic=True)
    assert_close(out2, ref.fwd(xp.np(q), xp.np(k), xp.np(v), 0.3, False, (3, 2), 5.0)[0])


def test_flash_attn_varlen_func(fai, xp):
    lens_q, lens_k = [3, 0, 6], [5, 2, 7]
    cu_q, cu_k = (xp.int32(np.concatenate([[0], np.cumsum(n)])) for n in (lens_q, lens_k))
    q, k, v = xp.randn(9, 4, 32), xp.randn(14, 2, 32), xp.randn(14, 2, 32)
    out = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, causal=True)
    check_array(xp, out, q.shape)
    res = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 2
    check_array(xp, res[1], (4, 9))
    want_out, want_lse = fa3c.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert_same(out, want_out)
    assert_same(res[1], want_lse)
    ref_out, _ = ref.fwd_varlen(xp.np(q), xp.np(k), xp.np(v), xp.np(cu_q), xp.np(cu_k), None, True)
    assert_close(out, ref_out)
    # seqused_k: each sequence uses only its first keys
    used = xp.int32([2, 1, 7])
    out_used = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, seqused_k=used, causal=True)
    assert_same(out_used, fa3c.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used,
                                       causal=True)[0])
    # seqused_q: each sequence keeps its first queries, the causal diagonal aligned to them
    used_q = [2, 0, 4]
    out_q, lse_q = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, seqused_q=xp.int32(used_q), causal=True,
                                              return_attn_probs=True)
    rows = np.concatenate([np.arange(s, s + n) for s, n in zip(np.cumsum([0] + lens_q[:-1]), used_q)])
    cu_used = np.concatenate([[0], np.cumsum(used_q)]).astype(np.int32)
    ref_out, ref_lse = ref.fwd_varlen(xp.np(q)[rows], xp.np(k), xp.np(v), cu_used, xp.np(cu_k), None, True)
    assert_close(xp.np(out_q)[rows], ref_out)
    assert_close(xp.np(lse_q)[:, rows], ref_lse, atol=1e-4)


def test_flash_attn_qkvpacked_func(fai, xp):
    qkv = xp.randn(2, 10, 3, 4, 32)
    out = fai.flash_attn_qkvpacked_func(qkv, causal=True)
    check_array(xp, out, (2, 10, 4, 32))
    res = fai.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 2
    check_array(xp, res[1], (2, 4, 10))
    want_out, want_lse = fa3c.forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert_same(out, want_out)
    assert_same(res[1], want_lse)
    # 4-D: heads_q + 2 * heads_kv heads, with num_heads_q
    qkv4 = xp.randn(2, 10, 8, 32)
    out4, lse4 = fai.flash_attn_qkvpacked_func(qkv4, num_heads_q=4, return_attn_probs=True)
    check_array(xp, out4, (2, 10, 4, 32))
    want_out, want_lse = fa3c.forward(qkv4[:, :, :4], qkv4[:, :, 4:6], qkv4[:, :, 6:])
    assert_same(out4, want_out)
    assert_same(lse4, want_lse)


def test_flash_attn_with_kvcache(fai, xp):
    b, cap, hq, hkv, d = 2, 16, 4, 2, 32
    q = xp.randn(b, 1, hq, d)
    kc, vc = xp.randn(b, cap, hkv, d), xp.randn(b, cap, hkv, d)
    lens = xp.int32([5, 14])
    out = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    check_array(xp, out, q.shape)
    res = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_softmax_lse=True)
    # FA3: (out, softmax_lse, out_accum, softmax_lse_accum), the last two empty when unsplit
    assert isinstance(res, tuple) and len(res) == 4
    out_l, lse, *rest = res
    check_array(xp, lse, (b, hq, 1))
    for x in rest:
        check_array(xp, x, (0,))
    want_out, want_lse = fa3c.forward(q, kc, vc, seqused_k=lens, causal=True)
    assert_same(out, want_out)
    assert_same(out_l, want_out)
    assert_same(lse, want_lse)
    for i, n in enumerate([5, 14]):
        assert_close(out[i:i + 1], ref.fwd(xp.np(q)[i:i + 1], xp.np(kc)[i:i + 1, :n], xp.np(vc)[i:i + 1, :n],
                                           None, True)[0])
    # an int cache_seqlens, and a scheduler_metadata from get_scheduler_metadata (positional, as FA3)
    md = fai.get_scheduler_metadata(b, 1, cap, hq, hkv, d, lens, causal=True)
    assert isinstance(md, xp.array) and tuple(md.shape) == (0,) and NumpyArrays.np(md).dtype == np.int32
    out_md = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, scheduler_metadata=md)
    assert_same(out_md, want_out)
    assert_same(fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=7),
                fa3c.forward(q, kc, vc, seqused_k=xp.int32([7, 7]))[0])
    # append k, v in place at cache_seqlens, then attend to the longer cache
    kn, vn = xp.randn(b, 2, hkv, d), xp.randn(b, 2, hkv, d)
    out_a, lse_a, *rest = fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                                      return_softmax_lse=True)
    assert len(rest) == 2
    np.testing.assert_array_equal(xp.np(kc)[0, 5:7], xp.np(kn)[0])
    np.testing.assert_array_equal(xp.np(vc)[1, 14:16], xp.np(vn)[1])
    assert_same(out_a, fa3c.forward(q, kc, vc, seqused_k=xp.int32([7, 16]), causal=True)[0])


def test_flash_attn_with_kvcache_paged_packed(fai, xp, rng):
    # a paged cache with packed queries (cu_seqlens_q), the serving call
    hq, hkv, d, ps = 4, 2, 32, 4
    lens_q, lens = [2, 1], xp.int32([6, 11])
    cu_q = xp.int32([0, 2, 3])
    kp, vp = xp.randn(8, ps, hkv, d), xp.randn(8, ps, hkv, d)
    page_table = xp.int32(rng.permutation(8).reshape(2, 4))
    q = xp.randn(3, hq, d)
    out = fai.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=page_table, cu_seqlens_q=cu_q,
                                      max_seqlen_q=max(lens_q), causal=True)
    check_array(xp, out, q.shape)
    out_l, lse, *rest = fai.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=page_table,
                                                    cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q), causal=True,
                                                    return_softmax_lse=True)
    check_array(xp, lse, (hq, 3))
    assert len(rest) == 2
    want_out, want_lse = fa3c.forward(q, kp, vp, cu_seqlens_q=cu_q, max_seqlen_q=2, seqused_k=lens,
                                      page_table=page_table, causal=True)
    assert_same(out, want_out)
    assert_same(out_l, want_out)
    assert_same(lse, want_lse)


def rotated(x, cos, sin, pos, interleaved):
    """x (b, n, h, d) with its first rotary_dim columns rotated in float64 at table rows pos (b, n)."""
    x = np.asarray(x, dtype=np.float64).copy()
    half = cos.shape[1]
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    i0 = np.arange(half) * 2 if interleaved else np.arange(half)
    i1 = i0 + 1 if interleaved else i0 + half
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0], x[..., i1] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_with_kvcache_rotary(fai, xp, interleaved, causal):
    # FA3's rotary: the new keys rotated as they are appended, at cache_seqlens + j; q at
    # cache_seqlens + i when causal (or local), else every query at cache_seqlens
    b, cap, hq, hkv, d, rd, n = 2, 16, 4, 2, 32, 16, 3
    q, kc, vc = xp.randn(b, n, hq, d), xp.randn(b, cap, hkv, d), xp.randn(b, cap, hkv, d)
    kn, vn = xp.randn(b, n, hkv, d), xp.randn(b, n, hkv, d)
    ang = np.arange(40)[:, None] * 10000.0 ** (-np.arange(rd // 2) / (rd // 2))
    cos_np, sin_np = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    lens_np = np.array([5, 9])
    q0 = xp.np(q).copy()
    out = fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=xp.asarray(cos_np),
                                      rotary_sin=xp.asarray(sin_np), cache_seqlens=xp.int32(lens_np),
                                      causal=causal, rotary_interleaved=interleaved)
    pos = lens_np[:, None] + np.arange(n)[None, :]
    want_k = rotated(xp.np(kn), cos_np, sin_np, pos, interleaved)
    q_pos = pos if causal else np.repeat(lens_np[:, None], n, axis=1)
    want_q = rotated(q0, cos_np, sin_np, q_pos, interleaved)
    np.testing.assert_array_equal(xp.np(q), q0)   # q itself is not changed
    kc_np, vc_np = xp.np(kc), xp.np(vc)
    for i, ln in enumerate(lens_np):
        np.testing.assert_allclose(kc_np[i, ln:ln + n], want_k[i], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(vc_np[i, ln:ln + n], xp.np(vn)[i])
        assert_close(out[i:i + 1], ref.fwd(want_q[i:i + 1], kc_np[i:i + 1, :ln + n], vc_np[i:i + 1, :ln + n],
                                           None, causal)[0], atol=2e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_with_kvcache_leftpad(fai, xp, causal):
    # cache_leftpad: sequence b's keys are rows [leftpad[b], cache_seqlens[b]) of its cache (the
    # rows before are NaN here); new keys go at cache_seqlens, rotated at positions counted from
    # the padding; q at cache_seqlens - leftpad (+ i when causal), as FA3
    b, cap, hq, hkv, d, rd, n = 3, 24, 4, 2, 32, 16, 2
    q, kc, vc = xp.randn(b, n, hq, d), xp.randn(b, cap, hkv, d), xp.randn(b, cap, hkv, d)
    kn, vn = xp.randn(b, n, hkv, d), xp.randn(b, n, hkv, d)
    lens_np, pad_np = np.array([9, 14, 4]), np.array([3, 0, 4])
    kc_np, vc_np = xp.np(kc), xp.np(vc)
    for i, p in enumerate(pad_np):
        kc_np[i, :p] = np.nan
        vc_np[i, :p] = np.nan
    kc, vc = xp.asarray(kc_np), xp.asarray(vc_np)
    ang = np.arange(40)[:, None] * 10000.0 ** (-np.arange(rd // 2) / (rd // 2))
    cos_np, sin_np = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q0 = xp.np(q).copy()
    out = fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=xp.asarray(cos_np),
                                      rotary_sin=xp.asarray(sin_np), cache_seqlens=xp.int32(lens_np),
                                      cache_leftpad=xp.int32(pad_np), causal=causal)
    pos = (lens_np - pad_np)[:, None] + np.arange(n)[None, :]
    want_k = rotated(xp.np(kn), cos_np, sin_np, pos, True)
    want_q = rotated(q0, cos_np, sin_np, pos if causal else np.repeat(pos[:, :1], n, axis=1), True)
    kc_np, vc_np = xp.np(kc), xp.np(vc)
    for i, (ln, p) in enumerate(zip(lens_np, pad_np)):
        np.testing.assert_allclose(kc_np[i, ln:ln + n], want_k[i], atol=1e-5, rtol=1e-5)
        assert_close(out[i:i + 1], ref.fwd(want_q[i:i + 1], kc_np[i:i + 1, p:ln + n], vc_np[i:i + 1, p:ln + n],
                                           None, causal)[0], atol=2e-5)
    # without new keys: the cache as it is
    lens2 = xp.int32(lens_np + n)
    out2 = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens2, cache_leftpad=xp.int32(pad_np), causal=causal)
    for i, (ln, p) in enumerate(zip(lens_np + n, pad_np)):
        assert_close(out2[i:i + 1], ref.fwd(xp.np(q)[i:i + 1], kc_np[i:i + 1, p:ln], vc_np[i:i + 1, p:ln], None,
                                            causal)[0], atol=2e-5)
    md = fai.get_scheduler_metadata(b, n, cap, hq, hkv, d, lens2, cache_leftpad=xp.int32(pad_np))
    assert tuple(md.shape) == (0,)


def test_flash_attn_with_kvcache_batch_idx_and_packed_new_keys(fai, xp):
    # cache_batch_idx: sequence b in cache row idx[b]; cu_seqlens_k_new: k, v packed
    cap, hq, hkv, d = 12, 4, 2, 32
    kc, vc = xp.randn(3, cap, hkv, d), xp.randn(3, cap, hkv, d)
    q = xp.randn(2, 1, hq, d)
    kn, vn = xp.randn(3, hkv, d), xp.randn(3, hkv, d)
    idx, lens, cu = [2, 0], [4, 7], [0, 1, 3]
    kc0 = xp.np(kc).copy()
    out = fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=xp.int32(lens), cache_batch_idx=xp.int32(idx),
                                      cu_seqlens_k_new=xp.int32(cu), causal=True)
    kc_np, vc_np = xp.np(kc), xp.np(vc)
    np.testing.assert_array_equal(kc_np[2, 4:5], xp.np(kn)[0:1])
    np.testing.assert_array_equal(kc_np[0, 7:9], xp.np(kn)[1:3])
    np.testing.assert_array_equal(vc_np[0, 7:9], xp.np(vn)[1:3])
    np.testing.assert_array_equal(kc_np[1], kc0[1])   # the row no sequence uses
    for i in range(2):
        n = lens[i] + cu[i + 1] - cu[i]
        assert_close(out[i:i + 1], ref.fwd(xp.np(q)[i:i + 1], kc_np[idx[i]:idx[i] + 1, :n],
                                           vc_np[idx[i]:idx[i] + 1, :n], None, True)[0])
    with pytest.raises(fa3c.Fa3cError, match="cache_batch_idx"):
        fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=xp.int32(lens), cache_batch_idx=xp.int32(idx),
                                    page_table=xp.int32([[0], [1]]))
    with pytest.raises(fa3c.Fa3cError, match="rotary"):
        fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=xp.int32(lens), rotary_cos=q, rotary_sin=q)


def test_flash_attn_combine(fai, xp):
    # FA3's use: attention over parts of the keys, merged by their lse
    b, sq, sk, hq, hkv, d = 2, 5, 24, 4, 2, 32
    q, k, v = xp.randn(b, sq, hq, d), xp.randn(b, sk, hkv, d), xp.randn(b, sk, hkv, d)
    parts = [fai.flash_attn_func(q, k[:, a:e], v[:, a:e], return_attn_probs=True)
             for a, e in ((0, 10), (10, 24))]
    out_partial = xp.stack([o for o, _ in parts] + [xp.randn(b, sq, hq, d)])
    lse_partial = xp.stack([xp.swap12(lse) for _, lse in parts] + [xp.swap12(xp.randn(b, hq, sq))])
    lse_partial[2] = -np.inf          # a part without keys weighs nothing
    res = fai.flash_attn_combine(out_partial, lse_partial)
    assert isinstance(res, tuple) and len(res) == 2
    out, lse = res
    check_array(xp, out, (b, sq, hq, d))
    check_array(xp, lse, (b, sq, hq))
    full_out, full_lse = fai.flash_attn_func(q, k, v, return_attn_probs=True)
    assert_close(out, xp.np(full_out).astype(np.float64))
    assert_close(lse, xp.np(xp.swap12(full_lse)).astype(np.float64), atol=1e-4)
    # out_dtype, and out= (written in place and returned)
    half, _ = fai.flash_attn_combine(out_partial, lse_partial, out_dtype=xp.float16)
    check_array(xp, half, (b, sq, hq, d), np.float16)
    buf = xp.randn(b, sq, hq, d)
    got, _ = fai.flash_attn_combine(out_partial, lse_partial, out=buf)
    assert got is buf
    assert_same(buf, out)
    # a row whose parts all lack keys: zeros and -inf
    lse_partial[:, 0, 0, 0] = -np.inf
    out, lse = fai.flash_attn_combine(out_partial, lse_partial)
    assert np.all(xp.np(out)[0, 0, 0] == 0) and xp.np(lse)[0, 0, 0] == -np.inf
    assert np.all(np.isfinite(xp.np(out)))


def test_torch_training_pattern(fai):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 7, 2, 16, requires_grad=True) for _ in range(3))
    out = fai.flash_attn_func(q, k, v, causal=True)
    g = torch.randn_like(out)
    out.backward(g)
    want = ref.bwd(*(x.detach().numpy() for x in (q, k, v, g)), causal=True)
    for x, w in zip((q, k, v), want):
        assert_close(x.grad, w, atol=1e-4)


def test_unsupported_arguments_still_raise(fai, xp):
    q = xp.randn(1, 4, 2, 16)
    kc = xp.randn(1, 8, 2, 16)
    lens = xp.int32([3])
    with pytest.raises(NotImplementedError, match="attention_chunk"):
        fai.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, attention_chunk=4)
    with pytest.raises(NotImplementedError, match="attention_chunk"):
        fai.flash_attn_func(q, q, q, attention_chunk=2)


# ---- the switch -----------------------------------------------------------------------

def test_install_is_idempotent_and_quiet(fai):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fa3c.install_flash_attn_interface() is True
    assert sys.modules[NAME] is fa3c.flash_attn_interface


def test_imported_fa3_is_not_shadowed_without_force():
    real = types.ModuleType(NAME)      # stands for FA3's module, imported already
    with saved_module():
        sys.modules[NAME] = real
        with pytest.warns(UserWarning, match="not installed.*force=True"):
            assert fa3c.install_flash_attn_interface() is False
        import flash_attn_interface
        assert flash_attn_interface is real
        with pytest.warns(UserWarning, match="replacing"):
            assert fa3c.install_flash_attn_interface(force=True) is True
        import flash_attn_interface
        assert flash_attn_interface is fa3c.flash_attn_interface


def test_importable_fa3_is_not_shadowed_without_force(tmp_path, monkeypatch):
    # FA3 installed but not imported yet: a flash_attn_interface.py on sys.path
    (tmp_path / (NAME + ".py")).write_text("REAL_FA3 = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with saved_module():
        with pytest.warns(UserWarning, match="not installed"):
            assert fa3c.install_flash_attn_interface() is False
        assert NAME not in sys.modules      # looked for, not imported
        import flash_attn_interface
        assert flash_attn_interface.REAL_FA3
