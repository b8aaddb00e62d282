// CUDA graphs: serving engines capture each decode step, training loops the
// backward. A call captured on a stream (its stream-ordered scratch,
// cudaMallocAsync, becomes the graph's memory nodes) and the graph replayed,
// with new inputs written in place between replays, must give exactly what
// an eager call on the same inputs gives: the forward's split-KV decode (the
// combine included) and the deterministic backward bit for bit; the default
// backward (dQ's sums in any order) within a bf16 rounding of dq. Each call
// runs once eagerly first, so that one-time set-up (kernel attributes, module
// loading) is not what the capture meets.
#include "gpu_util.cuh"
#include "testutil.h"
#include "backend.h"

static void fill_device(void *d, fa3c_dtype dt, int64_t n) {
    void *h = tu_alloc((size_t)n * tu_dtype_size(dt));
    tu_fill_normal(h, dt, n, 1.0f);
    cudaMemcpy(d, h, (size_t)n * tu_dtype_size(dt), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();   // before the non-blocking stream's next work reads it
    free(h);
}

// max |a - b| / max |b| over n bf16 values on the device.
static double rel_diff_bf16(const void *a, const void *b, int64_t n) {
    uint16_t *x = (uint16_t *)tu_alloc((size_t)n * 2), *y = (uint16_t *)tu_alloc((size_t)n * 2);
    cudaMemcpy(x, a, (size_t)n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(y, b, (size_t)n * 2, cudaMemcpyDeviceToHost);
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double u = tu_bf16_to_float(x[i]), v = tu_bf16_to_float(y[i]);
        d = u != u ? INFINITY : fmax(d, fabs(u - v));
        m = fmax(m, fabs(v));
    }
    free(x);
    free(y);
    return m > 0 ? d / m : d;
}

static int same_bytes(const void *a, const void *b, size_t bytes) {
    void *x = tu_alloc(bytes), *y = tu_alloc(bytes);
    cudaMemcpy(x, a, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(y, b, bytes, cudaMemcpyDeviceToHost);
    const int same = memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return same;
}

// Capture fn(arg) on stream s into an executable graph; 0 (with a CHECK) if it failed.
static cudaGraphExec_t capture(cudaStream_t s, fa3c_status (*fn)(const void *, cudaStream_t), const void *arg,
                               const char *what) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) {
        CHECK(0, "%s: cudaStreamBeginCapture failed", what);
        return NULL;
    }
    const fa3c_status st = fn(arg, s);
    const cudaError_t e = cudaStreamEndCapture(s, &graph);
    CHECK(st == FA3C_STATUS_OK, "%s under capture: %s: %s", what, fa3c_status_string(st), fa3c_last_error());
    CHECK(e == cudaSuccess, "%s: cudaStreamEndCapture: %s", what, cudaGetErrorString(e));
    if (st != FA3C_STATUS_OK || e != cudaSuccess) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return NULL;
    }
    const cudaError_t ei = cudaGraphInstantiate(&exec, graph, 0);
    CHECK(ei == cudaSuccess, "%s: cudaGraphInstantiate: %s", what, cudaGetErrorString(ei));
    cudaGraphDestroy(graph);
    return ei == cudaSuccess ? exec : NULL;
}

static fa3c_status run_fwd(const void *p, cudaStream_t s) { return fa3c_fwd((const fa3c_fwd_params *)p, s); }
static fa3c_status run_bwd(const void *p, cudaStream_t s) { return fa3c_bwd((const fa3c_bwd_params *)p, s); }

TEST(graph_decode_with_splits) {
    REQUIRE_SM90();
    enum { B = 2, SQ = 1, SK = 3000, HQ = 16, HK = 2, D = 128 };
    const fa3c_dtype dt = FA3C_DTYPE_BF16;
    const int64_t nq = (int64_t)B * SQ * HQ * D, nk = (int64_t)B * SK * HK * D;
    void *q, *k, *v, *out, *ref;
    float *lse, *lse_ref;
    CUDA_OK(cudaMalloc(&q, nq * 2));
    CUDA_OK(cudaMalloc(&k, nk * 2));
    CUDA_OK(cudaMalloc(&v, nk * 2));
    CUDA_OK(cudaMalloc(&out, nq * 2));
    CUDA_OK(cudaMalloc(&ref, nq * 2));
    CUDA_OK(cudaMalloc((void **)&lse, B * HQ * SQ * 4));
    CUDA_OK(cudaMalloc((void **)&lse_ref, B * HQ * SQ * 4));
    fill_device(k, dt, nk);
    fill_device(v, dt, nk);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, dt, B, SQ, SK, HQ, HK, D);
    p.q = tu_tensor(q, B, SQ, HQ, D);
    p.k = tu_tensor(k, B, SK, HK, D);
    p.v = tu_tensor(v, B, SK, HK, D);
    p.out = tu_tensor(out, B, SQ, HQ, D);
    p.lse = lse;
    p.num_splits = 0;   // auto: few tiles, many key blocks, so it splits
    p.backend = FA3C_BACKEND_CUDA;
    fa3c_fwd_params e = p;   // the eager call, into ref
    e.out = tu_tensor(ref, B, SQ, HQ, D);
    e.lse = lse_ref;

    fill_device(q, dt, nq);
    CHECK(fa3c_fwd(&p, s) == FA3C_STATUS_OK, "eager warm-up: %s", fa3c_last_error());
    CUDA_OK(cudaStreamSynchronize(s));
    cudaGraphExec_t exec = capture(s, run_fwd, &p, "decode");
    CHECK(fa3c_cuda_fwd_last_num_splits() > 1, "the captured decode did not split (%d)", fa3c_cuda_fwd_last_num_splits());
    for (int round = 0; exec && round < 3; round++) {   // new queries each step, as a decode loop writes them
        fill_device(q, dt, nq);
        CUDA_OK(cudaMemsetAsync(out, 0xFF, nq * 2, s));
        CUDA_OK(cudaGraphLaunch(exec, s));
        CHECK(fa3c_fwd(&e, s) == FA3C_STATUS_OK, "eager decode: %s", fa3c_last_error());
        CUDA_OK(cudaStreamSynchronize(s));
        CHECK(same_bytes(out, ref, nq * 2) && same_bytes(lse, lse_ref, B * HQ * SQ * 4),
              "round %d: the graph's out or lse differs from the eager call's", round);
    }
    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(s);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(ref), cudaFree(lse), cudaFree(lse_ref);
}

static void backward_graph(int deterministic) {
    enum { B = 2, S = 384, H = 4, D = 128 };   // 384 queries: the default takes first writes of dQ
    const fa3c_dtype dt = FA3C_DTYPE_BF16;
    const int64_t n = (int64_t)B * S * H * D;
    void *buf[8], *eager[3];
    for (int i = 0; i < 8; i++) CUDA_OK(cudaMalloc(&buf[i], n * 2));   // q k v out dout dq dk dv
    for (int i = 0; i < 3; i++) CUDA_OK(cudaMalloc(&eager[i], n * 2));
    float *lse;
    CUDA_OK(cudaMalloc((void **)&lse, B * H * S * 4));
    for (int i = 0; i < 3; i++) fill_device(buf[i], dt, n);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    tu_problem_shape(&f.problem, dt, B, S, S, H, H, D);
    f.problem.causal = 1;
    f.q = tu_tensor(buf[0], B, S, H, D), f.k = tu_tensor(buf[1], B, S, H, D), f.v = tu_tensor(buf[2], B, S, H, D);
    f.out = tu_tensor(buf[3], B, S, H, D);
    f.lse = lse;
    f.backend = FA3C_BACKEND_CUDA;
    CHECK(fa3c_fwd(&f, s) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem = f.problem;
    p.q = f.q, p.k = f.k, p.v = f.v, p.out = f.out;
    p.dout = tu_tensor(buf[4], B, S, H, D);
    p.lse = lse;
    p.dq = tu_tensor(buf[5], B, S, H, D), p.dk = tu_tensor(buf[6], B, S, H, D), p.dv = tu_tensor(buf[7], B, S, H, D);
    p.deterministic = deterministic;
    p.backend = FA3C_BACKEND_CUDA;
    fa3c_bwd_params e = p;
    e.dq = tu_tensor(eager[0], B, S, H, D), e.dk = tu_tensor(eager[1], B, S, H, D), e.dv = tu_tensor(eager[2], B, S, H, D);
    fill_device(buf[4], dt, n);
    CHECK(fa3c_bwd(&e, s) == FA3C_STATUS_OK, "eager warm-up: %s", fa3c_last_error());
    CUDA_OK(cudaStreamSynchronize(s));

    cudaGraphExec_t exec = capture(s, run_bwd, &p, deterministic ? "deterministic backward" : "backward");
    for (int round = 0; exec && round < 2; round++) {   // a new dout each step
        fill_device(buf[4], dt, n);
        for (int i = 5; i < 8; i++) CUDA_OK(cudaMemsetAsync(buf[i], 0xFF, n * 2, s));
        CUDA_OK(cudaGraphLaunch(exec, s));
        CHECK(fa3c_bwd(&e, s) == FA3C_STATUS_OK, "eager backward: %s", fa3c_last_error());
        CUDA_OK(cudaStreamSynchronize(s));
        // dk, dv sum in registers in a fixed order; dq only with deterministic = 1.
        for (int i = deterministic ? 0 : 1; i < 3; i++)
            CHECK(same_bytes(buf[5 + i], eager[i], n * 2), "round %d: the graph's %s differs from the eager call's",
                  round, i == 0 ? "dq" : i == 1 ? "dk" : "dv");
        if (!deterministic) {
            const double r = rel_diff_bf16(buf[5], eager[0], n);
            CHECK(r <= 1.0 / 128, "round %d: the graph's dq is %.3g (relative) from the eager call's", round, r);
        }
    }
    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(s);
    for (int i = 0; i < 8; i++) cudaFree(buf[i]);
    for (int i = 0; i < 3; i++) cudaFree(eager[i]);
    cudaFree(lse);
}

TEST(graph_backward_deterministic) {
    REQUIRE_SM90();
    backward_graph(1);
}

TEST(graph_backward) {
    REQUIRE_SM90();
    backward_graph(0);
}

TEST_MAIN()
