"""Array-library-neutral forward/backward calls into libfa3c.

The torch front end (_torch) and the one for every other array (_arrays: numpy,
CuPy, JAX, anything with __dlpack__) each supply a small `ops` adapter (pointer,
shape, element strides, dtype code, allocation); everything else - shape
bookkeeping, the parameter structs, error reporting - lives here once.

Python checks only what the C library cannot see (it receives pointers and
strides, not shapes): that q, k, v, cu_seqlens, page_table and descale arrays
agree with each other. Value checks (head dim, head ratio, window, strides...)
are left to libfa3c so its message reaches the user verbatim.
"""
import contextlib
import ctypes
import math
import os

from . import _lib
from ._lib import Fa3cError


def bad(msg):
    return Fa3cError(_lib.STATUS_INVALID_ARGUMENT, msg, "invalid argument")


class Layout:
    """Sizes of one attention problem, derived from array shapes."""

    def __init__(self, ops, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 seqused_k, page_table, seqused_q=None, leftpad_k=None):
        self.varlen_q = cu_seqlens_q is not None
        self.varlen_k = cu_seqlens_k is not None
        self.paged = page_table is not None
        if self.paged and self.varlen_k:
            raise bad("page_table and cu_seqlens_k cannot be used together")
        qs, ks, vs = ops.shape(q), ops.shape(k), ops.shape(v)
        if ks[:-1] != vs[:-1]:
            raise bad("k and v must have the same shape but for the head dim (got %s and %s)" % (ks, vs))
        nq = 3 if self.varlen_q else 4
        nk = 3 if self.varlen_k else 4
        if len(qs) != nq:
            raise bad("q must be %s (got shape %s)" % (
                "(total_q, heads, headdim) with cu_seqlens_q" if self.varlen_q
                else "(batch, seqlen_q, heads, headdim)", qs))
        if len(ks) != nk:
            raise bad("k and v must be %s (got shape %s)" % (
                "(total_k, heads_kv, headdim) with cu_seqlens_k" if self.varlen_k
                else "(num_pages, page_size, heads_kv, headdim) with page_table" if self.paged
                else "(batch, seqlen_k, heads_kv, headdim)", ks))
        if qs[-1] != ks[-1]:
            raise bad("q and k must have the same head dim (got %d and %d)" % (qs[-1], ks[-1]))
        self.headdim = qs[-1]
        self.headdim_v = vs[-1]   # v's, out's, dout's (MLA: 128 under q, k of 192)
        self.heads_q = qs[-2]
        self.heads_kv = ks[-2]
        # batch: from cu_seqlens when present, else from the leading dims
        batches = []
        if self.varlen_q:
            batches.append(("cu_seqlens_q", self._cu_len(ops, cu_seqlens_q, "cu_seqlens_q") - 1))
        else:
            batches.append(("q", qs[0]))
        if self.varlen_k:
            batches.append(("cu_seqlens_k", self._cu_len(ops, cu_seqlens_k, "cu_seqlens_k") - 1))
        elif self.paged:
            pts = ops.shape(page_table)
            if len(pts) != 2:
                raise bad("page_table must be (batch, max_pages_per_seq) (got shape %s)" % (pts,))
            batches.append(("page_table", pts[0]))
        else:
            batches.append(("k", ks[0]))
        if batches[0][1] != batches[1][1]:
            raise bad("batch size of %s (%d) and %s (%d) differ" % (batches[0] + batches[1]))
        self.batch = batches[0][1]
        for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k), ("leftpad_k", leftpad_k)):
            if used is not None and ops.shape(used) != (self.batch,):
                raise bad("%s must have shape (%d,) (got %s)" % (name, self.batch, ops.shape(used)))

        if self.varlen_q:
            self.total_q = qs[0]
            self.seqlen_q = max_seqlen_q if max_seqlen_q is not None else ops.max_diff(cu_seqlens_q)
        else:
            self.seqlen_q = qs[1]
        if self.paged:
            self.num_pages, self.page_size = ks[0], ks[1]
            self.seqlen_k = ops.shape(page_table)[1] * self.page_size
        elif self.varlen_k:
            self.seqlen_k = max_seqlen_k if max_seqlen_k is not None else ops.max_diff(cu_seqlens_k)
        else:
            self.seqlen_k = ks[1]
        self.seqlen_q, self.seqlen_k = int(self.seqlen_q), int(self.seqlen_k)

    @staticmethod
    def _cu_len(ops, cu, name):
        s = ops.shape(cu)
        if len(s) != 1 or s[0] < 1:
            raise bad("%s must be a 1-D array of batch+1 int32 offsets (got shape %s)" % (name, s))
        return s[0]

    def out_shape(self, ops, q):
        return ops.shape(q)[:-1] + (self.headdim_v,)

    def lse_shape(self):
        if self.varlen_q:
            return (self.heads_q, self.total_q)
        return (self.batch, self.heads_q, self.seqlen_q)


def _tensor(ops, x, varlen):
    """fa3c_tensor for array x: 4-D as is, 3-D varlen rows get stride[0] = 0 (ignored)."""
    st = ops.strides(x)
    if varlen:
        st = (0,) + tuple(st)
    t = _lib.Tensor()
    t.data = ops.ptr(x)
    for i in range(4):
        t.stride[i] = int(st[i])
    return t


def _fill_problem(pr, lay, ops, dtype_code, softmax_scale, causal, window_size, softcap,
                  cu_q, cu_k, seqused_k, page_table, seqused_q=None, leftpad_k=None):
    pr.dtype = dtype_code
    pr.batch = lay.batch
    pr.seqlen_q = lay.seqlen_q
    pr.seqlen_k = lay.seqlen_k
    pr.heads_q = lay.heads_q
    pr.heads_kv = lay.heads_kv
    pr.headdim = lay.headdim
    pr.headdim_v = 0 if lay.headdim_v == lay.headdim else lay.headdim_v
    pr.softmax_scale = float(softmax_scale)
    pr.causal = int(bool(causal))
    pr.window_left = int(window_size[0])
    pr.window_right = int(window_size[1])
    pr.softcap = float(softcap or 0.0)
    pr.cu_seqlens_q = ops.ptr(cu_q) if cu_q is not None else None
    pr.cu_seqlens_k = ops.ptr(cu_k) if cu_k is not None else None
    pr.seqused_k = ops.ptr(seqused_k) if seqused_k is not None else None
    pr.seqused_q = ops.ptr(seqused_q) if seqused_q is not None else None
    pr.leftpad_k = ops.ptr(leftpad_k) if leftpad_k is not None else None
    if page_table is not None:
        pr.page_table = ops.ptr(page_table)
        pr.page_table_stride = int(ops.strides(page_table)[0])
        pr.page_size = lay.page_size
        pr.num_pages = lay.num_pages


def _sinks(ops, sinks, lay):
    """The sink logits as a contiguous float32 (heads_q,) array, or None."""
    if sinks is None:
        return None
    s = ops.contiguous_f32(sinks)
    if ops.shape(s) != (lay.heads_q,):
        raise bad("sinks must have shape (heads_q,) = (%d,) (got %s)" % (lay.heads_q, ops.shape(s)))
    return s


def default_scale(headdim):
    return 1.0 / math.sqrt(headdim)


def _check_window(window_size):
    if window_size is None:
        return (-1, -1)
    ws = tuple(int(w) for w in window_size)
    if len(ws) != 2:
        raise bad("window_size must be a pair (left, right) (got %r)" % (window_size,))
    return ws


class Call:
    """A fully built fa3c_fwd / fa3c_bwd call: the parameter struct plus references to
    every array it points into (kept alive here). run() launches it again with the
    same pointers, for a few microseconds of Python: benchmarks use it to time the
    kernels rather than the argument handling."""

    def __init__(self, fn, params, outputs, keep, context="", check_fn=None, check_device_fn=None):
        self._fn = fn
        self._check_fn = check_fn
        self._check_device_fn = check_device_fn
        self._params = params
        self._ref = ctypes.byref(params)
        self.outputs = outputs
        self._keep = keep
        self._context = context
        self.stream = None  # used by run() when no stream is given
        self.finish = None  # called after each launch (the array front end's wait for its stream)
        self.guard = None   # prepared calls: makes the arrays' device current around each launch

    def run(self, stream=None):
        with self.guard() if self.guard is not None else contextlib.nullcontext():
            if CHECK_METADATA and self._check_device_fn is not None:
                self.check_device(stream)
            st = self._fn(self._ref, self.stream if stream is None else stream)
            if st:
                _lib.raise_for(st, self._context if st == _lib.STATUS_NOT_SUPPORTED else "")
            if self.finish is not None:
                self.finish()
        return self.outputs

    def check(self):
        """Validate without running (fa3c_fwd_check / fa3c_bwd_check): raises what run()
        would raise before doing any work."""
        st = self._check_fn(self._ref)
        if st:
            _lib.raise_for(st, self._context if st == _lib.STATUS_NOT_SUPPORTED else "")

    def check_device(self, stream=None):
        """check(), and on CUDA also the device-resident cu_seqlens, seqused_q/k, page table and
        descales, copied to the host on the call's stream (a synchronization;
        fa3c_fwd_check_device): raises Fa3cError naming a bad entry."""
        st = self._check_device_fn(self._ref, self.stream if stream is None else stream)
        if st:
            _lib.raise_for(st, self._context if st == _lib.STATUS_NOT_SUPPORTED else "")


# FA3C_CHECK_METADATA=1: every call first checks its device-resident metadata
# (Call.check_device): a debugging mode for engines, one synchronization per call.
CHECK_METADATA = os.environ.get("FA3C_CHECK_METADATA", "0") not in ("", "0")


def forward(ops, q, k, v, stream=None, **kw):
    """Run fa3c_fwd. Returns (out, lse); lse is float32 (batch, heads, seqlen_q),
    or (heads, total_q) with cu_seqlens_q."""
    return prepare_forward(ops, q, k, v, **kw).run(stream)


def backward(ops, dout, q, k, v, out, lse, stream=None, **kw):
    """Run fa3c_bwd. Returns (dq, dk, dv) shaped like q, k, v."""
    return prepare_backward(ops, dout, q, k, v, out, lse, **kw).run(stream)


def prepare_forward(ops, q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                    max_seqlen_k=None, seqused_k=None, page_table=None, softmax_scale=None,
                    causal=False, window_size=(-1, -1), softcap=0.0, q_descale=None,
                    k_descale=None, v_descale=None, num_splits=0, backend="auto", out=None,
                    sinks=None, seqused_q=None, leftpad_k=None, qv=None, q_block_descale=None,
                    k_block_descale=None, v_block_descale=None):
    q, k, v = ops.prepare(q), ops.prepare(k), ops.prepare(v)
    qv = ops.prepare(qv) if qv is not None else None
    dt = ops.dtype_code(q)
    for name, x in (("k", k), ("v", v), ("qv", qv)):
        if x is not None and ops.dtype_code(x) != dt:
            raise bad("q, k and v must have the same dtype (q is %s, %s is %s)"
                      % (ops.dtype_name(q), name, ops.dtype_name(x)))
    cu_q = ops.int32(cu_seqlens_q, q)
    cu_k = ops.int32(cu_seqlens_k, q)
    used_k = ops.int32(seqused_k, q)
    used_q = ops.int32(seqused_q, q)
    pad_k = ops.int32(leftpad_k, q)
    pt = ops.int32(page_table, q)
    lay = Layout(ops, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, used_k, pt, used_q, pad_k)
    window_size = _check_window(window_size)
    if softmax_scale is None:   # with qv, FA3's 1/sqrt(headdim + headdim_v)
        softmax_scale = default_scale(lay.headdim + (lay.headdim_v if qv is not None else 0))

    descales = []
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        descales.append(ops.descale(d, (lay.batch, lay.heads_kv), q, name))
    # Per block of FA3C_FP8_BLOCK_ROWS rows of each sequence (docs/API.md "fp8").
    blocks = lambda n: (n + _lib.FP8_BLOCK_ROWS - 1) // _lib.FP8_BLOCK_ROWS
    block_shapes = ((lay.batch, lay.heads_q, blocks(lay.seqlen_q)), (lay.batch, lay.heads_kv, blocks(lay.seqlen_k)),
                    (lay.batch, lay.heads_kv, blocks(lay.seqlen_k)))
    for name, d, shape in zip(("q_block_descale", "k_block_descale", "v_block_descale"),
                              (q_block_descale, k_block_descale, v_block_descale), block_shapes):
        descales.append(ops.descale(d, shape, q, name))
    if any(d is not None for d in descales) and dt != _lib.DTYPE_E4M3:
        raise bad("q_descale/k_descale/v_descale and the block descales apply to float8_e4m3fn inputs only")

    out_code = _lib.DTYPE_BF16 if dt == _lib.DTYPE_E4M3 else dt
    out_shape = lay.out_shape(ops, q)
    if out is None:
        out = ops.empty(out_shape, out_code, q)
    else:
        if hasattr(ops, "check_writable"):
            ops.check_writable(out, "out")
        if ops.shape(out) != out_shape or ops.dtype_code(out) != out_code:
            raise bad("out must have shape %s (q's, with v's head dim) and dtype code %d" % (out_shape, out_code))
    lse = ops.empty(lay.lse_shape(), _lib.DTYPE_FP32, q)
    if qv is not None and ops.shape(qv) != out_shape:
        raise bad("qv must have shape %s (q's, with v's head dim; got %s)" % (out_shape, ops.shape(qv)))

    p = _lib.FwdParams()
    L = _lib.lib()
    L.fa3c_fwd_params_init(ctypes.byref(p))
    _fill_problem(p.problem, lay, ops, dt, softmax_scale, causal, window_size, softcap,
                  cu_q, cu_k, used_k, pt, used_q, pad_k)
    p.q = _tensor(ops, q, lay.varlen_q)
    p.k = _tensor(ops, k, lay.varlen_k)
    p.v = _tensor(ops, v, lay.varlen_k)
    p.out = _tensor(ops, out, lay.varlen_q)
    if qv is not None:
        p.qv = _tensor(ops, qv, lay.varlen_q)
    p.lse = ops.ptr(lse)
    (p.q_descale, p.k_descale, p.v_descale, p.q_block_descale, p.k_block_descale,
     p.v_block_descale) = [ops.ptr(d) if d is not None else None for d in descales]
    sinks = _sinks(ops, sinks, lay)
    p.problem.sinks = ops.ptr(sinks) if sinks is not None else None
    p.num_splits = int(num_splits)
    p.backend = backend_code(backend)
    return Call(L.fa3c_fwd, p, (out, lse), (q, k, v, cu_q, cu_k, used_k, pt, descales, sinks, used_q, pad_k, qv),
                check_fn=L.fa3c_fwd_check, check_device_fn=L.fa3c_fwd_check_device)


def prepare_backward(ops, dout, q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None,
                     max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, softmax_scale=None,
                     causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False,
                     backend="auto", sinks=None, seqused_q=None):
    dout, q, k, v, out = [ops.prepare(x) for x in (dout, q, k, v, out)]
    dt = ops.dtype_code(q)
    for name, x in (("k", k), ("v", v), ("out", out), ("dout", dout)):
        if ops.dtype_code(x) != dt:
            raise bad("backward: q, k, v, out and dout must have the same dtype (q is %s, %s is %s)"
                      % (ops.dtype_name(q), name, ops.dtype_name(x)))
    cu_q = ops.int32(cu_seqlens_q, q)
    cu_k = ops.int32(cu_seqlens_k, q)
    used_k = ops.int32(seqused_k, q)
    used_q = ops.int32(seqused_q, q)
    lay = Layout(ops, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, used_k, None, used_q)
    for name, x in (("out", out), ("dout", dout)):
        if ops.shape(x) != lay.out_shape(ops, q):
            raise bad("backward: %s must have shape %s (q's, with v's head dim; got %s)"
                      % (name, lay.out_shape(ops, q), ops.shape(x)))
    lse = ops.contiguous_f32(lse)
    if ops.shape(lse) != lay.lse_shape():
        raise bad("backward: lse must have shape %s (got %s)" % (lay.lse_shape(), ops.shape(lse)))
    window_size = _check_window(window_size)
    if softmax_scale is None:
        softmax_scale = default_scale(lay.headdim)
    dq = ops.empty(ops.shape(q), dt, q)
    dk = ops.empty(ops.shape(k), dt, q)
    dv = ops.empty(ops.shape(v), dt, q)

    p = _lib.BwdParams()
    L = _lib.lib()
    L.fa3c_bwd_params_init(ctypes.byref(p))
    _fill_problem(p.problem, lay, ops, dt, softmax_scale, causal, window_size, softcap,
                  cu_q, cu_k, used_k, None, used_q)
    p.q = _tensor(ops, q, lay.varlen_q)
    p.k = _tensor(ops, k, lay.varlen_k)
    p.v = _tensor(ops, v, lay.varlen_k)
    p.out = _tensor(ops, out, lay.varlen_q)
    p.dout = _tensor(ops, dout, lay.varlen_q)
    p.lse = ops.ptr(lse)
    p.dq = _tensor(ops, dq, lay.varlen_q)
    p.dk = _tensor(ops, dk, lay.varlen_k)
    p.dv = _tensor(ops, dv, lay.varlen_k)
    p.deterministic = int(bool(deterministic))
    p.backend = backend_code(backend)
    outputs = (dq, dk, dv)
    sinks = _sinks(ops, sinks, lay)
    if sinks is not None:   # and their gradient, a fourth output
        # Zeros: an empty problem (nothing to sum) writes nothing.
        dsinks = ops.zeros_f32(lay.heads_q, q)
        p.problem.sinks, p.dsinks = ops.ptr(sinks), ops.ptr(dsinks)
        outputs += (dsinks,)
    # NOT_SUPPORTED from a backward usually means "this backend has no backward
    # for this case yet": the error says it was the backward, then the reason.
    return Call(L.fa3c_bwd, p, outputs, (dout, q, k, v, out, lse, cu_q, cu_k, used_k, sinks, used_q),
                context="fa3c backward", check_fn=L.fa3c_bwd_check, check_device_fn=L.fa3c_bwd_check_device)


def prepare_append(ops, k_cache, v_cache, k, v, cache_seqlens, page_table=None, backend="auto", *,
                   cu_seqlens_new=None, rotary_cos=None, rotary_sin=None, rotary_seqlens=None,
                   rotary_interleaved=True, q=None, q_by_row=False):
    """fa3c_append_kv: k, v (batch, seqlen_new, heads_kv, headdim / headdim_v) written in
    place into the caches at cache_seqlens ((batch,) integers): (batch, seqlen_cache,
    heads_kv, .) caches, or with page_table ((batch, max_pages) integers) (num_pages,
    page_size, heads_kv, .) ones. With cu_seqlens_new ((batch + 1,) integers) k, v are
    packed, (total, heads_kv, .). With rotary_cos / rotary_sin ((rows, rotary_dim / 2), the
    caches' dtype) the new keys are rotated as they are written, and q (batch, seqlen_q,
    heads_q, headdim), if given, into a new array: the call's outputs are then (k_cache,
    v_cache, q_rotated). The library checks the rest (docs/API.md)."""
    caches = []
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if hasattr(ops, "check_writable"):
            ops.check_writable(c, name)
        pc = ops.prepare(c)
        if ops.ptr(pc) != ops.ptr(c) or tuple(ops.strides(pc)) != tuple(ops.strides(c)):
            raise bad("%s: the cache is written in place, so it needs a unit stride on its last "
                      "dimension (a copy would be written instead)" % name)
        caches.append(pc)
    k, v = ops.prepare(k), ops.prepare(v)
    packed = cu_seqlens_new is not None
    for name, x in (("v", v), ("k_cache", caches[0]), ("v_cache", caches[1])):
        if ops.dtype_code(x) != ops.dtype_code(k):
            raise bad("k, v and the caches must have one dtype (k is %s, %s is %s)"
                      % (ops.dtype_name(k), name, ops.dtype_name(x)))
    for name, x, rank in (("k", k, 3 if packed else 4), ("v", v, 3 if packed else 4),
                          ("k_cache", caches[0], 4), ("v_cache", caches[1], 4)):
        if len(ops.shape(x)) != rank:
            raise bad("%s must be %d-D%s (got shape %s)" % (name, rank, " with cu_seqlens_k_new" if packed and
                                                            rank == 3 else "", tuple(ops.shape(x))))
    cu = ops.int32(cu_seqlens_new, k)
    lens = ops.int32(cache_seqlens, k)
    pt = ops.int32(page_table, k)
    if packed:
        total, heads_kv, d = ops.shape(k)
        batch, new = ops.shape(cu)[0] - 1, total   # total bounds each sequence's count: no read of cu
    else:
        batch, new, heads_kv, d = ops.shape(k)
    if ops.shape(lens) != (batch,):
        raise bad("cache_seqlens must have shape (batch,) = (%d,) (got %s)" % (batch, tuple(ops.shape(lens))))
    p = _lib.AppendParams()
    L = _lib.lib()
    L.fa3c_append_params_init(ctypes.byref(p))
    p.dtype = ops.dtype_code(k)
    p.batch, p.seqlen_new, p.heads_kv, p.headdim = batch, new, heads_kv, d
    dv = ops.shape(v)[-1]
    p.headdim_v = 0 if dv == d else dv
    p.k_new, p.v_new = _tensor(ops, k, packed), _tensor(ops, v, packed)
    p.k_cache, p.v_cache = _tensor(ops, caches[0], False), _tensor(ops, caches[1], False)
    p.cache_seqlens = ops.ptr(lens)
    if cu is not None:
        p.cu_seqlens_new = ops.ptr(cu)
    if pt is not None:
        p.page_table = ops.ptr(pt)
        p.page_table_stride = int(ops.strides(pt)[0])
        p.num_pages, p.page_size = ops.shape(caches[0])[0], ops.shape(caches[0])[1]
    else:
        p.seqlen_cache = ops.shape(caches[0])[1]
    p.backend = backend_code(backend)
    outputs, keep = (k_cache, v_cache), [k, v, lens, pt, cu, caches]
    if (rotary_cos is None) != (rotary_sin is None):
        raise bad("give both rotary_cos and rotary_sin, or neither")
    if rotary_cos is not None:
        tables = []
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            t = ops.prepare(t)
            if len(ops.shape(t)) != 2 or ops.dtype_code(t) != ops.dtype_code(k):
                raise bad("%s must be 2-D (rows, rotary_dim / 2) of the cache's dtype %s (got shape %s, %s)"
                          % (name, ops.dtype_name(k), tuple(ops.shape(t)), ops.dtype_name(t)))
            tables.append(t)
        if ops.shape(tables[0]) != ops.shape(tables[1]) or ops.strides(tables[0])[0] != ops.strides(tables[1])[0]:
            raise bad("rotary_cos and rotary_sin must have one shape and row stride (got %s and %s)"
                      % (tuple(ops.shape(tables[0])), tuple(ops.shape(tables[1]))))
        p.rotary_cos, p.rotary_sin = ops.ptr(tables[0]), ops.ptr(tables[1])
        p.rotary_rows, p.rotary_dim = ops.shape(tables[0])[0], 2 * ops.shape(tables[0])[1]
        p.rotary_stride = int(ops.strides(tables[0])[0])
        p.rotary_interleaved = int(bool(rotary_interleaved))
        rs = ops.int32(rotary_seqlens, k)
        if rs is not None:
            p.rotary_seqlens = ops.ptr(rs)
        keep += [tables, rs]
        if q is not None:
            q = ops.prepare(q)
            if len(ops.shape(q)) != 4 or ops.dtype_code(q) != ops.dtype_code(k):
                raise bad("q must be 4-D (batch, seqlen_q, heads, headdim) of the cache's dtype to be rotated "
                          "(got shape %s, %s)" % (tuple(ops.shape(q)), ops.dtype_name(q)))
            q_out = ops.empty(ops.shape(q), ops.dtype_code(q), q)
            p.q, p.q_out = _tensor(ops, q, False), _tensor(ops, q_out, False)
            p.seqlen_q, p.heads_q = ops.shape(q)[1], ops.shape(q)[2]
            p.rotary_q_by_row = int(bool(q_by_row))
            outputs += (q_out,)
            keep += [q, q_out]
    return Call(L.fa3c_append_kv, p, outputs, keep, context="fa3c append",
                check_fn=L.fa3c_append_kv_check, check_device_fn=L.fa3c_append_kv_check_device)


def prepare_quantize(ops, x, group=1, hadamard=False, signs=None, backend="auto", block_rows=0):
    """fa3c_quantize_fp8: x (batch, seqlen, heads, headdim) of float32 / float16 / bfloat16
    to e4m3 with one float32 descale per (batch, group of heads), or with block_rows =
    FA3C_FP8_BLOCK_ROWS per (batch, group, block of rows). The call's outputs are (out,
    descale): out e4m3 of x's shape, descale (batch, heads / group) or (batch, heads /
    group, ceil(seqlen / block_rows))."""
    x = ops.prepare(x)
    if len(ops.shape(x)) != 4:
        raise bad("x must be 4-D (batch, seqlen, heads, headdim) (got shape %s)" % (tuple(ops.shape(x)),))
    batch, seqlen, heads, d = ops.shape(x)
    group = int(group)
    if group < 1 or heads % group:
        raise bad("group must divide heads = %d (got %d)" % (heads, group))
    block_rows = int(block_rows)
    if block_rows not in (0, _lib.FP8_BLOCK_ROWS):
        raise bad("block_rows must be 0 or %d (got %d)" % (_lib.FP8_BLOCK_ROWS, block_rows))
    out = ops.empty(ops.shape(x), _lib.DTYPE_E4M3, x)
    shape = (batch, heads // group) + ((-(-seqlen // block_rows),) if block_rows else ())
    descale = ops.empty(shape, _lib.DTYPE_FP32, x)
    sg = ops.descale(signs, (d,), x, "signs") if signs is not None else None
    p = _lib.QuantizeParams()
    L = _lib.lib()
    L.fa3c_quantize_params_init(ctypes.byref(p))
    p.dtype = ops.dtype_code(x)
    p.batch, p.seqlen, p.heads, p.headdim, p.group = batch, seqlen, heads, d, group
    p.x, p.out = _tensor(ops, x, False), _tensor(ops, out, False)
    p.descale = ops.ptr(descale)
    p.hadamard = int(bool(hadamard))
    p.block_rows = block_rows
    if sg is not None:
        p.signs = ops.ptr(sg)
    p.backend = backend_code(backend)
    return Call(L.fa3c_quantize_fp8, p, (out, descale), (x, sg), context="fa3c quantize",
                check_fn=L.fa3c_quantize_fp8_check)


def backend_code(backend):
    if isinstance(backend, int):
        return backend
    try:
        return _lib.BACKENDS[str(backend).lower()]
    except KeyError:
        raise ValueError("backend must be one of %s (got %r)" % (sorted(_lib.BACKENDS), backend))
