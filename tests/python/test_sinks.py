"""Attention sinks (one logit per query head in every row's softmax, vLLM's s_aux,
gpt-oss's sinks) through Python, CPU backend: the forward against the identity
lse_s = logaddexp(lse, sink), out_s = out * exp(lse - lse_s) from a call without sinks;
dsinks against its formula -sum(exp(sink - lse_s) * rowsum(dout * out_s)); torch
autograd; the C library's own tests (tests/test_sinks.c) check it against float64
and finite differences."""
import numpy as np
import pytest

import fa3c


def randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def problem(rng):
    q, k, v = randn(rng, (2, 30, 4, 32)), randn(rng, (2, 40, 2, 32)), randn(rng, (2, 40, 2, 32))
    sinks = np.array([0.3, -1.0, 4.0, -np.inf], dtype=np.float32)
    return q, k, v, sinks


def expected(q, k, v, sinks, causal):
    out, lse = fa3c.forward(q, k, v, causal=causal)                 # (b, s, h, d), (b, h, s)
    lse_s = np.logaddexp(lse, sinks[None, :, None])
    return out * np.exp(lse - lse_s).transpose(0, 2, 1)[..., None], lse_s


@pytest.mark.parametrize("causal", [False, True])
def test_numpy(rng, causal):
    q, k, v, sinks = problem(rng)
    out, lse = fa3c.forward(q, k, v, causal=causal, sinks=sinks)
    want_out, want_lse = expected(q, k, v, sinks, causal)
    assert np.max(np.abs(out - want_out)) < 1e-5 and np.max(np.abs(lse - want_lse)) < 1e-5
    dout = randn(rng, out.shape)
    dq, dk, dv, dsinks = fa3c.backward(dout, q, k, v, out, lse, causal=causal, sinks=sinks)
    rowsum = np.einsum("bshd,bshd->bhs", dout.astype(np.float64), out)
    want = -(np.exp(sinks[None, :, None] - lse.astype(np.float64)) * rowsum).sum(axis=(0, 2))
    assert dsinks.shape == (4,) and np.allclose(dsinks, want, rtol=1e-4, atol=1e-5)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # Through the FA3-style entry point, as vLLM passes them.
    assert np.array_equal(fa3c.flash_attn_func(q, k, v, causal=causal, s_aux=sinks), out)


def test_torch_autograd(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    q, k, v, sinks = problem(rng)
    sinks[3] = -2.0
    qt, kt, vt, st = (torch.tensor(x, requires_grad=True) for x in (q, k, v, sinks))
    out, lse = fa3c.flash_attn_func(qt, kt, vt, causal=True, s_aux=st, return_attn_probs=True)
    dout = torch.tensor(randn(rng, tuple(out.shape)))
    out.backward(dout)
    want_out, _ = expected(q, k, v, sinks, True)
    assert np.max(np.abs(out.detach().numpy() - want_out)) < 1e-5
    rowsum = np.einsum("bshd,bshd->bhs", dout.numpy().astype(np.float64), out.detach().numpy())
    want = -(np.exp(sinks[None, :, None] - lse.numpy().astype(np.float64)) * rowsum).sum(axis=(0, 2))
    assert np.allclose(st.grad.numpy(), want, rtol=1e-4, atol=1e-5)
    # q's gradient equals the numpy path's
    dq, _, _, _ = fa3c.backward(dout.numpy(), q, k, v, out.detach().numpy(), lse.numpy(), causal=True,
                                sinks=sinks)
    assert np.max(np.abs(qt.grad.numpy() - dq)) < 1e-5


def test_shape_is_checked(rng):
    q, k, v, sinks = problem(rng)
    with pytest.raises(fa3c.Fa3cError, match="sinks must have shape"):
        fa3c.forward(q, k, v, sinks=sinks[:2])


def test_transformers_attention_takes_s_aux(rng):
    """fa3c.hf's attention function maps s_aux (gpt-oss's sinks) onto fa3c's sinks: the
    eager formula (the sink as one more logit, dropped after the softmax)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    import fa3c.hf
    q, k, v = (torch.tensor(randn(rng, s)) for s in ((1, 4, 20, 32), (1, 2, 20, 32), (1, 2, 20, 32)))
    s_aux = torch.tensor([0.5, -1.0, 2.0, 0.0])

    class Layer:
        is_causal = True

    out, _ = fa3c.hf.attention_forward(Layer(), q, k, v, None, scaling=0.2, s_aux=s_aux)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    logits = (q @ kk.transpose(-1, -2)) * 0.2
    logits = logits.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    full = torch.cat([logits, s_aux.reshape(1, 4, 1, 1).expand(1, 4, 20, 1)], dim=-1)
    want = (torch.softmax(full, dim=-1)[..., :-1] @ vv).transpose(1, 2)
    assert torch.max(torch.abs(out - want)) < 1e-5


def test_empty_backward_gives_zero_dsinks(rng):
    """A backward with nothing to sum (batch 0) gives dsinks = 0, not garbage."""
    q, k, v = (np.zeros((0, 8, 4, 32), np.float32) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    sinks = np.array([0.5, 1.0, -1.0, 2.0], np.float32)
    out, lse = fa3c.forward(q, k, v, sinks=sinks)
    *_, dsinks = fa3c.backward(np.zeros_like(out), q, k, v, out, lse, sinks=sinks)
    assert np.array_equal(dsinks, np.zeros(4, np.float32))


def test_s_aux_as_a_list_on_torch(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    q, k, v, sinks = problem(rng)
    got = fa3c.flash_attn_func(torch.tensor(q), torch.tensor(k), torch.tensor(v), s_aux=[float(x) for x in sinks])
    assert np.array_equal(got.numpy(), fa3c.flash_attn_func(q, k, v, s_aux=sinks))


@pytest.mark.parametrize("causal", [False, True])
def test_torch_cuda_bf16(rng, causal):
    """The CUDA kernels with sinks (bf16, hdim 64, GQA) against the CPU backend on the same
    bf16 values in float32: out and lse in the forward, every gradient and dsinks in the
    backward (autograd through s_aux)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("no Hopper GPU (sm_90): the CUDA kernels with sinks are not exercised here")
    probe = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16, device="cuda")
    try:
        fa3c.forward(probe, probe, probe, sinks=torch.zeros(1, device="cuda"))
    except fa3c.Fa3cError as e:
        if "FA3C_CUDA_SINKS" in str(e):
            pytest.skip("libfa3c was built without the CUDA kernels' sinks (-DFA3C_CUDA_SINKS=0)")
        raise
    q, k, v = (torch.tensor(randn(rng, s)).to(torch.bfloat16)
               for s in ((2, 200, 8, 64), (2, 300, 2, 64), (2, 300, 2, 64)))
    sinks = torch.tensor([0.3, -1.0, 4.0, -np.inf, 2.0, 6.0, -3.0, 1.0])
    dout = torch.tensor(randn(rng, (2, 200, 8, 64))).to(torch.bfloat16)
    grads = []
    for dev, dt in (("cuda", torch.bfloat16), ("cpu", torch.float32)):
        qt, kt, vt = (x.to(dev, dt).requires_grad_() for x in (q, k, v))
        st = sinks.to(dev).requires_grad_()
        out, lse = fa3c.flash_attn_func(qt, kt, vt, causal=causal, s_aux=st, return_attn_probs=True)
        out.backward(dout.to(dev, dt))
        grads.append([x.detach().float().cpu() for x in (out, lse, qt.grad, kt.grad, vt.grad, st.grad)])
    names = ("out", "lse", "dq", "dk", "dv", "dsinks")
    for name, g, c in zip(names, *grads):
        scale = c.abs().max().item() + 1e-6
        err = (g - c).abs().max().item()
        assert err <= 2e-2 * scale, "%s: max err %g against a scale of %g" % (name, err, scale)
