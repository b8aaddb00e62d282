// Metadata that lives on the GPU and breaks the API's contract (issue 35): the
// host cannot read it, so the kernels must keep every access inside the
// tensors the caller described. Each case below returns (any status), leaves
// no CUDA error behind, and writes nothing outside its outputs (poisoned
// guards on both sides); under compute-sanitizer memcheck (tools/gpu.sh check)
// it also reads nothing outside any allocation. What the outputs hold is not
// asserted: the inputs are not the caller's valid data. What reports them is
// fa3c_fwd_check_device / fa3c_bwd_check_device, run on the same params
// first: each case must be refused, naming the array and the entry.
#include "gpu_util.cuh"
#include "testutil.h"
#include "backend.h"

enum { GUARD = 4096 };

typedef struct {   // n elements of es bytes (bf16 tensors, a float lse) between two guards of 0xFF bytes
    void *alloc;
    int64_t n;
    int es;
} guarded;

static guarded make_guarded_es(int64_t n, int es, int fill) {
    guarded g = {NULL, n, es};
    if (cudaMalloc(&g.alloc, (size_t)(n + 2 * GUARD) * es) != cudaSuccess) return g;
    cudaMemset(g.alloc, 0xFF, (size_t)(n + 2 * GUARD) * es);
    if (fill) {   // bf16 values
        void *h = tu_alloc((size_t)n * 2);
        tu_fill_normal(h, FA3C_DTYPE_BF16, n, 1.0f);
        cudaMemcpy((char *)g.alloc + GUARD * es, h, (size_t)n * 2, cudaMemcpyHostToDevice);
        free(h);
    }
    return g;
}

static guarded make_guarded(int64_t n, int fill) { return make_guarded_es(n, 2, fill); }

static void *data(const guarded *g) { return (char *)g->alloc + (size_t)GUARD * g->es; }

static int64_t guards_touched(const guarded *g) {
    const size_t bytes = (size_t)GUARD * g->es;
    uint8_t *h = (uint8_t *)tu_alloc(bytes);
    int64_t touched = 0;
    for (int side = 0; side < 2; side++) {
        cudaMemcpy(h, (const char *)g->alloc + (side ? (size_t)(GUARD + g->n) * g->es : 0), bytes, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < bytes; i++) touched += h[i] != 0xFF;
    }
    free(h);
    return touched;
}

static int32_t *device_ints(const int32_t *h, int n) {
    int32_t *d = NULL;
    if (cudaMalloc((void **)&d, (size_t)n * 4) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice);
    return d;
}

// The call's status is whatever it is; what is checked is the aftermath.
static void check_aftermath(const char *what, fa3c_status st, guarded *outs, int nouts) {
    const cudaError_t e = cudaDeviceSynchronize();
    printf("  %s: %s%s%s\n", what, fa3c_status_string(st), st ? ": " : "", st ? fa3c_last_error() : "");
    CHECK(e == cudaSuccess, "%s: the device reports %s", what, cudaGetErrorString(e));
    for (int i = 0; i < nouts; i++) {
        const int64_t t = guards_touched(&outs[i]);
        CHECK(t == 0, "%s: %lld elements written outside output %d", what, (long long)t, i);
    }
}

// Two packed sequences, 2 heads of 128, with the given device cu_seqlens (3
// entries) and max_len. The tensors hold batch x max_len tokens: with
// cu_seqlens in device memory that is all the API knows of their size (the
// bound docs/API.md states), and what the kernels keep their accesses in.
// (Tensors smaller than that bound need the caller to say their token count:
// the issue's next step.)
// fa3c_*_check_device on the same params: it reads the device arrays and
// must refuse them, naming `needle` (NULL: valid metadata, OK).
static void expect_device_check(const char *what, fa3c_status st, const char *needle) {
    printf("    %s: fa3c_*_check_device -> %s: %s\n", what, fa3c_status_string(st), fa3c_last_error());
    if (!needle) {
        CHECK(st == FA3C_STATUS_OK, "%s: fa3c_*_check_device refused valid metadata", what);
        return;
    }
    CHECK(st == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), needle),
          "%s: fa3c_*_check_device gave %s, '%s' (want INVALID_ARGUMENT naming %s)", what, fa3c_status_string(st),
          fa3c_last_error(), needle);
}

static void varlen_case(const char *what, const int32_t cu[3], int max_len, int backward, const char *needle) {
    enum { H = 2, D = 128 };
    const int TOK = 2 * max_len;
    guarded q = make_guarded(TOK * H * D, 1), k = make_guarded(TOK * H * D, 1), v = make_guarded(TOK * H * D, 1);
    guarded out = make_guarded(TOK * H * D, 0), dout = make_guarded(TOK * H * D, 1);
    guarded dq = make_guarded(TOK * H * D, 0), dk = make_guarded(TOK * H * D, 0), dv = make_guarded(TOK * H * D, 0);
    guarded lse = make_guarded_es((int64_t)2 * max_len * H, 4, 0);   // the API's bound: batch x max_len rows per head
    int32_t *dcu = device_ints(cu, 3);
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_BF16, 2, max_len, max_len, H, H, D);
    p.problem.cu_seqlens_q = p.problem.cu_seqlens_k = dcu;
    fa3c_tensor *ts[4] = {&p.q, &p.k, &p.v, &p.out};
    guarded *gs[4] = {&q, &k, &v, &out};
    for (int i = 0; i < 4; i++) {
        *ts[i] = tu_tensor(data(gs[i]), 1, TOK, H, D);
        ts[i]->stride[0] = 0;   // packed: one batch of tokens
    }
    p.lse = (float *)data(&lse);
    p.backend = FA3C_BACKEND_CUDA;
    expect_device_check(what, fa3c_fwd_check_device(&p, NULL), needle);
    fa3c_status st = fa3c_fwd(&p, NULL);
    guarded fwd_outs[2] = {out, lse};
    check_aftermath(what, st, fwd_outs, 2);
    if (backward) {
        fa3c_bwd_params b;
        fa3c_bwd_params_init(&b);
        b.problem = p.problem;
        b.q = p.q, b.k = p.k, b.v = p.v, b.out = p.out;
        fa3c_tensor *bs[4] = {&b.dout, &b.dq, &b.dk, &b.dv};
        guarded *bg[4] = {&dout, &dq, &dk, &dv};
        for (int i = 0; i < 4; i++) {
            *bs[i] = tu_tensor(data(bg[i]), 1, TOK, H, D);
            bs[i]->stride[0] = 0;
        }
        b.lse = (const float *)data(&lse);
        b.backend = FA3C_BACKEND_CUDA;
        char label[128];
        snprintf(label, sizeof label, "%s, backward", what);
        expect_device_check(label, fa3c_bwd_check_device(&b, NULL), needle);
        guarded outs[3] = {dq, dk, dv};
        check_aftermath(label, fa3c_bwd(&b, NULL), outs, 3);
    }
    guarded all[9] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (int i = 0; i < 9; i++) cudaFree(all[i].alloc);
    cudaFree(dcu);
}

TEST(varlen_cu_seqlens_past_the_tokens) {
    REQUIRE_SM90();
    const int32_t past[3] = {0, 20, 4000};   // 30 tokens in the tensors (2 x 15)
    varlen_case("cu_seqlens [0, 20, 4000] with max_seqlen 15", past, 15, 1, "problem.cu_seqlens_q");
    const int32_t decreasing[3] = {0, 25, 10};
    varlen_case("cu_seqlens decreasing", decreasing, 30, 1, "problem.cu_seqlens_q");
    const int32_t negative[3] = {-50, 5, 30};
    varlen_case("cu_seqlens starting at -50", negative, 64, 1, "problem.cu_seqlens_q[0]");
    const int32_t longer[3] = {0, 30, 30};   // a sequence longer than max_len (16)
    varlen_case("a sequence longer than max_seqlen", longer, 16, 1, "problem.cu_seqlens_q");
    const int32_t valid[3] = {0, 10, 25};
    varlen_case("valid cu_seqlens [0, 10, 25]", valid, 15, 1, NULL);
}

// A paged cache of 4 pages of 16 keys, two sequences, with table entries
// past the pages and negative, and cache lengths past the table.
TEST(paged_table_past_the_pages) {
    REQUIRE_SM90();
    enum { B = 2, SQ = 1, H = 2, D = 128, PAGES = 4, PS = 16, MAXP = 4 };
    guarded q = make_guarded(B * SQ * H * D, 1), out = make_guarded(B * SQ * H * D, 0);
    guarded k = make_guarded(PAGES * PS * H * D, 1), v = make_guarded(PAGES * PS * H * D, 1);
    const int32_t table[B * MAXP] = {0, 999, 2, -7, 3, 1, 1 << 30, 2};
    const int32_t used_ok[B] = {64, 40}, used_past[B] = {5000, 64};
    int32_t *dtable = device_ints(table, B * MAXP), *dused_ok = device_ints(used_ok, B),
            *dused_past = device_ints(used_past, B);
    for (int c = 0; c < 2; c++) {
        fa3c_fwd_params p;
        fa3c_fwd_params_init(&p);
        tu_problem_shape(&p.problem, FA3C_DTYPE_BF16, B, SQ, MAXP * PS, H, H, D);
        p.problem.page_table = dtable;
        p.problem.page_table_stride = MAXP;
        p.problem.page_size = PS;
        p.problem.num_pages = PAGES;
        p.problem.seqused_k = c == 0 ? dused_ok : dused_past;
        p.q = tu_tensor(data(&q), B, SQ, H, D);
        p.k = tu_tensor(data(&k), PAGES, PS, H, D);
        p.v = tu_tensor(data(&v), PAGES, PS, H, D);
        p.out = tu_tensor(data(&out), B, SQ, H, D);
        p.backend = FA3C_BACKEND_CUDA;
        for (int splits = 1; splits <= 2; splits++) {   // whole, and split-KV with its combine
            p.num_splits = splits;
            char label[128];
            snprintf(label, sizeof label, "page table entries 999, -7, 2^30%s, %d split%s",
                     c ? ", seqused_k 5000 over 64 keys" : "", splits, splits > 1 ? "s" : "");
            if (splits == 1) expect_device_check(label, fa3c_fwd_check_device(&p, NULL), c ? "problem.seqused_k[0]" : "problem.page_table[0][1]");
            check_aftermath(label, fa3c_fwd(&p, NULL), &out, 1);
        }
    }
    guarded all[4] = {q, out, k, v};
    for (int i = 0; i < 4; i++) cudaFree(all[i].alloc);
    cudaFree(dtable), cudaFree(dused_ok), cudaFree(dused_past);
}

// seqused_k past seqlen_k, and negative, on a contiguous cache: forward and backward.
TEST(seqused_k_past_the_keys) {
    REQUIRE_SM90();
    enum { B = 2, S = 64, H = 2, D = 128 };
    const int64_t n = (int64_t)B * S * H * D;
    guarded q = make_guarded(n, 1), k = make_guarded(n, 1), v = make_guarded(n, 1), out = make_guarded(n, 0);
    guarded dout = make_guarded(n, 1), dq = make_guarded(n, 0), dk = make_guarded(n, 0), dv = make_guarded(n, 0);
    float *lse = NULL;
    cudaMalloc((void **)&lse, (size_t)B * H * S * 4);
    const int32_t used[B] = {5000, -3};
    int32_t *dused = device_ints(used, B);
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_BF16, B, S, S, H, H, D);
    p.problem.seqused_k = dused;
    p.q = tu_tensor(data(&q), B, S, H, D), p.k = tu_tensor(data(&k), B, S, H, D);
    p.v = tu_tensor(data(&v), B, S, H, D), p.out = tu_tensor(data(&out), B, S, H, D);
    p.lse = lse;
    p.backend = FA3C_BACKEND_CUDA;
    expect_device_check("seqused_k {5000, -3}", fa3c_fwd_check_device(&p, NULL), "problem.seqused_k[0]");
    check_aftermath("seqused_k {5000, -3} over 64 keys", fa3c_fwd(&p, NULL), &out, 1);
    fa3c_bwd_params b;
    fa3c_bwd_params_init(&b);
    b.problem = p.problem;
    b.q = p.q, b.k = p.k, b.v = p.v, b.out = p.out;
    b.dout = tu_tensor(data(&dout), B, S, H, D);
    b.lse = lse;
    b.dq = tu_tensor(data(&dq), B, S, H, D), b.dk = tu_tensor(data(&dk), B, S, H, D);
    b.dv = tu_tensor(data(&dv), B, S, H, D);
    b.backend = FA3C_BACKEND_CUDA;
    guarded outs[3] = {dq, dk, dv};
    expect_device_check("seqused_k {5000, -3}, backward", fa3c_bwd_check_device(&b, NULL), "problem.seqused_k[0]");
    check_aftermath("seqused_k {5000, -3} over 64 keys, backward", fa3c_bwd(&b, NULL), outs, 3);
    guarded all[8] = {q, k, v, out, dout, dq, dk, dv};
    for (int i = 0; i < 8; i++) cudaFree(all[i].alloc);
    cudaFree(lse);
    cudaFree(dused);
}

// A per-sequence count in device memory (problem.seqused_q or .leftpad_k)
// of {5000, -3}: past the queries or keys, and negative. fa3c_fwd_check_device
// names it; the forward (unsplit and split-KV, whose combine reads the counts
// too) keeps to the tensors it has.
static void forward_with_counts_past_the_ends(int leftpad) {
    enum { B = 2, S = 64, SK = 512, H = 2, D = 128 };   // 4 key blocks: room for split-KV
    const char *name = leftpad ? "leftpad_k" : "seqused_q";
    const int64_t n = (int64_t)B * S * H * D, nk = (int64_t)B * SK * H * D;
    guarded q = make_guarded(n, 1), k = make_guarded(nk, 1), v = make_guarded(nk, 1), out = make_guarded(n, 0);
    float *lse = NULL;
    cudaMalloc((void **)&lse, (size_t)B * H * S * 4);
    const int32_t counts[B] = {5000, -3};
    int32_t *dcounts = device_ints(counts, B);
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_BF16, B, S, SK, H, H, D);
    if (leftpad) p.problem.leftpad_k = dcounts;
    else p.problem.seqused_q = dcounts;
    p.problem.causal = 1;
    p.q = tu_tensor(data(&q), B, S, H, D), p.k = tu_tensor(data(&k), B, SK, H, D);
    p.v = tu_tensor(data(&v), B, SK, H, D), p.out = tu_tensor(data(&out), B, S, H, D);
    p.lse = lse;
    p.backend = FA3C_BACKEND_CUDA;
    char label[96], needle[32];
    snprintf(label, sizeof label, "%s {5000, -3}", name);
    snprintf(needle, sizeof needle, "problem.%s[0]", name);
    expect_device_check(label, fa3c_fwd_check_device(&p, NULL), needle);
    for (int splits = 1; splits <= 2; splits++) {
        p.num_splits = splits;
        snprintf(label, sizeof label, "%s {5000, -3} over %s, %d split%s", name,
                 leftpad ? "512 keys" : "64 queries", splits, splits > 1 ? "s" : "");
        check_aftermath(label, fa3c_fwd(&p, NULL), &out, 1);
    }
    guarded all[4] = {q, k, v, out};
    for (int i = 0; i < 4; i++) cudaFree(all[i].alloc);
    cudaFree(lse);
    cudaFree(dcounts);
}

TEST(seqused_q_past_the_queries) {
    REQUIRE_SM90();
    forward_with_counts_past_the_ends(0);
}

TEST(leftpad_k_past_the_keys) {
    REQUIRE_SM90();
    forward_with_counts_past_the_ends(1);
}

TEST_MAIN()
