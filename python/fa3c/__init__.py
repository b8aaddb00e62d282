"""fa3c: FlashAttention-3 in C for Hopper GPUs, with a CPU backend.

A ctypes binding over libfa3c's C ABI with the official FA3
`flash_attn_interface` API:

    import fa3c
    out = fa3c.flash_attn_func(q, k, v, causal=True)                 # torch, numpy, ...
    out, lse = fa3c.flash_attn_func(q, k, v, return_attn_probs=True)

torch CUDA tensors run on the CUDA backend on torch's current stream, with
autograd and torch.compile support (custom ops fa3c::fwd / fa3c::bwd); torch
CPU tensors run on the CPU backend. Any other array with __dlpack__ (numpy,
with ml_dtypes for bfloat16 / float8_e4m3fn; CuPy; JAX) runs on the backend of
its memory, read through DLPack (_arrays). torch is optional: `import fa3c`
needs only numpy.

FA3 code runs unchanged after fa3c.install_flash_attn_interface(), which makes
`import flash_attn_interface` give fa3c.flash_attn_interface (an installed FA3
is not shadowed unless force=True).

The library is found through FA3C_LIBRARY=/path/to/libfa3c.so if set, else the
libfa3c.so installed inside this package.
"""
import sys as _sys

from ._lib import (Fa3cError, cuda_available, e4m3_to_float, float_to_e4m3, last_error,
                   library_path, status_string, version,
                   STATUS_OK, STATUS_INVALID_ARGUMENT, STATUS_NOT_SUPPORTED,
                   STATUS_OUT_OF_MEMORY, STATUS_NO_DEVICE, STATUS_CUDA_ERROR,
                   STATUS_INTERNAL_ERROR)
from .interface import (append_kv, backward, flash_attn_combine, fp8_attention, flash_attn_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_with_kvcache, forward,
                        get_scheduler_metadata, prepare_backward, prepare_forward, quantize_fp8)
from ._dropin import install_flash_attn_interface

from ._lib import PACKAGE_VERSION as __version__

__all__ = [
    "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
    "flash_attn_with_kvcache", "flash_attn_combine", "get_scheduler_metadata",
    "install_flash_attn_interface",
    "forward", "backward", "prepare_forward", "prepare_backward", "append_kv",
    "quantize_fp8", "fp8_attention",
    "Fa3cError", "version",
    "cuda_available", "library_path", "last_error", "status_string",
    "float_to_e4m3", "e4m3_to_float",
]

# Register the torch custom ops now when torch is already loaded, so that the
# first call happens outside any torch.compile trace.
if _sys.modules.get("torch") is not None:
    from . import _torch  # noqa: F401
