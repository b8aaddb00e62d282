"""The opt-in switch that lets `import flash_attn_interface` give fa3c's FA3 module."""
import importlib.util
import sys
import warnings

NAME = "flash_attn_interface"


def _other_fa3():
    """Which other flash_attn_interface is there (one imported already, or one Python
    would import), or None."""
    mod = sys.modules.get(NAME)
    if mod is not None:
        return "the imported %r" % mod
    if NAME in sys.modules:      # None there: the import is blocked; nothing to shadow
        return None
    spec = importlib.util.find_spec(NAME)   # finds the file; imports nothing
    return None if spec is None else "the one at %s" % (spec.origin or spec.name)


def install_flash_attn_interface(force=False):
    """Make `import flash_attn_interface` give fa3c.flash_attn_interface (FA3's public
    functions on fa3c), so FA3 code runs on fa3c unchanged. Call it before that code
    imports flash_attn_interface: modules that imported it already keep what they got.
    Only this process is affected; nothing is written to disk.

    A real FlashAttention-3 (already imported, or importable) is not shadowed: it stays,
    with a warning, and the call returns False. force=True replaces it in sys.modules
    for this process, with a warning saying so. Returns True when `import
    flash_attn_interface` now gives fa3c's module."""
    from . import flash_attn_interface as ours
    if sys.modules.get(NAME) is ours:
        return True
    other = _other_fa3()
    if other is not None:
        if not force:
            warnings.warn("fa3c: flash_attn_interface not installed: %s is kept (an installed "
                          "FlashAttention-3 is not shadowed); force=True replaces it in this "
                          "process" % other, stacklevel=2)
            return False
        warnings.warn("fa3c: flash_attn_interface now gives fa3c, replacing %s in this process"
                      % other, stacklevel=2)
    sys.modules[NAME] = ours
    return True
