"""numpy front end: arrays in host memory, run by the CPU backend.

bf16 and fp8 use ml_dtypes (imported only when such an array shows up)."""
import numpy as np

from . import _lib
from ._core import bad


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fa3c: bfloat16 / float8_e4m3fn numpy arrays need the ml_dtypes "
                          "package (pip install ml_dtypes)") from e
    return ml_dtypes


def _np_dtype(code):
    if code == _lib.DTYPE_FP32:
        return np.dtype(np.float32)
    if code == _lib.DTYPE_FP16:
        return np.dtype(np.float16)
    if code == _lib.DTYPE_BF16:
        return np.dtype(_ml_dtypes().bfloat16)
    if code == _lib.DTYPE_E4M3:
        return np.dtype(_ml_dtypes().float8_e4m3fn)
    raise ValueError("unknown fa3c dtype code %r" % code)


class NumpyOps:
    @staticmethod
    def prepare(x):
        x = np.asarray(x)
        it = x.itemsize
        ok = (x.ndim >= 1 and x.strides[-1] == it
              and all(s >= 0 and s % it == 0 for s in x.strides))
        # fa3c takes any non-negative element strides with a unit last one;
        # anything else (reversed, byte-offset views) is copied.
        return x if ok else np.ascontiguousarray(x)

    @staticmethod
    def ptr(x):
        return x.ctypes.data

    @staticmethod
    def shape(x):
        return tuple(int(s) for s in np.shape(x))

    @staticmethod
    def strides(x):
        return tuple(s // x.itemsize for s in x.strides)

    @staticmethod
    def dtype_code(x):
        dt = x.dtype
        if dt == np.float32:
            return _lib.DTYPE_FP32
        if dt == np.float16:
            return _lib.DTYPE_FP16
        if dt.name == "bfloat16":
            return _lib.DTYPE_BF16
        if dt.name == "float8_e4m3fn":
            return _lib.DTYPE_E4M3
        raise TypeError("fa3c: unsupported dtype %s; use float32, float16, ml_dtypes.bfloat16 "
                        "or ml_dtypes.float8_e4m3fn" % dt)

    @staticmethod
    def dtype_name(x):
        return str(x.dtype)

    @staticmethod
    def empty(shape, code, like):
        return np.empty(shape, dtype=_np_dtype(code))

    @staticmethod
    def int32(x, like):
        if x is None:
            return None
        a = np.asarray(x)
        if a.dtype.kind not in "iu":
            raise bad("cu_seqlens / seqused_k / page_table must be integer arrays (got %s)" % a.dtype)
        return np.ascontiguousarray(a, dtype=np.int32)

    @staticmethod
    def max_diff(cu):
        return int(np.max(np.diff(cu))) if cu.shape[0] > 1 else 0

    @staticmethod
    def descale(d, shape, like, name):
        if d is None:
            return None
        a = np.asarray(d, dtype=np.float32)
        try:
            a = np.broadcast_to(a, shape)
        except ValueError:
            raise bad("%s must broadcast to (batch, heads_kv) = %s (got shape %s)" % (name, shape, a.shape))
        return np.ascontiguousarray(a)

    @staticmethod
    def contiguous_f32(x):
        return np.ascontiguousarray(x, dtype=np.float32)


OPS = NumpyOps()
