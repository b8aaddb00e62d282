"""ctypes mirror of include/fa3c.h and the loader for libfa3c.

Every struct here must match the header field for field: ctypes then applies the
same C alignment rules, so no padding is spelled out by hand.
"""
import ctypes
import glob
import os
import threading

# fa3c_status
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_NOT_SUPPORTED = 2
STATUS_OUT_OF_MEMORY = 3
STATUS_NO_DEVICE = 4
STATUS_CUDA_ERROR = 5
STATUS_INTERNAL_ERROR = 6

# fa3c_dtype
DTYPE_FP32 = 0
DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_E4M3 = 3

# FA3C_FP8_BLOCK_ROWS: rows per e4m3 block descale
FP8_BLOCK_ROWS = 128

# fa3c_backend
BACKEND_AUTO = 0
BACKEND_CPU = 1
BACKEND_CUDA = 2
BACKEND_CPU_REFERENCE = 3

BACKENDS = {"auto": BACKEND_AUTO, "cpu": BACKEND_CPU, "cuda": BACKEND_CUDA,
            "cpu_reference": BACKEND_CPU_REFERENCE}

_i32p = ctypes.POINTER(ctypes.c_int32)
_f32p = ctypes.POINTER(ctypes.c_float)


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("stride", ctypes.c_int64 * 4)]


class Problem(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int),
        ("heads_q", ctypes.c_int),
        ("heads_kv", ctypes.c_int),
        ("headdim", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p),
        ("page_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int),
        ("num_pages", ctypes.c_int),
        ("sinks", ctypes.c_void_p),
        ("headdim_v", ctypes.c_int),
        ("seqused_q", ctypes.c_void_p),
        ("leftpad_k", ctypes.c_void_p),
    ]


class FwdParams(ctypes.Structure):
    _fields_ = [
        ("problem", Problem),
        ("q", Tensor), ("k", Tensor), ("v", Tensor),
        ("out", Tensor),
        ("lse", ctypes.c_void_p),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("num_splits", ctypes.c_int),
        ("backend", ctypes.c_int),
        ("qv", Tensor),
        ("q_block_descale", ctypes.c_void_p),
        ("k_block_descale", ctypes.c_void_p),
        ("v_block_descale", ctypes.c_void_p),
    ]


class BwdParams(ctypes.Structure):
    _fields_ = [
        ("problem", Problem),
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor), ("dout", Tensor),
        ("lse", ctypes.c_void_p),
        ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
        ("dsinks", ctypes.c_void_p),
        ("deterministic", ctypes.c_int),
        ("backend", ctypes.c_int),
    ]


class AppendParams(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int),
        ("seqlen_new", ctypes.c_int),
        ("heads_kv", ctypes.c_int),
        ("headdim", ctypes.c_int),
        ("headdim_v", ctypes.c_int),
        ("k_new", Tensor), ("v_new", Tensor), ("k_cache", Tensor), ("v_cache", Tensor),
        ("seqlen_cache", ctypes.c_int),
        ("cache_seqlens", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p),
        ("page_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int),
        ("num_pages", ctypes.c_int),
        ("backend", ctypes.c_int),
        ("cu_seqlens_new", ctypes.c_void_p),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_dim", ctypes.c_int),
        ("rotary_rows", ctypes.c_int),
        ("rotary_stride", ctypes.c_int64),
        ("rotary_interleaved", ctypes.c_int),
        ("rotary_seqlens", ctypes.c_void_p),
        ("q", Tensor), ("q_out", Tensor),
        ("seqlen_q", ctypes.c_int),
        ("heads_q", ctypes.c_int),
        ("rotary_q_by_row", ctypes.c_int),
    ]


class QuantizeParams(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int),
        ("seqlen", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("headdim", ctypes.c_int),
        ("group", ctypes.c_int),
        ("x", Tensor), ("out", Tensor),
        ("descale", ctypes.c_void_p),
        ("hadamard", ctypes.c_int),
        ("signs", ctypes.c_void_p),
        ("backend", ctypes.c_int),
        ("block_rows", ctypes.c_int),
    ]


class Fa3cError(RuntimeError):
    """An error reported by libfa3c. str(e) is the library's detailed message
    (fa3c_last_error) verbatim; .status is the fa3c_status code and
    .status_string its short name ("invalid argument", "not supported", ...)."""

    def __init__(self, status, message, status_string=""):
        super().__init__(message or status_string or "fa3c error %d" % status)
        self.status = int(status)
        self.status_string = status_string
        self.message = message

    def __reduce__(self):  # keep status through pickling (multiprocessing, DataLoader workers)
        return (type(self), (self.status, self.message, self.status_string))


_lock = threading.Lock()
_handle = None
_path = None


def _candidates():
    env = os.environ.get("FA3C_LIBRARY")
    if env:
        return [env]  # an explicit choice: never fall back silently to another copy
    here = os.path.dirname(os.path.abspath(__file__))
    # The wheel ships exactly one libfa3c.so next to this file; a versioned
    # name is accepted for installs made with the plain CMake rules.
    found = [os.path.join(here, "libfa3c.so")]
    found += sorted(glob.glob(os.path.join(here, "libfa3c.so.*")))
    found += sorted(glob.glob(os.path.join(here, "libfa3c*.dylib")))
    return found


# The structs this module mirrors, by their C names (checked against the
# library's own layout on load: check_abi).
MIRRORED_STRUCTS = {"fa3c_tensor": Tensor, "fa3c_problem": Problem, "fa3c_fwd_params": FwdParams,
                    "fa3c_bwd_params": BwdParams, "fa3c_append_params": AppendParams,
                    "fa3c_quantize_params": QuantizeParams}
PACKAGE_VERSION = "0.7.0"   # fa3c.__version__: the library this package was written against


def check_abi(lib, where="libfa3c"):
    """Raise OSError unless the library's public structs have exactly the size
    and field offsets of this module's mirrors (fa3c_struct_layout), naming the
    first difference and both versions. A library without the query is too
    old to check, and refused too."""
    try:
        layout = lib.fa3c_struct_layout
    except AttributeError:
        raise OSError("%s has no fa3c_struct_layout: it predates this fa3c package (%s); use a library "
                      "built from the same sources" % (where, PACKAGE_VERSION)) from None
    layout.restype = ctypes.c_int64
    layout.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    for cname, mirror in MIRRORED_STRUCTS.items():
        checks = [(None, ctypes.sizeof(mirror))]
        checks += [(name, getattr(mirror, name).offset) for name, _ in mirror._fields_]
        for field, want in checks:
            got = layout(cname.encode(), field.encode() if field else None)
            if got != want:
                what = "%s.%s at offset" % (cname, field) if field else "sizeof(%s)" % cname
                have = "has no such field" if got < 0 else "has %s %d" % (what, got)
                try:
                    version = lib.fa3c_version().decode()
                except Exception:  # noqa: BLE001 - only for the message
                    version = "?"
                raise OSError("%s (version %s) does not match this fa3c package (version %s): the library %s, "
                              "the package needs %s %d. Use the libfa3c built with this package (pip install "
                              ".) or point FA3C_LIBRARY at a build of the same sources."
                              % (where, version, PACKAGE_VERSION, have, what, want))


def _declare(lib):
    fwd_p, bwd_p = ctypes.POINTER(FwdParams), ctypes.POINTER(BwdParams)
    sigs = {
        "fa3c_fwd_params_init": (None, [fwd_p]),
        "fa3c_bwd_params_init": (None, [bwd_p]),
        "fa3c_fwd": (ctypes.c_int, [fwd_p, ctypes.c_void_p]),
        "fa3c_bwd": (ctypes.c_int, [bwd_p, ctypes.c_void_p]),
        "fa3c_fwd_check": (ctypes.c_int, [fwd_p]),
        "fa3c_bwd_check": (ctypes.c_int, [bwd_p]),
        "fa3c_fwd_check_device": (ctypes.c_int, [fwd_p, ctypes.c_void_p]),
        "fa3c_append_params_init": (None, [ctypes.POINTER(AppendParams)]),
        "fa3c_append_kv": (ctypes.c_int, [ctypes.POINTER(AppendParams), ctypes.c_void_p]),
        "fa3c_append_kv_check": (ctypes.c_int, [ctypes.POINTER(AppendParams)]),
        "fa3c_append_kv_check_device": (ctypes.c_int, [ctypes.POINTER(AppendParams), ctypes.c_void_p]),
        "fa3c_quantize_params_init": (None, [ctypes.POINTER(QuantizeParams)]),
        "fa3c_quantize_fp8": (ctypes.c_int, [ctypes.POINTER(QuantizeParams), ctypes.c_void_p]),
        "fa3c_quantize_fp8_check": (ctypes.c_int, [ctypes.POINTER(QuantizeParams)]),
        "fa3c_bwd_check_device": (ctypes.c_int, [bwd_p, ctypes.c_void_p]),
        "fa3c_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "fa3c_last_error": (ctypes.c_char_p, []),
        "fa3c_version": (ctypes.c_char_p, []),
        "fa3c_cuda_available": (ctypes.c_int, []),
        "fa3c_float_to_e4m3": (ctypes.c_uint8, [ctypes.c_float]),
        "fa3c_e4m3_to_float": (ctypes.c_float, [ctypes.c_uint8]),
        "fa3c_hadamard_rotate_f32": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                                                    ctypes.c_void_p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded libfa3c (ctypes.CDLL), loaded on first use so that
    `import fa3c` works even before the library is built."""
    global _handle, _path
    if _handle is not None:
        return _handle
    with _lock:
        if _handle is not None:
            return _handle
        errors = []
        for cand in _candidates():
            if not os.path.exists(cand):
                errors.append("%s: no such file" % cand)
                continue
            try:
                h = ctypes.CDLL(cand)
                _declare(h)
                check_abi(h, cand)
            except (OSError, AttributeError) as e:
                errors.append("%s: %s" % (cand, e))
                continue
            _handle, _path = h, cand
            return h
        raise OSError("fa3c: cannot load libfa3c (set FA3C_LIBRARY=/path/to/libfa3c.so or "
                      "install the package with `pip install .`). Tried:\n  " + "\n  ".join(errors))


def library_path():
    """Path of the libfa3c in use (loads it if needed)."""
    lib()
    return _path


def status_string(status):
    return lib().fa3c_status_string(int(status)).decode()


def last_error():
    return lib().fa3c_last_error().decode()


def raise_for(status, context=""):
    """Raise Fa3cError carrying the C message when status is not OK."""
    if status == STATUS_OK:
        return
    msg = last_error()
    if context:
        msg = "%s: %s" % (context, msg) if msg else context
    raise Fa3cError(status, msg, status_string(status))


def version():
    return lib().fa3c_version().decode()


def cuda_available():
    """True when libfa3c was built with the CUDA backend and an sm_90 GPU is usable."""
    return bool(lib().fa3c_cuda_available())


def float_to_e4m3(x):
    return int(lib().fa3c_float_to_e4m3(float(x)))


def e4m3_to_float(b):
    return float(lib().fa3c_e4m3_to_float(int(b)))
