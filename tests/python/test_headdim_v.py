"""A value head dim other than the key head dim (MLA: q, k 192 with v 128; absorbed
decode 64 / 512): v, out, dout and dv take v's head dim. CPU backend (numpy and torch
CPU), against the float64 reference; the CUDA backend (bf16 / fp16, both head dims up to
256, on the kernel of the wider one) against the same reference, and its refusal above 256."""
import numpy as np
import pytest

import fa3c
import attn_reference as ref


def randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("d,dv,causal", [(32, 16, False), (32, 64, True), (24, 40, False)])
def test_numpy_forward_backward(rng, d, dv, causal):
    q, k = randn(rng, (2, 40, 4, d)), randn(rng, (2, 50, 2, d))
    v, dout = randn(rng, (2, 50, 2, dv)), randn(rng, (2, 40, 4, dv))
    out, lse = fa3c.forward(q, k, v, causal=causal)
    assert out.shape == (2, 40, 4, dv)
    want, want_lse = ref.fwd(q, k, v, causal=causal)
    assert np.max(np.abs(out - want)) < 1e-5 and np.max(np.abs(lse - want_lse)) < 1e-5
    dq, dk, dvv = fa3c.backward(dout, q, k, v, out, lse, causal=causal)
    assert (dq.shape, dk.shape, dvv.shape) == (q.shape, k.shape, v.shape)
    for got, exp, name in zip((dq, dk, dvv), ref.bwd(q, k, v, dout, causal=causal), ("dq", "dk", "dv")):
        assert np.max(np.abs(got - exp)) < 1e-4, name


def test_varlen(rng):
    cu = np.array([0, 17, 40], dtype=np.int32)
    q, k, v = randn(rng, (40, 4, 32)), randn(rng, (40, 2, 32)), randn(rng, (40, 2, 16))
    out = fa3c.flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True)
    assert out.shape == (40, 4, 16)
    for a, b in ((0, 17), (17, 40)):
        want, _ = ref.fwd(q[None, a:b], k[None, a:b], v[None, a:b], causal=True)
        assert np.max(np.abs(out[a:b] - want[0])) < 1e-5


def test_torch_autograd(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    q, k = randn(rng, (1, 30, 4, 64)), randn(rng, (1, 30, 4, 64))
    v, dout = randn(rng, (1, 30, 4, 128)), randn(rng, (1, 30, 4, 128))
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out = fa3c.flash_attn_func(qt, kt, vt, causal=True)
    assert tuple(out.shape) == (1, 30, 4, 128)
    out.backward(torch.tensor(dout))
    want_dq, want_dk, want_dv = ref.bwd(q, k, v, dout, causal=True)
    for got, exp, name in ((qt.grad, want_dq, "dq"), (kt.grad, want_dk, "dk"), (vt.grad, want_dv, "dv")):
        assert np.max(np.abs(got.numpy() - exp)) < 1e-4, name


def _gpu_or_skip():
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("no sm_90 GPU")
    return torch


@pytest.mark.parametrize("d,dv,causal", [(192, 128, True), (192, 128, False), (128, 192, True), (64, 40, False)])
def test_cuda_forward_backward(rng, d, dv, causal):
    """MLA prefill's (192, 128) and others on the GPU: out and the gradients against the float64
    reference, in bf16, within twice the error of the same math rounded to bf16 step by step."""
    torch = _gpu_or_skip()
    q, k = randn(rng, (2, 300, 4, d)), randn(rng, (2, 333, 2, d))
    v, dout = randn(rng, (2, 333, 2, dv)), randn(rng, (2, 300, 4, dv))
    qt, kt, vt = (torch.tensor(x, device="cuda", dtype=torch.bfloat16, requires_grad=True) for x in (q, k, v))
    out = fa3c.flash_attn_func(qt, kt, vt, causal=causal)
    assert tuple(out.shape) == (2, 300, 4, dv)
    out.backward(torch.tensor(dout, device="cuda", dtype=torch.bfloat16))
    r = [x.detach().float().cpu().numpy() for x in (qt, kt, vt)]   # the bf16 inputs, exactly
    g = torch.tensor(dout).bfloat16().float().numpy()
    want, _ = ref.fwd(*r, causal=causal)
    assert np.max(np.abs(out.detach().float().cpu().numpy() - want)) < 2e-2
    for got, exp, name in zip((qt.grad, kt.grad, vt.grad), ref.bwd(*r, g, causal=causal), ("dq", "dk", "dv")):
        err = np.max(np.abs(got.float().cpu().numpy() - exp))
        assert err < 2e-2 * max(1.0, float(np.max(np.abs(exp)))), (name, err)


def test_cuda_refuses_over_256(rng):
    torch = _gpu_or_skip()
    q = torch.zeros(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros(1, 8, 2, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(fa3c.Fa3cError, match="headdim_v"):
        fa3c.flash_attn_func(q, q, v)


# ---- qv: absorbed MLA decode's q k^T + qv v^T ------------------------------------------
# The float64 reference through the identity [q, qv] [k, v]^T = q k^T + qv v^T, at the
# default scale (headdim + headdim_v) ** -0.5.

def _qv_reference(q, qv, k, v, causal=False):
    d, dv = q.shape[-1], v.shape[-1]
    return ref.fwd(np.concatenate([q, qv], -1), np.concatenate([k, v], -1), v, scale=(d + dv) ** -0.5,
                   causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_qv_numpy(rng, causal):
    q, qv = randn(rng, (2, 3, 8, 64)), randn(rng, (2, 3, 8, 512))
    k, v = randn(rng, (2, 70, 1, 64)), randn(rng, (2, 70, 1, 512))
    out, lse = fa3c.flash_attn_func(q, k, v, qv=qv, causal=causal, return_attn_probs=True)
    want, want_lse = _qv_reference(q, qv, k, v, causal)
    assert np.max(np.abs(out - want)) < 1e-5 and np.max(np.abs(lse - want_lse)) < 1e-5
    with pytest.raises(fa3c.Fa3cError, match="qv must have shape"):
        fa3c.flash_attn_func(q, k, v, qv=qv[..., :256])


def test_qv_kvcache_paged_torch(rng):
    """Absorbed decode as a serving engine calls it: one query per sequence, a paged latent
    cache (k the rope part, v the latent), 16 query heads on 1 kv head."""
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    lens, page = [37, 5], 16
    q, qv = randn(rng, (2, 1, 16, 64)), randn(rng, (2, 1, 16, 512))
    kc, vc = randn(rng, (6, page, 1, 64)), randn(rng, (6, page, 1, 512))
    table = np.array([[4, 0, 2], [1, 5, 3]], dtype=np.int32)
    t = lambda x: torch.tensor(x)   # noqa: E731
    out = fa3c.flash_attn_with_kvcache(t(q), t(kc), t(vc), qv=t(qv), cache_seqlens=t(np.int32(lens)),
                                       page_table=t(table))
    for b, n in enumerate(lens):
        rows = np.concatenate([np.arange(page) + page * p for p in table[b]])[:n]
        k = kc.reshape(-1, 1, 64)[rows][None]
        v = vc.reshape(-1, 1, 512)[rows][None]
        want, _ = _qv_reference(q[b:b + 1], qv[b:b + 1], k, v)
        assert np.max(np.abs(out[b:b + 1].numpy() - want)) < 1e-5, b


def test_qv_torch_has_no_backward(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    q, k = (torch.tensor(randn(rng, s), requires_grad=True) for s in ((1, 4, 2, 16), (1, 9, 2, 16)))
    v, qv = torch.tensor(randn(rng, (1, 9, 2, 32))), torch.tensor(randn(rng, (1, 4, 2, 32)))
    out = fa3c.flash_attn_func(q, k, v, qv=qv)
    want, _ = _qv_reference(*(x.detach().numpy() for x in (q, qv, k, v)))
    assert np.max(np.abs(out.detach().numpy() - want)) < 1e-5
    with pytest.raises(NotImplementedError, match="qv"):
        out.sum().backward()


def test_qv_cuda_is_not_supported_yet(rng):
    torch = _gpu_or_skip()
    z = lambda *s: torch.zeros(*s, device="cuda", dtype=torch.bfloat16)   # noqa: E731
    with pytest.raises(fa3c.Fa3cError, match="qv"):
        fa3c.flash_attn_func(z(1, 1, 8, 64), z(1, 8, 1, 64), z(1, 8, 1, 128), qv=z(1, 1, 8, 128))


def test_shapes_are_checked(rng):
    q = randn(rng, (1, 8, 2, 16))
    with pytest.raises(fa3c.Fa3cError, match="same head dim"):
        fa3c.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(fa3c.Fa3cError, match="same shape but for the head dim"):
        fa3c.flash_attn_func(q, q, q[:, :4, :, :8])
