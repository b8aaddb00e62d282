"""numpy for the array front end: host views of DLPack memory, and numpy arrays
whose dtype DLPack cannot carry.

numpy exports float32 / float16 (and integers) through DLPack like any other
library; it refuses ml_dtypes' bfloat16 and float8_e4m3fn, so those arrays are
read from numpy's own pointer and strides here. ml_dtypes is imported only when
such an array shows up.
"""
import ctypes

import numpy as np

from . import _dlpack
from ._dlpack import BFLOAT, FLOAT, FLOAT8_E4M3FN, INT, UINT


def dtype(name):
    """The numpy dtype called name: ml_dtypes' for bfloat16 and float8_e4m3fn."""
    if name not in ("bfloat16", "float8_e4m3fn"):
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fa3c: bfloat16 / float8_e4m3fn numpy arrays need the ml_dtypes "
                          "package (pip install ml_dtypes)") from e
    return np.dtype(getattr(ml_dtypes, name))


def _dlpack_dtype(dt):
    """DLPack's (code, bits, lanes) for a numpy dtype; unknown kinds get code 255."""
    bits = dt.itemsize * 8
    if dt.name == "bfloat16":
        return (BFLOAT, 16, 1)
    if dt.name == "float8_e4m3fn":
        return (FLOAT8_E4M3FN, 8, 1)
    if dt.kind in "iuf":
        return ({"i": INT, "u": UINT, "f": FLOAT}[dt.kind], bits, 1)
    return (255, bits, 1)


def view(a, as_type=None):
    """A View of numpy array a from numpy's own pointer and strides. as_type (DLPack's
    (code, bits, lanes)) overrides the element type: a raw copy of another library's
    bfloat16 is uint16 to numpy."""
    a = np.asarray(a)
    if any(s % a.itemsize for s in a.strides):   # not expressible in elements: copy
        a = np.ascontiguousarray(a)
    v = _dlpack.View(a, a, a.ctypes.data, tuple(int(n) for n in a.shape),
                     tuple(s // a.itemsize for s in a.strides),
                     as_type or _dlpack_dtype(a.dtype), (_dlpack.CPU, 0))
    if as_type is None:
        v.name = str(a.dtype)
    return v


_NP_TYPES = {(INT, 8): np.int8, (INT, 16): np.int16, (INT, 32): np.int32, (INT, 64): np.int64,
             (UINT, 8): np.uint8, (UINT, 16): np.uint16, (UINT, 32): np.uint32,
             (UINT, 64): np.uint64, (FLOAT, 16): np.float16, (FLOAT, 32): np.float32,
             (FLOAT, 64): np.float64}


def _host_type(v):
    if v.dtype[2] == 1 and v.dtype[:2] in _NP_TYPES:
        return np.dtype(_NP_TYPES[v.dtype[:2]])
    n = v.itemsize
    return np.dtype("u%d" % n if n in (1, 2, 4, 8) else "V%d" % n)


def alias(v):
    """A read-only numpy array over the host memory of View v (no copy). Types numpy
    lacks (bfloat16, fp8) show as unsigned integers of their width: right for copies.
    Valid while v lives."""
    dt = _host_type(v)
    if 0 in v.shape:
        return np.empty(v.shape, dt)
    lo = sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s > 0)
    buf = (ctypes.c_char * ((hi - lo + 1) * dt.itemsize)).from_address(v.ptr + lo * dt.itemsize)
    base = np.frombuffer(buf, dt)[-lo:]
    return np.lib.stride_tricks.as_strided(base, v.shape, [s * dt.itemsize for s in v.strides],
                                           writeable=False)


def dense_copy(v):
    """A row-major host copy of CPU View v, as a View of the same element type."""
    return view(np.ascontiguousarray(alias(v)), v.dtype)
