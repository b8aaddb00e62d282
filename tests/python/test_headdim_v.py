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


def test_shapes_are_checked(rng):
    q = randn(rng, (1, 8, 2, 16))
    with pytest.raises(fa3c.Fa3cError, match="same head dim"):
        fa3c.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(fa3c.Fa3cError, match="same shape but for the head dim"):
        fa3c.flash_attn_func(q, q, q[:, :4, :, :8])
