"""The ABI handshake between the package and libfa3c (python/fa3c/_lib.py):
the loaded library's structs match the package's mirrors field for field,
and a library whose layout differs is refused with a message naming the
difference and both versions. No numpy or torch needed."""
import ctypes

import pytest

import fa3c
from fa3c import _lib


def test_loaded_library_matches_the_mirrors():
    lib = _lib.lib()   # loading runs check_abi; check again explicitly
    _lib.check_abi(lib)
    assert lib.fa3c_struct_layout(b"fa3c_fwd_params", None) == ctypes.sizeof(_lib.FwdParams)
    assert lib.fa3c_struct_layout(b"fa3c_bwd_params", b"backend") == _lib.BwdParams.backend.offset
    assert lib.fa3c_struct_layout(b"fa3c_problem", b"no_such_field") == -1
    assert lib.fa3c_struct_layout(b"no_such_struct", None) == -1
    assert fa3c.__version__ == _lib.version()


class _FakeLib:
    """The real library's answers, but one of them wrong (or the query missing)."""

    def __init__(self, wrong=None, missing=False):
        real = _lib.lib()

        def layout(type_, field):   # a plain function: check_abi sets its restype and argtypes
            got = real.fa3c_struct_layout(type_, field)
            return got + 8 if (type_, field) == wrong else got

        if not missing:
            self.fa3c_struct_layout = layout
        self.fa3c_version = lambda: b"9.9.9"


def test_a_different_struct_size_is_refused():
    with pytest.raises(OSError) as e:
        _lib.check_abi(_FakeLib(wrong=(b"fa3c_fwd_params", None)), "libfake.so")
    msg = str(e.value)
    assert "libfake.so (version 9.9.9)" in msg and "version %s" % fa3c.__version__ in msg
    assert "sizeof(fa3c_fwd_params) %d" % (ctypes.sizeof(_lib.FwdParams) + 8) in msg


def test_a_moved_field_is_refused():
    with pytest.raises(OSError, match=r"fa3c_problem\.num_pages at offset"):
        _lib.check_abi(_FakeLib(wrong=(b"fa3c_problem", b"num_pages")), "libfake.so")


def test_a_library_without_the_query_is_refused():
    with pytest.raises(OSError, match="predates"):
        _lib.check_abi(_FakeLib(missing=True), "libold.so")
