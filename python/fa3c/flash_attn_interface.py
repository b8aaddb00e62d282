"""FlashAttention-3's `flash_attn_interface` module, backed by fa3c.

FA3's public functions with FA3's names, arguments, defaults and return values,
so that code written for FA3 runs on fa3c unchanged:

    import fa3c; fa3c.install_flash_attn_interface()
    from flash_attn_interface import flash_attn_func     # this module from now on

or, without touching the import system, `from fa3c import flash_attn_interface`.

Not here: FA3's private helpers (_flash_attn_forward, the autograd Function
classes) and its `torch.ops.flash_attn_3` ops (fwd, bwd, fwd_combine,
get_scheduler_metadata). Those ops are FA3's internal C++ ABI (out= buffers,
in-place cache appends, split partials), and an op can be registered under a
name only once per process: fa3c ops named flash_attn_3::* would make a real
FA3 fail to load into the same process later. fa3c's own ops are
torch.ops.fa3c.fwd and torch.ops.fa3c.bwd.
"""
from .interface import (flash_attn_combine, flash_attn_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_with_kvcache, get_scheduler_metadata)

__all__ = [
    "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
    "flash_attn_with_kvcache", "flash_attn_combine", "get_scheduler_metadata",
]
