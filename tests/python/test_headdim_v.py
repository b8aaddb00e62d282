"""A value head dim other than the key head dim (MLA: q, k 192 with v 128; absorbed
decode 64 / 512): v, out, dout and dv take v's head dim. CPU backend (numpy and torch
CPU), against the float64 reference; the CUDA backend refuses it for now
(NOT_SUPPORTED, tests/gpu)."""
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


def test_shapes_are_checked(rng):
    q = randn(rng, (1, 8, 2, 16))
    with pytest.raises(fa3c.Fa3cError, match="same head dim"):
        fa3c.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(fa3c.Fa3cError, match="same shape but for the head dim"):
        fa3c.flash_attn_func(q, q, q[:, :4, :, :8])
