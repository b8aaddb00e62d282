"""Arrays from anywhere: everything that is not a torch tensor goes through DLPack
(fa3c._arrays): numpy, an object with nothing but __dlpack__ / __dlpack_device__,
torch tensors hidden behind such an object, JAX and CuPy arrays.

Outputs come from q's library: numpy for numpy and for bare objects in CPU memory,
JAX for JAX, CuPy for CuPy, torch for bare objects on the GPU. JAX and CuPy tests
skip when those are not installed (CuPy needs a GPU); the GPU tests need torch, an
sm_90 GPU and a libfa3c with the CUDA backend.
"""
import gc
import sys

import numpy as np
import pytest

import fa3c
import attn_reference as ref
from conftest import ml_dtypes_or_skip
from fa3c import _arrays


class DLPackOnly:
    """The least an array can be: __dlpack__ and __dlpack_device__, no shape, no
    namespace. Records the stream each export was asked for."""

    def __init__(self, a):
        self.a = a
        self.streams = []

    def __dlpack__(self, **kw):
        self.streams.append(kw.get("stream"))
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def qkv(rng, dtype=np.float32, b=2, sq=9, sk=13, hq=4, hkv=2, d=32):
    return randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hkv, d), dtype), randn(rng, (b, sk, hkv, d), dtype)


def as_np(x):
    """Host numpy values of any result (numpy, JAX, CuPy, torch)."""
    if hasattr(x, "get"):
        return x.get()
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


# ---- numpy and bare objects ----------------------------------------------------------

@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("float16", 1e-4)])
def test_numpy_through_dlpack(rng, dtype, atol):
    q, k, v = qkv(rng, dtype)
    assert type(_arrays.ArrayOps(q).view(q).owner).__name__ == "PyCapsule"   # read through DLPack
    out, lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(out, np.ndarray) and out.dtype == q.dtype and lse.dtype == np.float32
    want, want_lse = ref.fwd(q, k, v, None, True)
    naive, _ = ref.fwd(q, k, v, None, True, rnd=ref.rounder(q.dtype))
    err = np.max(np.abs(out.astype(np.float64) - want))
    assert err <= 2 * np.max(np.abs(naive - want)) + atol, err
    assert np.max(np.abs(lse - want_lse)) < 1e-4


def test_numpy_bf16_keeps_numpy_path(rng):
    ml = ml_dtypes_or_skip()
    q, k, v = qkv(rng, ml.bfloat16)
    assert isinstance(_arrays.ArrayOps(q).view(q).owner, np.ndarray)   # DLPack has no ml_dtypes
    out = fa3c.flash_attn_func(q, k, v)
    assert out.dtype == q.dtype
    want, _ = ref.fwd(q, k, v)
    assert np.max(np.abs(out.astype(np.float64) - want)) < 2e-2


def test_any_object_with_dlpack(rng):
    q, k, v = qkv(rng)
    wq, wk, wv = DLPackOnly(q), DLPackOnly(k), DLPackOnly(v)
    out, lse = fa3c.flash_attn_func(wq, wk, wv, causal=True, return_attn_probs=True)
    want_out, want_lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)   # CPU: numpy outputs
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)
    assert wq.streams and all(s is None for s in wq.streams)   # no stream on the CPU
    # the backward too, every argument a bare object
    dout = randn(rng, q.shape)
    grads = fa3c.backward(*(DLPackOnly(x) for x in (dout, q, k, v, out, lse)), causal=True)
    for got, want in zip(grads, fa3c.backward(dout, q, k, v, out, lse, causal=True)):
        np.testing.assert_array_equal(got, want)


def test_metadata_through_dlpack(rng):
    lens_q, lens_k = [3, 0, 6], [5, 2, 7]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)   # converted to int32
    q, k, v = randn(rng, (9, 4, 32)), randn(rng, (14, 2, 32)), randn(rng, (14, 2, 32))
    used = np.array([2, 1, 7], dtype=np.int32)
    kw = dict(max_seqlen_q=6, max_seqlen_k=7, causal=True)
    out, lse = fa3c.forward(*(DLPackOnly(x) for x in (q, k, v)), cu_seqlens_q=DLPackOnly(cu_q),
                            cu_seqlens_k=DLPackOnly(cu_k), seqused_k=DLPackOnly(used), **kw)
    want_out, want_lse = fa3c.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k.astype(np.int32),
                                      seqused_k=used, **kw)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)
    # max_seqlen_* read from the cu_seqlens themselves
    out2, _ = fa3c.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), cu_seqlens_q=DLPackOnly(cu_q),
                           cu_seqlens_k=DLPackOnly(cu_k), causal=True)
    np.testing.assert_array_equal(out2, fa3c.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                                     causal=True)[0])


def test_strided_inputs(rng):
    # DLPack strides are in elements, and may be negative or zero: fa3c copies what it cannot read
    q = randn(rng, (2, 9, 4, 64))
    k, v = randn(rng, (1, 13, 2, 32)), randn(rng, (2, 13, 2, 32))
    views = dict(reversed_seq=q[:, ::-1, :, :32], headdim_step2=q[..., ::2])
    kb = np.broadcast_to(k, (2, 13, 2, 32))   # stride 0 over the batch: read as is on the CPU
    for name, qs in views.items():
        got = fa3c.flash_attn_func(DLPackOnly(qs), DLPackOnly(kb), DLPackOnly(v), causal=True)
        want = fa3c.flash_attn_func(np.ascontiguousarray(qs), np.ascontiguousarray(kb), v, causal=True)
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)


def test_capsules_live_as_long_as_the_call(rng):
    q = randn(rng, (1, 8, 2, 16))
    w = DLPackOnly(q)
    before = sys.getrefcount(q)
    call = fa3c.prepare_forward(w, w, w)
    assert sys.getrefcount(q) > before     # the call holds the capsule, which holds q
    out, _ = call.run()
    np.testing.assert_array_equal(out, fa3c.flash_attn_func(q, q, q))
    del call, out
    gc.collect()
    assert sys.getrefcount(q) == before    # and lets it go with the call: the deleter ran


# ---- refusals ----------------------------------------------------------------------

class OnDevice:
    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, **kw):
        raise AssertionError("fa3c should refuse the device before exporting")


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_unsupported_dtype(rng, dtype):
    q = DLPackOnly(np.ones((1, 4, 2, 16), dtype=dtype))
    with pytest.raises(TypeError, match="unsupported dtype %s" % dtype):
        fa3c.flash_attn_func(q, q, q)


def test_unsupported_device():
    x = OnDevice(10)   # kDLROCM
    with pytest.raises(fa3c.Fa3cError, match="CPU or CUDA memory.*rocm:0"):
        fa3c.flash_attn_func(x, x, x)


def test_non_integer_metadata(rng):
    q = randn(rng, (5, 2, 16))
    cu = DLPackOnly(np.array([0.0, 5.0], dtype=np.float32))
    with pytest.raises(fa3c.Fa3cError, match="integer arrays"):
        fa3c.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5)


# ---- torch CPU tensors behind a bare object (DLPack, no autograd) ------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cpu_through_dlpack(dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if dtype == "bfloat16":
        ml_dtypes_or_skip()   # the numpy output of a bfloat16 call
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 32, dtype=getattr(torch, dtype)) for n, h in ((9, 4), (13, 2), (13, 2)))
    out = fa3c.flash_attn_func(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), causal=True)
    assert isinstance(out, np.ndarray) and out.dtype.name == dtype
    want = fa3c.flash_attn_func(q, k, v, causal=True)   # the torch front end, same CPU kernels
    np.testing.assert_array_equal(out.astype(np.float32), want.float().numpy())


# ---- JAX ------------------------------------------------------------------------------

def test_jax_cpu(rng):
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax to run this test)")
    jnp = jax.numpy
    # a GPU machine's JAX puts new arrays on the GPU unless told otherwise
    with jax.default_device(jax.devices("cpu")[0]):
        jax_cpu_calls(jax, jnp, rng)


def jax_cpu_calls(jax, jnp, rng):
    for dtype in ("float32", "bfloat16", "float8_e4m3fn"):
        q, k, v = (jnp.asarray(x).astype(getattr(jnp, dtype)) for x in qkv(rng))
        out, lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
        assert out.dtype == (jnp.bfloat16 if dtype == "float8_e4m3fn" else q.dtype)
        if dtype == "float32":   # the same values through numpy: the same bits
            want_out, want_lse = fa3c.flash_attn_func(*(np.asarray(x) for x in (q, k, v)), causal=True,
                                                      return_attn_probs=True)
            np.testing.assert_array_equal(np.asarray(out), want_out)
            np.testing.assert_array_equal(np.asarray(lse), want_lse)
    # backward, kv cache (FA3's 4-tuple: every array JAX's), varlen metadata as JAX arrays
    q, k, v = (jnp.asarray(x) for x in qkv(rng))
    out, lse = fa3c.forward(q, k, v, causal=True)
    dout = jnp.asarray(randn(rng, q.shape))
    grads = fa3c.backward(dout, q, k, v, out, lse, causal=True)
    want = fa3c.backward(*(np.asarray(x) for x in (dout, q, k, v, out, lse)), causal=True)
    for g, w in zip(grads, want):
        assert isinstance(g, jax.Array)
        np.testing.assert_array_equal(np.asarray(g), w)
    res = fa3c.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=jnp.array([5, 13], jnp.int32),
                                       causal=True, return_softmax_lse=True)
    assert len(res) == 4 and all(isinstance(x, jax.Array) for x in res)
    cu = jnp.array([0, 4, 9], jnp.int32)
    vo = fa3c.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, causal=True)
    qn, cun = np.asarray(q[0]), np.asarray(cu)
    np.testing.assert_array_equal(np.asarray(vo), fa3c.flash_attn_varlen_func(qn, qn, qn, cun, cun, 5, 5,
                                                                              causal=True))
    # flash_attn_combine: array math in JAX itself
    op, lp = randn(rng, (3, 2, 5, 4, 32)), randn(rng, (3, 2, 5, 4))
    lp[2] = -np.inf
    lp[:, 0, 0, 0] = -np.inf
    got_out, got_lse = fa3c.flash_attn_combine(jnp.asarray(op), jnp.asarray(lp))
    want_out, want_lse = fa3c.flash_attn_combine(op, lp)
    assert isinstance(got_out, jax.Array) and isinstance(got_lse, jax.Array)
    np.testing.assert_allclose(np.asarray(got_out), want_out, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_lse), want_lse, atol=1e-6)


# ---- CuPy -----------------------------------------------------------------------------

def test_cupy():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed (it needs a CUDA GPU)")
    if cp.cuda.runtime.getDeviceCount() == 0 or not fa3c.cuda_available():
        pytest.skip("CuPy arrays need a GPU that libfa3c's CUDA backend can use")
    rs = np.random.default_rng(3)
    qn, kn, vn = qkv(rs, np.float16, sq=64, sk=96, d=128)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:   # fa3c runs on CuPy's current stream
        q, k, v = (cp.asarray(x) for x in (qn, kn, vn))
        out, lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert isinstance(out, cp.ndarray) and out.dtype == cp.float16 and isinstance(lse, cp.ndarray)
        got_out, got_lse = out.get(), lse.get()
    want, want_lse = ref.fwd(qn, kn, vn, None, True)
    assert np.max(np.abs(got_out.astype(np.float64) - want)) < 5e-3
    assert np.max(np.abs(got_lse - want_lse)) < 1e-2


# ---- GPU arrays through DLPack, with torch as their producer ------------------------------

def _gpu_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    if not fa3c.cuda_available():
        pytest.skip("libfa3c at %s has no usable CUDA backend" % fa3c.library_path())
    return torch


class FakeXP:
    """An array library fa3c knows nothing about but its namespace: its arrays live on the
    GPU (torch memory underneath) and its streams are unknown, so fa3c runs on the legacy
    default stream and waits for it."""
    __name__ = "fake_xp"

    def __init__(self, torch):
        self.torch = torch
        for name in ("float32", "float16", "bfloat16", "int32"):
            setattr(self, name, getattr(torch, name))

    def empty(self, shape, dtype):
        return NsArray(self.torch.empty(shape, dtype=dtype, device="cuda"), self)

    def asarray(self, a):
        return NsArray(self.torch.as_tensor(a, device="cuda"), self)

    def ascontiguousarray(self, x):
        return NsArray(x.t.contiguous(), self)


class NsArray(DLPackOnly):
    def __init__(self, t, xp):
        super().__init__(t)
        self.t, self.xp = t, xp

    @property
    def shape(self):
        return tuple(self.t.shape)

    def __array_namespace__(self):
        return self.xp


def _side_stream_inputs(torch):
    """q written on a side stream behind ~0.1 s of spinning: a reader not ordered after
    that stream reads zeros."""
    torch.manual_seed(8)
    q_src = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q_src), torch.randn_like(q_src)
    want = fa3c.flash_attn_func(q_src, k, v)
    q = torch.zeros_like(q_src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        q.copy_(q_src)
    return s, q, k, v, want


def test_gpu_bare_object_gets_torch_outputs():
    torch = _gpu_torch()
    s, q, k, v, want = _side_stream_inputs(torch)
    wq = DLPackOnly(q)
    with torch.cuda.stream(s):   # fa3c runs on torch's current stream, behind the write of q
        out = fa3c.flash_attn_func(wq, DLPackOnly(k), DLPackOnly(v))
    assert wq.streams and all(x == s.cuda_stream for x in wq.streams)
    s.synchronize()
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.bfloat16
    assert torch.equal(out, want)


def test_gpu_other_library_legacy_stream():
    torch = _gpu_torch()
    xp = FakeXP(torch)
    s, q, k, v, want = _side_stream_inputs(torch)
    wq = NsArray(q, xp)
    with torch.cuda.stream(s):
        # fa3c asks the producer (torch, whose current stream wrote q) to order that write
        # before the legacy default stream (DLPack's stream 1), runs there, and waits for
        # it before returning.
        out = fa3c.flash_attn_func(wq, NsArray(k, xp), NsArray(v, xp))
    assert wq.streams and all(x == 1 for x in wq.streams)
    assert isinstance(out, NsArray)
    assert torch.equal(out.t, want)
    # metadata from the host is copied to the device through the namespace
    lens = np.array([100, 512], dtype=np.int32)
    got = fa3c.flash_attn_with_kvcache(NsArray(q[:, :1], xp), NsArray(k, xp), NsArray(v, xp),
                                       cache_seqlens=lens, causal=True)
    ref_out = fa3c.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=torch.tensor(lens, device="cuda"),
                                           causal=True)
    assert torch.equal(got.t, ref_out)


def test_gpu_mixed_devices_refused():
    torch = _gpu_torch()
    q = np.ones((1, 8, 2, 64), np.float16)
    k = DLPackOnly(torch.ones(1, 8, 2, 64, dtype=torch.float16, device="cuda"))
    with pytest.raises(fa3c.Fa3cError, match="q's device, cpu:0 .got one on cuda:0"):
        fa3c.flash_attn_func(q, k, k)


def test_read_only_out_is_refused(rng):
    """out= marked read-only by its producer (DLPack 1.x flags; numpy 2 marks non-writeable
    arrays): refused, never written."""
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    out = np.zeros_like(q)
    out.flags.writeable = False
    try:
        capsule_flags = _arrays.ArrayOps(q).view(out).flags
    except BufferError:
        pytest.skip("this numpy does not export read-only arrays through DLPack")
    if not capsule_flags & 1:
        pytest.skip("this numpy exports no DLPack 1.x flags")
    with pytest.raises(fa3c.Fa3cError, match="read-only"):
        fa3c.prepare_forward(q, q, q, out=out)
    assert not out.any()
