"""Reading DLPack: an array's memory as a pointer, shape, element strides, dtype and
device, through `x.__dlpack__()` and ctypes (no dependency).

The capsule is read, not consumed: it keeps its name, so its producer's destructor
calls the DLPack deleter when the capsule dies. A View holds the capsule and the
array, which is what keeps the memory valid while fa3c uses it.
"""
import ctypes

from . import _lib

# DLDeviceType values fa3c runs on, and names for the others (error messages).
CPU, CUDA = 1, 2
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia", 18: "trn"}

# DLManagedTensorVersioned.flags bits
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2

# DLDataTypeCode values
INT, UINT, FLOAT, BFLOAT, FLOAT8_E4M3FN = 0, 1, 2, 4, 10
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat", 5: "complex",
               6: "bool", 7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
               10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2",
               13: "float8_e5m2fnuz", 14: "float8_e8m0fnu", 15: "float6_e2m3fn",
               16: "float6_e3m2fn", 17: "float4_e2m1fn"}

# (code, bits) of the element types fa3c computes in -> fa3c_dtype
FA3C_DTYPES = {(FLOAT, 32): _lib.DTYPE_FP32, (FLOAT, 16): _lib.DTYPE_FP16,
               (BFLOAT, 16): _lib.DTYPE_BF16, (FLOAT8_E4M3FN, 8): _lib.DTYPE_E4M3}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):              # DLManagedTensor ("dltensor")
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):     # DLManagedTensorVersioned ("dltensor_versioned")
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


# Own prototypes, not ctypes.pythonapi's shared function objects, whose restype and
# argtypes any other module may set.
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def device_name(device):
    kind, index = device
    return "%s:%d" % (_DEVICE_NAMES.get(kind, "device_type_%d" % kind), index)


def dtype_name(dtype):
    code, bits, lanes = dtype
    name = _CODE_NAMES.get(code, "code%d_" % code)
    if code == 6:
        name = "bool"
    elif code in (INT, UINT, FLOAT, BFLOAT, 5) or code not in _CODE_NAMES:
        name += str(bits)
    return name if lanes == 1 else "%sx%d" % (name, lanes)


def compact_strides(shape):
    """Row-major element strides (what NULL strides mean in DLPack)."""
    st, step = [], 1
    for n in reversed(shape):
        st.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(st))


class View:
    """One array as fa3c reads it. `array` is the caller's object, `owner` whatever
    keeps the memory alive (the capsule, or an array fa3c made); both live as long
    as the View. dtype is DLPack's (code, bits, lanes), name its readable form; code
    is the fa3c_dtype, or None for types fa3c does not compute in."""

    __slots__ = ("array", "owner", "ptr", "shape", "strides", "dtype", "code", "name", "device", "flags")

    def __init__(self, array, owner, ptr, shape, strides, dtype, device, flags=0):
        self.array = array
        self.owner = owner
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.code = FA3C_DTYPES.get(dtype[:2]) if dtype[2] == 1 else None
        self.name = dtype_name(dtype)
        self.device = device
        self.flags = flags   # DLPack 1.x flags (FLAG_*); 0 for older capsules and numpy's own views

    @property
    def itemsize(self):
        return max(self.dtype[1] * self.dtype[2] // 8, 1)

    def compact(self):
        """True when the elements are dense and row-major (size-1 dims may have any stride)."""
        return all(n == 1 or s == c for n, s, c in
                   zip(self.shape, self.strides, compact_strides(self.shape)))


def export(x, stream=None):
    """A View of x through x.__dlpack__(stream=...). stream is DLPack's: None on the
    CPU; on CUDA the stream fa3c will use (1 = the legacy default stream), so that
    the producer makes it wait for pending work on x."""
    try:
        capsule = x.__dlpack__(stream=stream, max_version=(1, 1))
    except TypeError:   # a producer from before DLPack 1.0 takes no max_version
        capsule = x.__dlpack__(stream=stream)
    name = _capsule_name(capsule)
    flags = 0
    if name == b"dltensor_versioned":
        m = _ManagedVersioned.from_address(_capsule_pointer(capsule, name))
        if m.version.major != 1:
            raise BufferError("fa3c: %s.__dlpack__ gave a DLPack %d.%d tensor; fa3c reads 1.x"
                              % (type(x).__name__, m.version.major, m.version.minor))
        t, flags = m.dl_tensor, int(m.flags)
    elif name == b"dltensor":
        t = _Managed.from_address(_capsule_pointer(capsule, name)).dl_tensor
    else:
        raise BufferError("fa3c: %s.__dlpack__ returned a capsule named %r, not a DLPack tensor"
                          % (type(x).__name__, name))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else compact_strides(shape)
    return View(x, capsule, (t.data or 0) + t.byte_offset, shape, strides,
                (t.dtype.code, t.dtype.bits, t.dtype.lanes),
                (t.device.device_type, t.device.device_id), flags)


def device_of(x):
    """(DLDeviceType, index) of an object with __dlpack_device__."""
    kind, index = x.__dlpack_device__()
    return int(kind), int(index)
