"""fa3c_fwd_check_device through Python: FA3C_CHECK_METADATA=1 (here: the module flag it
sets) makes every call check its device-resident metadata first. On the CPU the arrays are
host memory and are checked anyway, so the check must agree with the call; on a GPU a
seqused_k past the cache, which the kernels clamp silently, must raise, naming the entry."""
import numpy as np
import pytest

import fa3c
from fa3c import _core


def cache_problem(xp_zeros, seqused):
    q = xp_zeros((2, 1, 4, 64))
    k = xp_zeros((2, 64, 4, 64))
    return q, k, k, seqused


def test_cpu_check_agrees_with_the_call(monkeypatch):
    monkeypatch.setattr(_core, "CHECK_METADATA", True)
    q, k, v, _ = cache_problem(lambda s: np.zeros(s, np.float32), None)
    out, lse = fa3c.forward(q, k, v, seqused_k=np.array([64, 3], np.int32))
    assert out.shape == q.shape and np.all(np.isfinite(lse))
    with pytest.raises(fa3c.Fa3cError, match=r"problem\.seqused_k\[0\]"):
        fa3c.forward(q, k, v, seqused_k=np.array([5000, 3], np.int32))


def test_gpu_seqused_past_the_cache_is_named(monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("no Hopper GPU (sm_90): the device-side check is not exercised here")
    zeros = lambda s: torch.zeros(s, dtype=torch.bfloat16, device="cuda")  # noqa: E731
    q, k, v, _ = cache_problem(zeros, None)
    bad = torch.tensor([5000, 3], dtype=torch.int32, device="cuda")
    fa3c.forward(q, k, v, seqused_k=bad)   # the kernels clamp it: no error without the check
    monkeypatch.setattr(_core, "CHECK_METADATA", True)
    with pytest.raises(fa3c.Fa3cError, match=r"problem\.seqused_k\[0\].*5000"):
        fa3c.forward(q, k, v, seqused_k=bad)
    good = torch.tensor([64, 3], dtype=torch.int32, device="cuda")
    fa3c.forward(q, k, v, seqused_k=good)
