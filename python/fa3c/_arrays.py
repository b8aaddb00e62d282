"""The array front end for everything that is not a torch tensor: numpy, CuPy, JAX,
or any object with __dlpack__ / __dlpack_device__, in CPU or CUDA memory. (torch
tensors keep their own front end, _torch: custom ops, autograd, torch.compile.)

Inputs are read through DLPack (_dlpack); numpy arrays of a dtype DLPack cannot
carry (ml_dtypes' bfloat16, float8_e4m3fn) through numpy's own pointer and
strides. Objects without __dlpack__ go through numpy.asarray, as before.

Outputs are made by q's library: numpy for numpy arrays and for other objects in
CPU memory that have no array namespace; the array's namespace otherwise
(__array_namespace__, or the cupy module): CuPy in, CuPy out; JAX in, JAX out. A
GPU object with no namespace gets torch tensors (torch must be installed).

Streams, for GPU arrays: fa3c runs on CuPy's current stream for CuPy arrays and on
torch's current stream where outputs are torch tensors, and asks the producers
(DLPack's stream argument) to order their pending work before it. With any other
library (JAX) it runs on the legacy default stream and waits for it before
returning: it cannot order its writes with streams it does not know.
"""
import contextlib
import sys

import numpy as np

from . import _cuda, _dlpack, _lib, _numpy
from ._core import bad
from ._dlpack import CPU, CUDA, FLOAT, INT, UINT, View

_NAMES = {_lib.DTYPE_FP32: "float32", _lib.DTYPE_FP16: "float16", _lib.DTYPE_BF16: "bfloat16",
          _lib.DTYPE_E4M3: "float8_e4m3fn"}


def is_array(x):
    return hasattr(x, "__dlpack__") or isinstance(x, np.ndarray)


# ---- where outputs come from ----------------------------------------------------------

class _Numpy:
    """Host arrays from numpy."""
    stream, sync = None, False

    @staticmethod
    def empty(shape, name):
        return np.empty(shape, dtype=_numpy.dtype(name))

    @staticmethod
    def from_host(a):
        return a


class _Namespace:
    """Arrays from the caller's array library (CuPy, JAX...), on q's device."""

    def __init__(self, xp, like, device):
        self.xp, self.device = xp, device
        where = getattr(like, "device", None)
        self._where = None if callable(where) else where   # the array API's device object
        self.stream, self.sync = None, False
        if device[0] == CUDA:
            if xp.__name__ == "cupy":
                with xp.cuda.Device(device[1]):
                    self.stream = xp.cuda.get_current_stream().ptr
            else:
                self.stream, self.sync = 0, True

    def _make(self, fn, *args, **kw):
        # Callers hold ArrayOps.guard(): q's device is current, for libraries (CuPy)
        # whose creation functions take no device.
        if self._where is not None:
            try:
                return fn(*args, device=self._where, **kw)
            except TypeError:
                pass
        return fn(*args, **kw)

    def empty(self, shape, name):
        dt = getattr(self.xp, name, None)
        if dt is None:
            raise TypeError("fa3c: %s has no %s dtype for fa3c's outputs"
                            % (self.xp.__name__, name))
        return self._make(self.xp.empty, shape, dtype=dt)

    def from_host(self, a):
        return self._make(self.xp.asarray, a)

    def to_host(self, x):
        return x.get() if self.xp.__name__ == "cupy" else np.asarray(x)

    def contiguous(self, x):
        fn = getattr(self.xp, "ascontiguousarray", None)
        if fn is None:
            raise bad("fa3c: the array needs a unit last stride and no negative strides, and "
                      "%s has no ascontiguousarray to copy it" % self.xp.__name__)
        return fn(x)


class _Torch:
    """torch CUDA tensors, for GPU objects whose own library fa3c cannot reach."""
    sync = False

    def __init__(self, torch, device):
        self.torch, self.where = torch, torch.device("cuda", device[1])
        self.stream = torch.cuda.current_stream(self.where).cuda_stream

    def empty(self, shape, name):
        return self.torch.empty(shape, dtype=getattr(self.torch, name), device=self.where)

    def from_host(self, a):
        return self.torch.as_tensor(a, device=self.where)

    def to_host(self, x):
        return self.torch.from_dlpack(x).cpu().numpy()

    def contiguous(self, x):
        return self.torch.from_dlpack(x).contiguous()


def _own_namespace(x):
    """x's array library (__array_namespace__, or the cupy module), or None."""
    get = getattr(x, "__array_namespace__", None)
    if get is not None:
        return get()
    if type(x).__module__.partition(".")[0] == "cupy":
        return sys.modules["cupy"]
    return None


def namespace(x):
    """The module to do array math on x with: its own library, else numpy."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return np
    return _own_namespace(x) or np


def _library(x, device):
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return _Numpy()
    xp = _own_namespace(x)
    if xp is np or (xp is None and device[0] == CPU):
        return _Numpy()
    if xp is not None:
        return _Namespace(xp, x, device)
    try:
        import torch
    except ImportError:
        raise TypeError("fa3c: cannot make outputs for a %s on the GPU: it has no "
                        "__array_namespace__, and torch (used then) is not installed"
                        % type(x).__name__) from None
    return _Torch(torch, device)


def _device(x):
    if hasattr(x, "__dlpack_device__"):
        return _dlpack.device_of(x)
    return (CPU, 0)   # numpy.asarray will read it


# ---- the adapter ------------------------------------------------------------------

class ArrayOps:
    """The _core adapter (see _torch.TorchOps) for one call on arrays that live where q
    does. Every array it is given is read once (a View, kept until the call's end)."""

    def __init__(self, q):
        self.device = _device(q)
        if self.device[0] not in (CPU, CUDA):
            raise bad("fa3c: arrays must be in CPU or CUDA memory (q is on %s)"
                      % _dlpack.device_name(self.device))
        self.cuda = self.device[0] == CUDA
        self.backend = "cuda" if self.cuda else "cpu"
        self.lib = _library(q, self.device)
        self.stream = self.lib.stream
        # DLPack's value for that stream: 1 is the legacy default stream (0 is not allowed)
        self._dl_stream = (self.stream or 1) if self.cuda else None
        self._views = {}

    def guard(self):
        """Makes q's device current for the call."""
        return _cuda.device(self.device[1]) if self.cuda else contextlib.nullcontext()

    def finish(self):
        """After each launch: wait for it where the outputs' library cannot be ordered after it."""
        if self.lib.sync:
            _cuda.synchronize(self.stream)

    # reading arrays

    def view(self, x):
        if isinstance(x, View):
            return x
        hit = self._views.get(id(x))
        if hit is not None:
            return hit[1]
        v = self._read(x)
        if v.device != self.device and not v.device[0] == self.device[0] == CPU:   # host is host
            raise bad("fa3c: all arrays must be on q's device, %s (got one on %s)"
                      % (_dlpack.device_name(self.device), _dlpack.device_name(v.device)))
        self._views[id(x)] = (x, v)   # x is kept too, so that its id is not reused meanwhile
        return v

    def _read(self, x):
        if not hasattr(x, "__dlpack__"):
            x = np.asarray(x)
        try:
            return _dlpack.export(x, self._dl_stream)
        except BufferError as e:
            if isinstance(x, np.ndarray):   # a dtype (or stride) DLPack cannot express
                return _numpy.view(x)
            raise BufferError("fa3c: cannot read a %s through DLPack: %s"
                              % (type(x).__name__, e)) from e

    def _host(self, v, what):
        """v's values as a numpy array (its memory on the CPU, a copy from the GPU)."""
        if v.dtype[2] != 1 or v.dtype[0] not in (INT, UINT, FLOAT):
            raise bad("fa3c: %s must be an integer or float array (got %s)" % (what, v.name))
        if not self.cuda:
            return _numpy.alias(v)
        return np.asarray(self.lib.to_host(v.array))

    def _put(self, a):
        """Host array a where the call's arrays live."""
        return self.view(self.lib.from_host(a)) if self.cuda else a

    # the adapter

    def prepare(self, x):
        v = self.view(x)
        st = v.strides
        ok = len(st) >= 1 and st[-1] == 1 and all(s >= 0 for s in st)
        # The CUDA kernels read with TMA, which needs positive strides (no broadcast).
        if ok and self.cuda:
            ok = all(s > 0 or n <= 1 for n, s in zip(v.shape, st))
        if ok:
            return v
        if not self.cuda:
            return _numpy.dense_copy(v)
        return self.view(self.lib.contiguous(v.array))

    def ptr(self, x):
        return self.view(x).ptr

    def shape(self, x):
        return self.view(x).shape

    def strides(self, x):
        return self.view(x).strides

    def dtype_code(self, x):
        v = self.view(x)
        if v.code is None:
            raise TypeError("fa3c: unsupported dtype %s; use float32, float16, bfloat16 or "
                            "float8_e4m3fn (numpy: ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn)"
                            % v.name)
        return v.code

    def dtype_name(self, x):
        return self.view(x).name

    def empty(self, shape, code, like):
        out = self.lib.empty(tuple(shape), _NAMES[code])
        self.view(out)   # read now; also checks that it landed on q's device
        return out

    def zeros_f32(self, n, like):
        """n float32 zeros of q's library, where q lives (like: q, unused: self knows it)."""
        out = self.lib.from_host(np.zeros((n,), dtype=np.float32))
        self.view(out)
        return out

    def check_writable(self, x, name):
        """A caller's array fa3c is to write: refused if its producer marked it read-only
        or handed over a copy (DLPack 1.x flags), where the writes would be lost."""
        v = self.view(x)
        if v.flags & (_dlpack.FLAG_READ_ONLY | _dlpack.FLAG_IS_COPIED):
            raise bad("fa3c: %s is %s (DLPack flags): fa3c cannot write its results there"
                      % (name, "read-only" if v.flags & _dlpack.FLAG_READ_ONLY else "a copy"))

    def int32(self, x, like):
        what = "cu_seqlens / seqused_k / page_table"
        if x is None:
            return None
        if not is_array(x):
            x = np.asarray(x)
        if self.cuda and isinstance(x, np.ndarray):   # host values for a GPU call: copy them over
            if x.dtype.kind not in "iu":
                raise bad("fa3c: %s must be integer arrays (got %s)" % (what, x.dtype))
            return self._put(np.ascontiguousarray(x, dtype=np.int32))
        v = self.view(x)
        if v.dtype[0] not in (INT, UINT) or v.dtype[2] != 1:
            raise bad("fa3c: %s must be integer arrays (got %s)" % (what, v.name))
        if v.dtype[:2] == (INT, 32) and v.compact():
            return v
        return self._put(np.ascontiguousarray(self._host(v, what), dtype=np.int32))

    def max_diff(self, cu):
        a = self._host(self.view(cu), "cu_seqlens")
        return int(np.max(np.diff(a))) if a.shape[0] > 1 else 0

    def descale(self, d, shape, like, name):
        if d is None:
            return None
        a = self._host(self.view(d), name) if is_array(d) else d
        try:
            a = np.broadcast_to(np.asarray(a, dtype=np.float32), shape)
        except ValueError:
            raise bad("%s must broadcast to %s (got shape %s)"
                      % (name, shape, np.shape(a)))
        return self._put(np.ascontiguousarray(a))

    def contiguous_f32(self, x):
        v = self.view(x)
        if v.dtype == (FLOAT, 32, 1) and v.compact():
            return v
        return self._put(np.ascontiguousarray(self._host(v, "lse"), dtype=np.float32))


def empty(shape, dtype_name, like):
    """An empty array of q's library (see the module's rule), e.g. FA3's placeholders."""
    ops = ArrayOps(like)
    with ops.guard():
        return ops.lib.empty(tuple(shape), dtype_name)
