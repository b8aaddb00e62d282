"""The two CUDA driver calls the array front end needs for non-torch GPU arrays: make
an array's device current for the call, and wait for a stream.

Through libcuda (ctypes), loaded on first use. The CUDA runtime that libfa3c links
statically follows the driver's current context, so setting the device's primary
context current is what torch.cuda.device does for torch tensors.
"""
import contextlib
import ctypes

_driver = None


def _cuda():
    global _driver
    if _driver is None:
        try:
            d = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise OSError("fa3c: GPU arrays need the CUDA driver (libcuda.so.1): %s" % e) from None
        _check(d.cuInit(0), "cuInit")
        _driver = d
    return _driver


def _check(status, what):
    if status:
        raise RuntimeError("fa3c: %s failed (CUDA driver error %d)" % (what, status))


@contextlib.contextmanager
def device(index):
    """Run the block with CUDA device `index` current (its primary context); the
    thread's previous context is current again afterwards."""
    d = _cuda()
    prev, ctx, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    _check(d.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
    _check(d.cuDeviceGet(ctypes.byref(dev), int(index)), "cuDeviceGet(%d)" % index)
    # Retained, so that it lives through the block; the array's owner holds it too.
    _check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        _check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        try:
            yield
        finally:
            d.cuCtxSetCurrent(prev)
    finally:
        getattr(d, "cuDevicePrimaryCtxRelease_v2", d.cuDevicePrimaryCtxRelease)(dev)


def synchronize(stream):
    """Wait until the work queued on stream (a cudaStream_t as an int; 0 = legacy default)
    is done."""
    _check(_cuda().cuStreamSynchronize(ctypes.c_void_p(stream or None)), "cuStreamSynchronize")
