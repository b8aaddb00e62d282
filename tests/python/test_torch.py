"""torch tensors: CPU tensors on the CPU backend, CUDA tensors on the CUDA backend.

Skipped as a whole when torch is not installed (CI installs numpy only); the GPU
tests skip unless an sm_90 GPU is present and libfa3c was built with CUDA.
References are computed in torch from the math (float64), gradients through torch
autograd of that reference.
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only; "
                            "run on the GPU machine for these tests)")

import fa3c  # noqa: E402


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return "needs an sm_90 GPU (found sm_%d%d)" % cap
    if not fa3c.cuda_available():
        return "libfa3c at %s has no usable CUDA backend" % fa3c.library_path()
    return None


GPU_SKIP = _gpu_skip_reason()
gpu = pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))


# ---- reference ------------------------------------------------------------------------

def key_mask(sq, sk, causal, window, device):
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def attention_ref(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, upcast=True):
    """(b, s, h, d) attention. upcast=True: float64 math (the oracle); upcast=False: the
    naive computation in the input precision (scores, probabilities and output rounded)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k).float() * scale if not upcast else \
        torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = key_mask(q.shape[1], k.shape[1], causal, window, q.device)
    rows = ok.any(-1, keepdim=True)
    s = s.masked_fill(~ok, float("-inf")).masked_fill(~rows, 0.0)
    p = torch.softmax(s, dim=-1) * rows
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~rows[..., 0], float("-inf"))
    return out, lse


def check(got, want, naive, atol, what):
    got = got.double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), "%s: non-finite values" % what
    err = (got - want).abs().max().item()
    nerr = (naive.double() - want).abs().max().item()
    rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err <= 2 * nerr + atol, ("%s: max error %.3g > 2 x naive %.3g + %g (rel L2 %.3g)"
                                    % (what, err, nerr, atol, rel))


ATOL = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def rand(shape, dtype, device, requires_grad=False):
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def run_fwd(device, dtype, b, sq, sk, hq, hkv, d, **kw):
    q, k, v = rand((b, sq, hq, d), dtype, device), rand((b, sk, hkv, d), dtype, device), rand((b, sk, hkv, d), dtype, device)
    out, lse = fa3c.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert out.dtype == dtype and out.device == q.device
    rk = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
              softcap=kw.get("softcap", 0.0), scale=kw.get("softmax_scale"))
    want, want_lse = attention_ref(q, k, v, **rk)
    naive, _ = attention_ref(q, k, v, upcast=False, **rk)
    tag = "%s %s b%d sq%d sk%d h%d/%d d%d %s" % (device, dtype, b, sq, sk, hq, hkv, d, kw)
    check(out, want, naive, ATOL[dtype], tag)
    fin = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), fin), tag + ": -inf rows of lse differ"
    assert (lse.double()[fin] - want_lse[fin]).abs().max().item() < 1e-3, tag + ": lse"


def run_grad(device, dtype, b, sq, sk, hq, hkv, d, atol_scale=1.0, **kw):
    q, k, v = (rand(s, dtype, device, True) for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))
    out = fa3c.flash_attn_func(q, k, v, **kw)
    g = torch.randn_like(out)
    try:
        grads = torch.autograd.grad(out, (q, k, v), g)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED and device != "cpu":
            pytest.skip("no backward on the %s backend for this case yet: %s" % (device, e))
        raise
    rk = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
              softcap=kw.get("softcap", 0.0))
    want = torch.autograd.grad(attention_ref(q, k, v, **rk)[0], (q, k, v), g.double())
    naive = torch.autograd.grad(attention_ref(q, k, v, upcast=False, **rk)[0], (q, k, v), g)
    for name, a, w, n in zip(("dq", "dk", "dv"), grads, want, naive):
        assert a.dtype == dtype and a.shape == w.shape
        check(a, w, n, ATOL[dtype] * 10 * atol_scale, "%s %s %s" % (name, dtype, kw))


# ---- CPU tensors -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 33), (31, 31), (45, 20)])
def test_cpu_forward(dtype, causal, sq, sk):
    torch.manual_seed(sq * 100 + sk)
    run_fwd("cpu", dtype, 2, sq, sk, 6, 2, 64, causal=causal)


@pytest.mark.parametrize("kw", [dict(window_size=(5, 2)), dict(softcap=2.0), dict(softmax_scale=0.5)])
def test_cpu_forward_options(kw):
    torch.manual_seed(1)
    run_fwd("cpu", torch.float32, 2, 40, 50, 4, 4, 32, **kw)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(6, 1)), dict(softcap=3.0)])
def test_cpu_autograd(kw):
    torch.manual_seed(2)
    run_grad("cpu", torch.float32, 2, 30, 41, 4, 2, 32, **kw)


def test_cpu_varlen_autograd():
    torch.manual_seed(3)
    lens_q, lens_k = [3, 17, 8], [10, 17, 2]
    cu_q = torch.tensor([0, 3, 20, 28], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 27, 29], dtype=torch.int32)
    q = torch.randn(28, 4, 32, requires_grad=True)
    k = torch.randn(29, 2, 32, requires_grad=True)
    v = torch.randn(29, 2, 32, requires_grad=True)
    out = fa3c.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    for b in range(3):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        want = attention_ref(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal=True)[0]
        assert (out[qs:qe].double() - want[0]).abs().max() < 1e-5
        wg = torch.autograd.grad(want, (q, k, v), g[None, qs:qe].double())
        # each sequence's reference gradient touches only its own rows
        for a, w in zip(grads, wg):
            sl = slice(qs, qe) if a.shape[0] == 28 else slice(ks, ke)
            assert (a[sl].double() - w[sl]).abs().max() < 1e-4


def test_cpu_seqused_q_autograd():
    """seqused_q: each sequence keeps only its first queries (the causal diagonal aligned to
    that count); their out and gradients are those of the shortened sequences, dq past them
    is zeros."""
    torch.manual_seed(4)
    cu_q = torch.tensor([0, 3, 20, 28], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 27, 29], dtype=torch.int32)
    used = torch.tensor([2, 17, 0], dtype=torch.int32)
    q = torch.randn(28, 4, 32, requires_grad=True)
    k = torch.randn(29, 2, 32, requires_grad=True)
    v = torch.randn(29, 2, 32, requires_grad=True)
    out = fa3c.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, seqused_q=used, causal=True)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    want_dk, want_dv = torch.zeros_like(dk, dtype=torch.float64), torch.zeros_like(dv, dtype=torch.float64)
    for b in range(3):
        qs, ks, ke, n = int(cu_q[b]), int(cu_k[b]), int(cu_k[b + 1]), int(used[b])
        assert (dq[qs + n:int(cu_q[b + 1])] == 0).all()
        if n == 0:
            continue
        want = attention_ref(q[None, qs:qs + n], k[None, ks:ke], v[None, ks:ke], causal=True)[0]
        assert (out[qs:qs + n].double() - want[0]).abs().max() < 1e-5
        wq, wk, wv = torch.autograd.grad(want, (q, k, v), g[None, qs:qs + n].double())
        assert (dq[qs:qs + n].double() - wq[qs:qs + n]).abs().max() < 1e-4
        want_dk += wk
        want_dv += wv
    assert (dk.double() - want_dk).abs().max() < 1e-4
    assert (dv.double() - want_dv).abs().max() < 1e-4


def test_cpu_compile_fullgraph():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 3 * 64)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.proj(x).view(b, s, 3, 4, 16).unbind(2)
            return fa3c.flash_attn_func(q, k, v, causal=True).reshape(b, s, 64)

    torch.manual_seed(4)
    m = Block()
    x = torch.randn(2, 24, 64, requires_grad=True)
    eager = m(x)
    compiled = torch.compile(m, fullgraph=True)(x)
    assert (eager - compiled).abs().max() < 1e-5
    compiled.sum().backward()  # through fa3c::bwd
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_opcheck_cpu():
    q, k, v = torch.randn(1, 9, 2, 16), torch.randn(1, 11, 1, 16), torch.randn(1, 11, 1, 16)
    sinks = torch.tensor([0.5, -1.0])
    for s in (None, sinks):
        args = (q, k, v, None, None, None, None, None, None, None, 0, 0, 0.25, True, -1, -1, 0.0, 1, False, s)
        torch.library.opcheck(torch.ops.fa3c.fwd.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    # seqused_q, the last argument (default None): out's unused rows are not written, so
    # the output is compared on a varlen call whose queries are all used
    cu = torch.tensor([0, 9], dtype=torch.int32)
    args = (q[0], k[0], v[0], cu, torch.tensor([0, 11], dtype=torch.int32), None, None, None, None, None,
            9, 11, 0.25, True, -1, -1, 0.0, 1, False, None, torch.tensor([9], dtype=torch.int32))
    torch.library.opcheck(torch.ops.fa3c.fwd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_opcheck_cpu_backward():
    torch.manual_seed(12)
    q, k, v = torch.randn(1, 9, 2, 16), torch.randn(1, 11, 1, 16), torch.randn(1, 11, 1, 16)
    for s in (None, torch.tensor([0.5, -1.0])):
        out, lse = fa3c.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, s_aux=s)
        args = (torch.randn_like(out), q, k, v, out, lse, None, None, None, 0, 0, 0.25, True, -1, -1, 0.0,
                False, s)
        torch.library.opcheck(torch.ops.fa3c.bwd.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_lse_is_not_differentiable_but_returned():
    q = torch.randn(1, 6, 2, 16, requires_grad=True)
    out, lse = fa3c.flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad
    assert lse.shape == (1, 2, 6) and lse.dtype == torch.float32


def test_no_grad_path_skips_autograd():
    q = torch.randn(1, 6, 2, 16, requires_grad=True)
    with torch.no_grad():
        out = fa3c.flash_attn_func(q, q, q)
    assert not out.requires_grad


def test_cpu_error_carries_c_message():
    q = torch.randn(1, 8, 2, 12)
    with pytest.raises(fa3c.Fa3cError) as ei:
        fa3c.flash_attn_func(q, q, q)
    assert ei.value.status == fa3c.STATUS_INVALID_ARGUMENT
    assert str(ei.value) == fa3c.last_error() != ""


# ---- CUDA tensors --------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 1000), (113, 203), (256, 256), (1023, 1023), (700, 300)])
def test_gpu_forward(dtype, causal, d, sq, sk):
    torch.manual_seed(sq + sk + d)
    try:
        run_fwd("cuda", dtype, 2, sq, sk, 8, 2, d, causal=causal)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("CUDA backend: %s" % e)
        raise


@gpu
@pytest.mark.parametrize("kw", [dict(window_size=(64, 16)), dict(softcap=30.0), dict(causal=True, window_size=(100, 0))])
def test_gpu_forward_options(kw):
    torch.manual_seed(5)
    try:
        run_fwd("cuda", torch.bfloat16, 2, 500, 640, 8, 8, 128, **kw)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("CUDA backend: %s" % e)
        raise


@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [40, 64, 96, 128, 160, 192, 248, 256])   # 40, 160, 248: on the next wider kernel
@pytest.mark.parametrize("sq,sk", [(128, 128), (333, 333), (200, 517)])
def test_gpu_autograd(causal, d, sq, sk):
    torch.manual_seed(6)
    try:
        run_grad("cuda", torch.bfloat16, 2, sq, sk, 4, 2, d, causal=causal)
    except fa3c.Fa3cError as e:
        # A build may leave a head dim's kernels out (FA3C_INSTANCES): skip, saying so.
        if e.status == fa3c.STATUS_NOT_SUPPORTED and ("in this build" in str(e) or "FA3C_INSTANCES" in str(e)):
            pytest.skip("CUDA backward: %s" % e)
        raise


@gpu
def test_gpu_packed_qkv_strides():
    torch.manual_seed(7)
    qkv = torch.randn(2, 300, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    out = fa3c.flash_attn_qkvpacked_func(qkv, causal=True)
    want = attention_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)[0]
    naive = attention_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True, upcast=False)[0]
    check(out, want, naive, 1e-3, "packed qkv")


@gpu
def test_gpu_broadcast_inputs():
    """Stride-0 (expanded) k and v: the CUDA kernels need positive strides, so the
    binding copies them; the result must match the reference."""
    torch.manual_seed(8)
    q = torch.randn(2, 200, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 1, 128, device="cuda", dtype=torch.bfloat16).expand(2, 300, 4, 128)
    v = torch.randn(1, 300, 4, 128, device="cuda", dtype=torch.bfloat16).expand(2, 300, 4, 128)
    out = fa3c.flash_attn_func(q, k, v, causal=True)
    want = attention_ref(q, k, v, causal=True)[0]
    naive = attention_ref(q, k, v, causal=True, upcast=False)[0]
    check(out, want, naive, 1e-3, "broadcast k, v")


@gpu
def test_gpu_uses_current_stream():
    """fa3c must run on torch's current stream: q is written on a side stream after a long
    sleep, and fa3c is queued behind it on that stream. On any other stream it would read
    the stale zeros."""
    torch.manual_seed(8)
    q_src = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.zeros_like(q_src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on s
        q.copy_(q_src)
        out = fa3c.flash_attn_func(q, k, v)
    s.synchronize()
    want = attention_ref(q_src, k, v)[0]
    naive = attention_ref(q_src, k, v, upcast=False)[0]
    check(out, want, naive, 1e-3, "side stream")


@gpu
def test_gpu_compile_fullgraph():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(512, 3 * 512)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.proj(x).view(b, s, 3, 4, 128).unbind(2)
            return fa3c.flash_attn_func(q, k, v, causal=True).reshape(b, s, 512)

    torch.manual_seed(9)
    m = Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = m(x)
    compiled = torch.compile(m, fullgraph=True)(x)
    assert (eager.float() - compiled.float()).abs().max() < 2e-2
    try:
        compiled.float().sum().backward()
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("forward compiled fine; no CUDA backward yet: %s" % e)
        raise
    assert torch.isfinite(x.grad).all()


@gpu
def test_gpu_varlen():
    torch.manual_seed(10)
    cu = torch.tensor([0, 100, 350, 351], dtype=torch.int32, device="cuda")
    q = torch.randn(351, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    try:
        out = fa3c.flash_attn_varlen_func(q, k, v, cu, cu, 250, 250, causal=True)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("CUDA backend has no varlen yet: %s" % e)
        raise
    for b in range(3):
        a, e_ = cu[b].item(), cu[b + 1].item()
        want = attention_ref(q[None, a:e_], k[None, a:e_], v[None, a:e_], causal=True)[0][0]
        naive = attention_ref(q[None, a:e_], k[None, a:e_], v[None, a:e_], causal=True, upcast=False)[0][0]
        check(out[a:e_], want, naive, 1e-3, "varlen seq %d" % b)


@gpu
def test_gpu_seqused_q_forward():
    """seqused_q on the CUDA forward: each sequence's first queries, the causal diagonal
    aligned to them (the rows past them are not written), and the backward."""
    torch.manual_seed(11)
    cu_q = torch.tensor([0, 100, 350, 351], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 300, 400, 1000], dtype=torch.int32, device="cuda")
    used = torch.tensor([37, 250, 0], dtype=torch.int32, device="cuda")
    q = torch.randn(351, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1000, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = fa3c.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 250, 600, seqused_q=used, causal=True)
    for b in range(3):
        qs, qe, ks, ke, n = (int(x) for x in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1], used[b]))
        if n:
            args = (q[None, qs:qs + n], k[None, ks:ke], v[None, ks:ke])
            want = attention_ref(*args, causal=True)[0][0]
            naive = attention_ref(*args, causal=True, upcast=False)[0][0]
            check(out[qs:qs + n], want, naive, 1e-3, "seqused_q seq %d" % b)
    # The backward: each sequence's gradients from its used queries; dq is 0 past them.
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(out)
    fa3c.flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, 250, 600, seqused_q=used, causal=True).backward(dout)
    want = {u: [torch.zeros_like(t, dtype=torch.float32 if u else t.dtype) for t in (q, k, v)] for u in (True, False)}
    for b in range(3):
        qs, qe, ks, ke, n = (int(x) for x in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1], used[b]))
        if not n:
            continue
        for upcast in (True, False):
            args = [t.detach()[qs:qs + n] if i == 0 else t.detach()[ks:ke] for i, t in enumerate((q, k, v))]
            args = [a.float().requires_grad_() if upcast else a.requires_grad_() for a in args]
            o = attention_ref(*(a[None] for a in args), causal=True, upcast=upcast)[0][0]
            o.backward(dout[qs:qs + n].to(o.dtype))
            w = want[upcast]
            w[0][qs:qs + n] += args[0].grad.to(w[0].dtype)
            w[1][ks:ke] += args[1].grad.to(w[1].dtype)
            w[2][ks:ke] += args[2].grad.to(w[2].dtype)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = (qg, kg, vg)[i].grad
        check(got, want[True][i], want[False][i], 1e-3, "seqused_q backward " + name)
    assert torch.all(qg.grad[37:100] == 0) and torch.all(qg.grad[350:351] == 0), "dq past the queries used"


@gpu
@pytest.mark.parametrize("page_size,num_splits", [(16, 1), (1, 0), (64, 4)])
def test_gpu_kvcache_packed_queries_paged(page_size, num_splits):
    # The serving call (SGLang: pages of 1; vLLM: 16): packed queries, a shuffled paged cache
    # filled to cache_seqlens, GQA 4, causal per sequence, split-KV auto or asked.
    torch.manual_seed(12 + page_size)
    b, hq, hkv, d, pages_per_seq = 4, 16, 4, 128, 1024 // page_size
    lens_q, lens = [1, 5, 1, 37], [700, 1, 1024, 300]
    cu_q = torch.tensor([sum(lens_q[:i]) for i in range(b + 1)], dtype=torch.int32, device="cuda")
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    npages = b * pages_per_seq
    kp = torch.randn(npages, page_size, hkv, d, device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    page_table = torch.randperm(npages, device="cuda").to(torch.int32).view(b, pages_per_seq)
    q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=torch.bfloat16)
    try:
        out, lse, *_ = fa3c.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=cache_seqlens, page_table=page_table,
                                                    cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q), causal=True,
                                                    num_splits=num_splits, return_softmax_lse=True)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("CUDA backend without the variable-length kernels: %s" % e)
        raise
    assert out.shape == q.shape and lse.shape == (hq, sum(lens_q))
    for i in range(b):
        a, e_ = cu_q[i].item(), cu_q[i + 1].item()
        kseq = kp[page_table[i].long()].reshape(-1, hkv, d)[:lens[i]][None]
        vseq = vp[page_table[i].long()].reshape(-1, hkv, d)[:lens[i]][None]
        want, want_lse = attention_ref(q[None, a:e_], kseq, vseq, causal=True)
        naive, _ = attention_ref(q[None, a:e_], kseq, vseq, causal=True, upcast=False)
        what = "pages of %d, %d splits, seq %d" % (page_size, num_splits, i)
        check(out[a:e_], want[0], naive[0], 1e-3, what)
        got_lse, fin = lse[:, a:e_].double(), torch.isfinite(want_lse[0])   # sequence 1: queries without keys
        assert torch.equal(torch.isfinite(got_lse), fin), what + ": -inf rows of lse differ"
        assert (got_lse[fin] - want_lse[0][fin]).abs().max().item() < 1e-3, what + ": lse"


@gpu
def test_gpu_fp8_forward():
    torch.manual_seed(11)
    b, s, h, d = 2, 512, 4, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda") for _ in range(3))
    descale = torch.full((b, h), 0.5, device="cuda")
    q8, k8, v8 = ((x / 0.5).to(torch.float8_e4m3fn) for x in (q, k, v))
    try:
        out = fa3c.flash_attn_func(q8, k8, v8, q_descale=descale, k_descale=descale, v_descale=descale)
    except fa3c.Fa3cError as e:
        if e.status == fa3c.STATUS_NOT_SUPPORTED:
            pytest.skip("CUDA backend has no fp8 yet: %s" % e)
        raise
    assert out.dtype == torch.bfloat16
    deq = [x.double() * 0.5 for x in (q8, k8, v8)]
    want = attention_ref(*deq)[0]
    rel = ((out.double() - want).norm() / want.norm()).item()
    assert rel < 5e-2, "fp8 rel L2 error %.3g" % rel


@gpu
def test_gpu_error_carries_c_message():
    q = torch.randn(1, 8, 2, 12, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(fa3c.Fa3cError) as ei:
        fa3c.flash_attn_func(q, q, q)
    assert str(ei.value) == fa3c.last_error() != ""


@gpu
def test_opcheck_gpu():
    q = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    for s in (None, torch.tensor([0.5, -1.0], device="cuda")):
        args = (q, q, q, None, None, None, None, None, None, None, 0, 0, 0.088, True, -1, -1, 0.0, 1, False, s)
        torch.library.opcheck(torch.ops.fa3c.fwd.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@gpu
@pytest.mark.parametrize("paged", [False, True])
def test_gpu_append_kv_matches_cpu(paged):
    # fa3c.append_kv on GPU tensors (the append kernel, rotary on k and q, packed new keys)
    # against the same call on CPU tensors (checked in float64 by test_append_rotary.c)
    torch.manual_seed(0)
    b, hkv, hq, d, cap = 3, 2, 4, 128, 24
    shape = (b * 6, 4, hkv, d) if paged else (b, cap, hkv, d)
    kc, vc = torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16)
    kn, vn = torch.randn(7, hkv, d, dtype=torch.bfloat16), torch.randn(7, hkv, d, dtype=torch.bfloat16)
    q = torch.randn(b, 2, hq, d, dtype=torch.bfloat16)
    ang = torch.arange(40.0)[:, None] * 10000.0 ** (-torch.arange(32.0) / 32)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    lens, cu = torch.tensor([0, 9, 20], dtype=torch.int32), torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    table = torch.arange(b * 6, dtype=torch.int32).flip(0).reshape(b, 6) if paged else None
    outs = []
    for dev in ("cpu", "cuda"):
        kc_d, vc_d = kc.clone().to(dev), vc.clone().to(dev)
        q_rot = fa3c.append_kv(kc_d, vc_d, kn.to(dev), vn.to(dev), lens.to(dev),
                               page_table=None if table is None else table.to(dev), cu_seqlens_new=cu.to(dev),
                               rotary_cos=cos.to(dev), rotary_sin=sin.to(dev), q=q.to(dev), q_by_row=True)
        outs.append([x.cpu().float() for x in (kc_d, vc_d, q_rot)])
    for name, a, g in zip(("k_cache", "v_cache", "q rotated"), *outs):
        torch.testing.assert_close(g, a, rtol=2 ** -7, atol=0, msg=name)
    assert torch.equal(outs[0][1], outs[1][1])   # values are copied, bit for bit


@gpu
def test_gpu_kvcache_step_with_rotary_and_batch_idx():
    # FA3's decode step in one call on GPU tensors (append k, v rotated, q rotated, rows picked by
    # cache_batch_idx, attention) against the same call on CPU tensors
    torch.manual_seed(5)
    b, hq, hkv, d, cap, n = 3, 8, 2, 128, 64, 2
    kc, vc = torch.randn(4, cap, hkv, d, dtype=torch.bfloat16), torch.randn(4, cap, hkv, d, dtype=torch.bfloat16)
    q = torch.randn(b, n, hq, d, dtype=torch.bfloat16)
    kn, vn = torch.randn(b, n, hkv, d, dtype=torch.bfloat16), torch.randn(b, n, hkv, d, dtype=torch.bfloat16)
    ang = torch.arange(128.0)[:, None] * 10000.0 ** (-torch.arange(32.0) / 32)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    lens, idx = torch.tensor([10, 0, 61], dtype=torch.int32), torch.tensor([3, 0, 1], dtype=torch.int32)
    res = []
    for dev in ("cpu", "cuda"):
        kc_d, vc_d = kc.clone().to(dev), vc.clone().to(dev)
        out = fa3c.flash_attn_with_kvcache(q.to(dev), kc_d, vc_d, kn.to(dev), vn.to(dev), rotary_cos=cos.to(dev),
                                           rotary_sin=sin.to(dev), cache_seqlens=lens.to(dev),
                                           cache_batch_idx=idx.to(dev), causal=True)
        res.append([x.cpu().float() for x in (out, kc_d, vc_d)])
    torch.testing.assert_close(res[1][1], res[0][1], rtol=2 ** -7, atol=0, msg="k_cache")
    assert torch.equal(res[1][2], res[0][2]), "v_cache"
    torch.testing.assert_close(res[1][0], res[0][0], rtol=2e-2, atol=2e-2, msg="out")
