// The Hopper forward kernel through the public API (backend CUDA) against
// the float64 CPU reference, with ARCHITECTURE.md's accuracy rule:
//   max|gpu - ref| <= 2 * max|naive-in-input-precision - ref| + atol,
// LSE within a small absolute error, outputs poisoned first and every
// element written, and a second run on the same inputs bit-identical (a
// moving result is a race).
#include "gpu_util.cuh"
#include "testutil.h"
#include "cpu/cpu.h"
#include "cuda/forward/fwd_tiles.h"
#include "backend.h"

typedef struct {
    fa3c_dtype dtype;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim;
    int causal, window_left, window_right;
    float softcap;
    int packed_qkv;      // q, k, v interleaved in one (b, s, 3h, d) buffer (needs heads_q == heads_kv)
    float outlier;       // > 0: scale 0.1% of q and k entries by this (large logits)
    float key_ramp;      // > 0: key n scaled by 1 + key_ramp * (seqlen_k - 1 - n) / seqlen_k, so the
                         // row max grows as the kernel walks the key blocks down (lazy rescaling)
    float sink_scale;    // > 0: key sink_key scaled by this (key 0, the last one the kernel walks: scores
    int sink_key;        // jump late; the last key: the first walked block holds a score far above the rest)
    int out_pad;         // elements of padding after each output token row (2: no 16-byte stores)
    int num_splits;      // split-KV: 0 = auto (the default), 1 = off, n = at most n
    int seqused;         // 1: sequence b uses used[b] of the seqlen_k keys (seqused_k, the variable-length
    int used[8];         // instances); the K and V rows past each count are NaN, which must not reach the output
    int page_size;       // > 0: the GPU reads K and V from a paged cache (page table; the references do not)
    int sinks;           // 1: a learned attention sink per query head (problem.sinks): -inf, one far above
                         // every score (out ~ 0), and random ones around the scores' range
} fwd_case;

static fwd_case base_case(fa3c_dtype dt, int b, int sq, int sk, int h, int d) {
    fwd_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.batch = b;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.heads_q = c.heads_kv = h;
    c.headdim = d;
    c.window_left = c.window_right = -1;
    return c;
}

static fwd_case causal_case(fa3c_dtype dt, int b, int sq, int sk, int h, int d) {
    fwd_case c = base_case(dt, b, sq, sk, h, d);
    c.causal = 1;
    return c;
}

// Host buffer of element size es on the device.
static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

// Elements of the poisoned (0xFFFF: NaN) guard regions of `guard` elements
// before and after the n-element output at out_alloc + guard that the
// kernel overwrote; -1 when they could not be read.
static int64_t guards_written(const void *out_alloc, int64_t guard, int64_t n, size_t es) {
    uint16_t *guards = (uint16_t *)tu_alloc((size_t)guard * es);
    int64_t written = 0;
    for (int side = 0; side < 2; side++) {
        if (cudaMemcpy(guards, (const char *)out_alloc + (side ? guard + n : 0) * es, (size_t)guard * es,
                       cudaMemcpyDeviceToHost) != cudaSuccess) {
            written = -1;
            break;
        }
        for (int64_t i = 0; i < guard; i++) written += guards[i] != 0xFFFF;
    }
    free(guards);
    return written;
}

// The checks every case makes, on n output elements as floats: the GPU's
// (gf) written everywhere (no NaN poison left) and within ARCHITECTURE.md's
// rule against the float64 reference (ref), given the naive one in the
// input precision (lf); the n_lse LSE values close; the two runs' bytes
// equal (a moving result is a race); nothing written outside (guards).
static void check_outputs(fa3c_dtype dt, const float *gf, const float *lf, const float *ref, int64_t n,
                          const float *glse, const float *ref_lse, int64_t n_lse, int identical,
                          int64_t guard_written) {
    int64_t unwritten = 0, lse_bad = 0;
    for (int64_t i = 0; i < n; i++) unwritten += isnan(gf[i]);
    const double err = tu_max_abs_err(gf, ref, n), err_lowp = tu_max_abs_err(lf, ref, n), atol = 1e-3;
    double lse_err = 0;
    for (int64_t i = 0; i < n_lse; i++) {
        if (isinf(ref_lse[i]) && isinf(glse[i]) && ref_lse[i] == glse[i]) continue;
        double e = fabs((double)glse[i] - ref_lse[i]);
        if (!(e <= 2e-3 * (1 + fabs(ref_lse[i])))) lse_bad++;
        if (!(e <= lse_err)) lse_err = isnan(e) ? INFINITY : e;
    }
    printf("    max err %.3g (naive %s %.3g, bound %.3g), rel L2 %.3g, LSE max err %.3g, runs identical %d\n", err,
           tu_dtype_name(dt), err_lowp, 2 * err_lowp + atol, tu_rel_l2_err(gf, ref, n), lse_err, identical);
    CHECK(unwritten == 0, "%lld output elements left unwritten (NaN)", (long long)unwritten);
    CHECK(guard_written == 0, "%lld elements written outside the output", (long long)guard_written);
    CHECK(err <= 2 * err_lowp + atol, "max error %g over bound %g", err, 2 * err_lowp + atol);
    CHECK(lse_bad == 0, "%lld LSE values off (max err %g)", (long long)lse_bad, lse_err);
    CHECK(identical, "two runs on the same inputs differ: a race");
}

static void run_case(const char *label, fwd_case c) {
    const int64_t B = c.batch, SQ = c.seqlen_q, SK = c.seqlen_k, HQ = c.heads_q, HK = c.heads_kv, D = c.headdim;
    const size_t es = tu_dtype_size(c.dtype);
    printf("[%s] %s b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d window=(%d,%d) softcap=%g packed=%d outlier=%g "
           "key_ramp=%g sink=%g@%d splits=%d",
           label, tu_dtype_name(c.dtype), c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.headdim,
           c.causal, c.window_left, c.window_right, c.softcap, c.packed_qkv, c.outlier, c.key_ramp, c.sink_scale, c.sink_key, c.num_splits);
    for (int b = 0; c.seqused && b < c.batch; b++) printf("%s%d", b ? "," : " seqused_k=", c.used[b]);
    printf("%s\n", c.sinks ? " sinks" : "");
    if ((c.seqused || c.page_size) && (c.packed_qkv || c.batch > 8)) {
        CHECK(0, "test case: seqused_k and paging need separate K, V and batch <= 8");
        return;
    }
    if (c.page_size) printf("    paged: pages of %d keys\n", c.page_size);

    // Inputs: separate tensors, or one packed (b, s, 3, h, d) buffer.
    int64_t nq = B * SQ * HQ * D, nk = B * SK * HK * D;
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem.dtype = c.dtype;
    p.problem.batch = c.batch;
    p.problem.seqlen_q = c.seqlen_q;
    p.problem.seqlen_k = c.seqlen_k;
    p.problem.heads_q = c.heads_q;
    p.problem.heads_kv = c.heads_kv;
    p.problem.headdim = c.headdim;
    p.problem.causal = c.causal;
    p.problem.window_left = c.window_left;
    p.problem.window_right = c.window_right;
    p.problem.softcap = c.softcap;
    p.num_splits = c.num_splits;
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)D));   // explicit: the internal lowp reference needs it

    void *bufs[3];
    random_qkv(&p.q, &p.k, &p.v, bufs, c.dtype, c.packed_qkv, B, SQ, SK, HQ, HK, D);
    void *hq = p.q.data, *hk = p.k.data, *hv = p.v.data, *hpacked = c.packed_qkv ? bufs[0] : NULL;
    if (c.key_ramp > 0) {   // hk is (b, s, h, d): scale whole key rows
        for (int64_t i = 0; i < nk; i++) {
            int n = (int)((i / ((int64_t)HK * D)) % SK);
            tu_store(hk, c.dtype, i, tu_load(hk, c.dtype, i) * (1.f + c.key_ramp * (float)(SK - 1 - n) / (float)SK));
        }
    }
    if (c.sink_scale > 0) {   // key sink_key of every (batch, head)
        for (int64_t i = 0; i < nk; i++)
            if ((i / ((int64_t)HK * D)) % SK == c.sink_key)
                tu_store(hk, c.dtype, i, tu_load(hk, c.dtype, i) * c.sink_scale);
    }
    int32_t used[8];
    if (c.seqused) {   // the keys past each sequence's count: NaN (a KV cache's unused rows may hold anything)
        for (int b = 0; b < c.batch; b++) used[b] = c.used[b];
        for (int64_t i = 0; i < nk; i++) {
            int64_t b = i / (SK * HK * D), n = (i / (HK * D)) % SK;
            if (n >= used[b]) {
                tu_store(hk, c.dtype, i, NAN);
                tu_store(hv, c.dtype, i, NAN);
            }
        }
        p.problem.seqused_k = used;   // host memory for the CPU references; a device copy for the GPU run
    }
    if (c.outlier > 0) {   // a few large entries in q and k: large logits
        for (int64_t i = 0; i < nq / 1000 + 1; i++) {
            int64_t j = tu_rand_int(0, (int)(nq - 1));
            tu_store(hq, c.dtype, j, tu_load(hq, c.dtype, j) * c.outlier);
        }
        for (int64_t i = 0; i < nk / 1000 + 1; i++) {
            int64_t j = tu_rand_int(0, (int)(nk - 1));
            tu_store(hk, c.dtype, j, tu_load(hk, c.dtype, j) * c.outlier);
        }
    }
    float *sinks = NULL;
    if (c.sinks) {   // host values for the references, a device copy for the GPU run
        sinks = (float *)tu_alloc((size_t)HQ * sizeof(float));
        for (int h = 0; h < HQ; h++)
            sinks[h] = h % 4 == 0 ? -INFINITY : h % 4 == 1 ? 40.f : (float)tu_rand_int(-300, 500) / 100.f;
        p.problem.sinks = sinks;
    }
    tu_strides_bshd(p.out.stride, B, SQ, HQ, D);
    const int64_t out_row = HQ * D + c.out_pad, n_out = B * SQ * out_row;   // elements of the output buffer
    p.out.stride[1] = out_row;
    p.out.stride[0] = SQ * out_row;

    // Reference in float64 on fp32 copies (exact), and the naive low-precision one.
    float *fq = (float *)tu_alloc(nq * 4), *fk = (float *)tu_alloc(nk * 4), *fv = (float *)tu_alloc(nk * 4);
    tu_gather(fq, &p.q, c.dtype, B, SQ, HQ, D);
    tu_gather(fk, &p.k, c.dtype, B, SK, HK, D);
    tu_gather(fv, &p.v, c.dtype, B, SK, HK, D);
    float *ref = (float *)tu_alloc(nq * 4), *ref_lse = (float *)tu_alloc(B * HQ * SQ * 4);
    fa3c_fwd_params r = p;
    r.problem.dtype = FA3C_DTYPE_FP32;
    r.q = tu_tensor(fq, B, SQ, HQ, D);
    r.k = tu_tensor(fk, B, SK, HK, D);
    r.v = tu_tensor(fv, B, SK, HK, D);
    r.out = tu_tensor(ref, B, SQ, HQ, D);
    r.lse = ref_lse;
    r.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&r, NULL) == FA3C_STATUS_OK, "reference: %s", fa3c_last_error());

    void *lowp = tu_alloc(nq * es);
    fa3c_fwd_params lp = p;
    lp.out = tu_tensor(lowp, B, SQ, HQ, D);
    lp.lse = NULL;
    CHECK(fa3c_cpu_fwd_reference_lowp(&lp) == FA3C_STATUS_OK, "lowp reference: %s", fa3c_last_error());

    // The GPU run, twice on the same inputs.
    size_t in_bytes_q = (c.packed_qkv ? 3 * nq : nq) * es;
    void *dq = to_device(hpacked ? hpacked : hq, in_bytes_q);
    void *dk = hpacked ? (char *)dq + HQ * D * es : to_device(hk, nk * es);
    void *dv = hpacked ? (char *)dq + 2 * HQ * D * es : to_device(hv, nk * es);
    int32_t *dused = c.seqused ? (int32_t *)to_device(used, (size_t)c.batch * sizeof used[0]) : NULL;
    float *dsinks = sinks ? (float *)to_device(sinks, (size_t)HQ * sizeof(float)) : NULL;
    // Paged (c.page_size): the logical K and V rows go to the pages of a shuffled table, in a cache whose
    // other rows and pages are NaN; each table row has one entry more than needed, -1, and with seqused_k
    // the entries of pages wholly past a sequence's count are invalid too (-1, or past the last page),
    // which the kernel must never read.
    const int ps = c.page_size, pages_per_seq = ps ? (int)((SK + ps - 1) / ps) : 0;
    const int num_pages = c.batch * pages_per_seq + 3;   // 3 pages no sequence uses
    const int64_t table_stride = pages_per_seq + 1, page_elems = (int64_t)ps * HK * D;
    void *dpk = NULL, *dpv = NULL;
    int32_t *dtable = NULL;
    if (ps) {
        int32_t *perm = (int32_t *)tu_alloc((size_t)num_pages * 4), *table = (int32_t *)tu_alloc((size_t)B * table_stride * 4);
        for (int i = 0; i < num_pages; i++) perm[i] = i;
        for (int i = num_pages - 1; i > 0; i--) {
            int j = tu_rand_int(0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < table_stride; i++) {
                const int unused = i >= pages_per_seq || (c.seqused && i * ps >= used[b]);
                table[b * table_stride + i] = !unused ? perm[b * pages_per_seq + i] : i % 2 ? -1 : num_pages + 7;
            }
        char *hpk = (char *)tu_alloc((size_t)(num_pages * page_elems) * es), *hpv = (char *)tu_alloc((size_t)(num_pages * page_elems) * es);
        memset(hpk, 0xFF, (size_t)(num_pages * page_elems) * es);   // NaN in bf16 and fp16
        memset(hpv, 0xFF, (size_t)(num_pages * page_elems) * es);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < SK; j++) {
                int64_t page = table[b * table_stride + j / ps], dst = (page * ps + j % ps) * HK * D, src = (b * SK + j) * HK * D;
                if (page < 0 || page >= num_pages) continue;   // a page past the sequence's count
                memcpy(hpk + dst * es, (char *)hk + src * es, (size_t)(HK * D) * es);
                memcpy(hpv + dst * es, (char *)hv + src * es, (size_t)(HK * D) * es);
            }
        dpk = to_device(hpk, (size_t)(num_pages * page_elems) * es);
        dpv = to_device(hpv, (size_t)(num_pages * page_elems) * es);
        dtable = (int32_t *)to_device(table, (size_t)B * table_stride * 4);
        free(perm);
        free(table);
        free(hpk);
        free(hpv);
    }
    // The output sits between two guard regions of 256 token rows, which must
    // keep their poison: rows above row 0 (tiles shifted up under a causal
    // mask) and past the end are computed but must never be stored.
    const int64_t guard = 256 * out_row;
    void *dout_alloc = NULL, *dout = NULL;
    float *dlse = NULL;
    CUDA_OK(cudaMalloc(&dout_alloc, (n_out + 2 * guard) * es));
    dout = (char *)dout_alloc + guard * es;
    CUDA_OK(cudaMalloc((void **)&dlse, B * HQ * SQ * 4));
    void *gout[2] = {tu_alloc(n_out * es), tu_alloc(n_out * es)};
    float *glse = (float *)tu_alloc(B * HQ * SQ * 4);
    for (int run = 0; run < 2; run++) {
        CUDA_OK(cudaMemset(dout_alloc, 0xFF, (n_out + 2 * guard) * es));   // NaN poison
        CUDA_OK(cudaMemset(dlse, 0xFF, B * HQ * SQ * 4));
        fa3c_fwd_params g = p;
        g.q.data = dq;
        g.k.data = dk;
        g.v.data = dv;
        g.out.data = dout;
        g.lse = dlse;
        g.problem.seqused_k = dused;
        g.problem.sinks = dsinks;
        if (ps) {
            g.k.data = dpk;
            g.v.data = dpv;
            tu_strides_bshd(g.k.stride, num_pages, ps, HK, D);
            tu_strides_bshd(g.v.stride, num_pages, ps, HK, D);
            g.problem.page_table = dtable;
            g.problem.page_table_stride = table_stride;
            g.problem.page_size = ps;
            g.problem.num_pages = num_pages;
        }
        g.backend = FA3C_BACKEND_CUDA;
        fa3c_status st = fa3c_fwd(&g, NULL);
        CHECK(st == FA3C_STATUS_OK, "fa3c_fwd(CUDA): %s: %s", fa3c_status_string(st), fa3c_last_error());
        if (st != FA3C_STATUS_OK) return;
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(gout[run], dout, n_out * es, cudaMemcpyDeviceToHost));
        if (run == 0) CUDA_OK(cudaMemcpy(glse, dlse, B * HQ * SQ * 4, cudaMemcpyDeviceToHost));
    }
    // Every element written, the rule met, the LSE close, the two runs equal; padding untouched.
    float *gf = (float *)tu_alloc(nq * 4), *lf = (float *)tu_alloc(nq * 4);
    fa3c_tensor gt = p.out;
    gt.data = gout[0];
    tu_gather(gf, &gt, c.dtype, B, SQ, HQ, D);   // the logical output, padding skipped
    for (int64_t i = 0; i < nq; i++) lf[i] = tu_load(lowp, c.dtype, i);
    int64_t pad_written = 0;   // padding between output rows must keep its poison
    for (int64_t row = 0; row < B * SQ; row++)
        for (int64_t e = HQ * D; e < out_row; e++) {
            uint16_t bits;
            memcpy(&bits, (char *)gout[0] + (row * out_row + e) * es, 2);
            pad_written += bits != 0xFFFF;
        }
    check_outputs(c.dtype, gf, lf, ref, nq, glse, ref_lse, B * HQ * SQ, memcmp(gout[0], gout[1], n_out * es) == 0,
                  guards_written(dout_alloc, guard, n_out, es));
    CHECK(pad_written == 0, "%lld padding elements overwritten", (long long)pad_written);

    cudaFree(dq);
    if (!hpacked) { cudaFree(dk); cudaFree(dv); }
    cudaFree(dout_alloc);
    cudaFree(dlse);
    cudaFree(dused);
    cudaFree(dsinks);
    free(sinks);
    cudaFree(dpk);
    cudaFree(dpv);
    cudaFree(dtable);
    free(hpacked ? hpacked : hq);
    if (!hpacked) { free(hk); free(hv); }
    free(fq); free(fk); free(fv); free(ref); free(ref_lse); free(lowp);
    free(gout[0]); free(gout[1]); free(glse); free(gf); free(lf);
}

#define BF16 FA3C_DTYPE_BF16
#define FP16 FA3C_DTYPE_FP16

TEST(fwd_bf16_hdim128_basic) {
    REQUIRE_SM90();
    run_case("basic", base_case(BF16, 2, 384, 384, 4, 128));
}
TEST(fwd_bf16_hdim64) {
    REQUIRE_SM90();
    run_case("hdim64", base_case(BF16, 2, 500, 500, 3, 64));
}
TEST(fwd_bf16_hdim256) {
    REQUIRE_SM90();
    run_case("hdim256", base_case(BF16, 1, 300, 300, 2, 256));
}
TEST(fwd_fp16_hdim128) {
    REQUIRE_SM90();
    run_case("fp16", base_case(FP16, 2, 256, 256, 2, 128));
}
TEST(fwd_seqlen_1) {
    REQUIRE_SM90();
    run_case("seqlen 1", base_case(BF16, 3, 1, 1, 2, 128));
    run_case("decode sq 1", base_case(BF16, 2, 1, 777, 2, 128));
}
TEST(fwd_seqlen_17_and_1000) {
    REQUIRE_SM90();
    run_case("17", base_case(BF16, 2, 17, 17, 2, 64));
    run_case("1000", base_case(BF16, 1, 1000, 1000, 2, 128));
}
TEST(fwd_seqlen_4097) {
    REQUIRE_SM90();
    run_case("4097", base_case(BF16, 1, 4097, 4097, 1, 64));
}
TEST(fwd_causal) {
    REQUIRE_SM90();
    fwd_case c = causal_case(BF16, 2, 1000, 1000, 2, 128);
    run_case("causal", c);
    c = causal_case(BF16, 1, 333, 333, 2, 256);
    run_case("causal hdim256", c);
}
TEST(fwd_causal_sq_ne_sk) {
    REQUIRE_SM90();
    fwd_case c = causal_case(BF16, 2, 200, 700, 2, 128);   // bottom-right aligned
    run_case("causal sq<sk", c);
    c = causal_case(BF16, 2, 700, 200, 2, 64);              // first 500 rows fully masked
    run_case("causal sq>sk", c);
}
// Under a causal mask the partial row block's idle warpgroups are at the top
// (m_shift, whole warpgroups of 64 rows): their rows above row 0 are loaded
// (zeros) but never stored (the guard regions of run_case). Register stores
// (hdim 96), TMA stores from own staging (64) and from the V ring (192, 256),
// split-KV partials; rows past the end in the last tile too.
TEST(fwd_causal_partial_tile_on_top) {
    REQUIRE_SM90();
    fwd_case c = causal_case(BF16, 2, 1024, 1024, 2, 64);   // 6 tiles of 192 rows: rows -128..63 first
    run_case("causal hdim64 1024", c);
    c = causal_case(BF16, 2, 500, 500, 2, 64);             // shift 64 of 76 padding rows
    run_case("causal hdim64 500", c);
    c = causal_case(FP16, 1, 300, 300, 2, 96);             // shift 64 of 84, register stores
    run_case("causal hdim96 300", c);
    c = base_case(BF16, 1, 440, 440, 2, 192);              // shift 64 of 72, a window with right bound 0
    c.window_left = 100;
    c.window_right = 0;
    run_case("hdim192 window (100, 0)", c);
    c = causal_case(BF16, 2, 180, 700, 2, 256);            // shift 64 of 76, 2 splits (64-key blocks)
    c.num_splits = 2;
    run_case("causal hdim256 sq<sk, 2 splits", c);
    c = causal_case(FP16, 1, 1080, 1080, 2, 256);          // shift 64 of 72 (80-key blocks: seqlen_k > 1024)
    run_case("causal hdim256 1080", c);
}
// A consumer warpgroup skips the leading key blocks masked for all its rows
// (warpgroup_part): 192-row tiles (hdim 64), key blocks of 112 and 80 keys
// (hdim 192, 256) that do not line up with the 64-row warpgroups, with split
// KV, a window's right side and GQA packing.
TEST(fwd_warpgroup_skips_masked_blocks) {
    REQUIRE_SM90();
    fwd_case c = causal_case(BF16, 3, 512, 512, 2, 64);
    run_case("causal hdim64 512", c);
    c = causal_case(BF16, 1, 400, 400, 2, 192);
    run_case("causal hdim192", c);
    c = causal_case(FP16, 1, 300, 1200, 2, 256);  // 15 blocks of 80 keys, 5 per split: in split 2 the
    c.num_splits = 3;                              // first warpgroup of rows 64-191 skips key block 13
    run_case("fp16 hdim256 causal sq<sk, 3 splits", c);
    c = causal_case(BF16, 2, 512, 512, 2, 64);   // split 0 of rows 0-191: warpgroups 0 and 1 skip block 1
    c.num_splits = 2;
    run_case("causal hdim64, 2 splits", c);
    c = base_case(BF16, 1, 500, 500, 2, 256);
    c.window_left = 50;
    c.window_right = 20;
    run_case("hdim256 window (50, 20)", c);
    c = base_case(BF16, 1, 200, 240, 12, 64);   // 6 heads per KV head packed (rows = query x head): the
    c.heads_kv = 2;                              // first warpgroup of rows 384-575 skips key block 1
    c.causal = 1;
    run_case("gqa 6 packed, causal", c);
}
TEST(fwd_gqa_8_and_6) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 2, 300, 300, 16, 128);
    c.heads_kv = 2;
    run_case("gqa 8:1", c);
    c = base_case(BF16, 1, 300, 300, 12, 64);
    c.heads_kv = 2;
    c.causal = 1;
    run_case("gqa 6:1 causal", c);
}
TEST(fwd_sliding_window) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 1, 1000, 1000, 2, 128);
    c.window_left = 100;
    c.window_right = 30;
    run_case("window", c);
    c = base_case(BF16, 1, 600, 300, 2, 64);   // rows before the keys start: fully masked
    c.window_left = 20;
    c.window_right = 0;
    run_case("window fully masked rows", c);
}
// Attention sinks (problem.sinks): the epilogue adds each head's sink to the
// row's sum, or with split-KV the combine does; heads get -inf, 40 (far
// above every score: out ~ 0, lse ~ 40, the overflow-safe form) and random
// sinks. Rows that see no key must give out 0 and lse = the sink.
TEST(fwd_sinks) {
    REQUIRE_SM90();
    if (!FA3C_CUDA_SINKS) SKIP("the CUDA kernels' sinks are off in this build (-DFA3C_CUDA_SINKS=1 turns them on)");
    fwd_case c = base_case(BF16, 2, 300, 300, 4, 128);
    c.sinks = 1;
    run_case("sinks", c);
    c = base_case(FP16, 1, 200, 200, 8, 64);
    c.sinks = 1;
    c.causal = 1;
    run_case("sinks causal fp16 hdim64", c);
    c = base_case(BF16, 1, 600, 300, 4, 256);   // rows before the keys start: fully masked
    c.sinks = 1;
    c.window_left = 20;
    c.window_right = 0;
    run_case("sinks window fully masked rows hdim256", c);
    c = base_case(BF16, 2, 1, 3000, 8, 128);   // decode, split-KV: the combine adds the sink
    c.heads_kv = 2;
    c.sinks = 1;
    c.num_splits = 4;
    run_case("sinks decode gqa 4 splits", c);
    c = base_case(BF16, 3, 40, 500, 4, 128);   // the variable-length instance; one sequence with no keys
    c.sinks = 1;
    c.seqused = 1;
    c.used[0] = 500;
    c.used[1] = 0;
    c.used[2] = 77;
    run_case("sinks seqused_k (one 0)", c);
    c.num_splits = 3;
    run_case("sinks seqused_k (one 0), 3 splits", c);
}
TEST(fwd_softcap) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 1, 400, 400, 2, 128);
    c.softcap = 30.f;
    c.outlier = 10.f;
    run_case("softcap", c);
}
TEST(fwd_large_logits) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 1, 512, 512, 2, 128);
    c.outlier = 30.f;
    run_case("outliers", c);
}
// The kernel walks key blocks from the last to the first; with keys growing
// towards the first, row maxima keep rising, by more than 2^8 (the running
// max moves and O is rescaled) and by less (it stays, P exceeds 1): both
// sides of lazy rescaling (FA3C_FWD_LAZY_RESCALE), for the rescale after the
// P·V wait (hdim 128, 256) and under Q·Kᵀ (hdim 64).
TEST(fwd_rising_row_max) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 1, 1000, 1000, 2, 128);
    c.key_ramp = 12.f;
    run_case("rising max hdim128", c);
    c = causal_case(FP16, 1, 700, 700, 2, 64);
    c.key_ramp = 12.f;
    run_case("rising max hdim64 causal fp16", c);
    c = base_case(BF16, 1, 300, 777, 2, 256);
    c.key_ramp = 6.f;
    run_case("rising max hdim256", c);
}
// A key that the walk reaches last (key 0, as attention sinks are) with
// scores far above the rest: by up to ~2^100 in exp2 units with scale 20,
// where rows move their offset by a power of 2 (FA3C_FWD_STALE_MAX:
// STEP_SHIFTED), and past 2^128 with scale 300, where a probability
// overflows and the warp computes its scores again (STEP_LOST, mma.sync)
// - for every head dim (Q in registers or smem; 128- and 64-byte swizzles;
// key blocks of 128, 112 and 80).
TEST(fwd_late_score_jump) {
    REQUIRE_SM90();
    const int dims[] = {64, 96, 128, 192, 256};
    for (int i = 0; i < 5; i++) {
        for (int big = 0; big < 2; big++) {
            fwd_case c = base_case(i == 1 ? FP16 : BF16, 1, 300, 1000, 2, dims[i]);
            c.sink_scale = big ? 300.f : 20.f;
            run_case(big ? "overflowing jump" : "large jump", c);
        }
    }
    fwd_case c = causal_case(FP16, 1, 700, 700, 2, 128);
    c.sink_scale = 300.f;
    run_case("overflowing jump causal fp16", c);
    // The big key in the first block walked, which takes the row max.
    for (int i = 0; i < 2; i++) {
        c = base_case(BF16, 1, 300, 1000, 2, i ? 64 : 128);
        c.sink_key = 999;
        c.sink_scale = 300.f;
        run_case("overflowing score in the first block", c);
        c.sink_scale = 20.f;
        run_case("large score in the first block", c);
    }
}
TEST(fwd_packed_qkv) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 2, 300, 300, 3, 128);
    c.packed_qkv = 1;
    c.causal = 1;
    run_case("packed qkv", c);
}

TEST(fwd_l2_sections) {
    REQUIRE_SM90();
    // K and V of one head take 4 * 12000 * 128 B = 6 MB, so with a 50-60 MB L2
    // the tile order has sections of 2 (batch, head) pairs (fwd_host.c): 3 pairs
    // give a full section and a narrower last one.
    fwd_case c = base_case(BF16, 1, 300, 12000, 3, 128);
    run_case("l2 sections", c);
    c.causal = 1;
    run_case("l2 sections causal", c);
}

TEST(fwd_persistent_many_tiles) {
    REQUIRE_SM90();
    // 80 (batch, head) pairs x 4 row blocks of 192 = 320 tiles: more than two
    // per CTA on a 132-SM GPU, so the persistent loop runs several steps:
    // round-robin without a mask, longest/shortest pairs with one.
    fwd_case c = base_case(BF16, 2, 640, 640, 40, 64);
    c.heads_kv = 8;
    run_case("many tiles", c);
    c.causal = 1;
    run_case("many tiles causal", c);
}

TEST(fwd_o_staged_in_v_many_tiles) {
    REQUIRE_SM90();
    // hdim 192 and 256 stage O in the V ring: the next tile's V loads wait for
    // the last O store. Enough tiles for several per CTA, each kind of tile
    // boundary: full tiles, a single key block per tile (the slot released
    // before belongs to the previous tile), fully masked tiles between
    // computed ones (sq > sk causal) and GQA.
    fwd_case c = base_case(BF16, 1, 512, 512, 64, 256);
    run_case("hdim256 256 tiles", c);
    c = base_case(FP16, 1, 600, 50, 40, 256);
    run_case("hdim256 one key block per tile", c);
    c = causal_case(BF16, 1, 700, 200, 40, 192);
    run_case("hdim192 causal sq>sk, empty tiles", c);
    c = base_case(BF16, 2, 640, 640, 24, 192);
    c.heads_kv = 6;
    c.causal = 1;
    run_case("hdim192 gqa causal", c);
    c = base_case(BF16, 1, 300, 300, 48, 256);   // no TMA store (row pitch): the ring's barrier alone
    c.out_pad = 2;
    run_case("hdim256 register stores", c);
}

// A shape for the cluster tests, run without split-KV.
typedef struct {
    fa3c_dtype dt;
    int b, sq, sk, hq, hkv, d;
    float softcap;
    const char *what;
} cluster_case;

// Runs each case and checks that it ran in pairs where the build pairs it:
// in a build with clusters (-DFA3C_FWD_CLUSTER=2) every case here has an
// even number of row blocks and no mask, so each one pairs (fwd_plan.c). In
// a default build the hdim-256 ones pair (the main hdim-256 instances are
// clustered: FA3C_FWD_CLUSTER_256), and the others are plain forward cases.
static void run_cluster_cases(const cluster_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const cluster_case *k = &cases[i];
        fwd_case c = base_case(k->dt, k->b, k->sq, k->sk, k->hq, k->d);
        c.heads_kv = k->hkv;
        c.softcap = k->softcap;
        c.num_splits = 1;
        run_case(k->what, c);
        const int clustered = FA3C_FWD_CLUSTER > 1 || (k->d == 256 && FA3C_FWD_CLUSTER_256 == 2);
        const int want = clustered ? 2 : 1;
        CHECK(fa3c_cuda_fwd_last_cluster() == want, "%s: ran in clusters of %d, want %d", k->what,
              fa3c_cuda_fwd_last_cluster(), want);
    }
}

TEST(fwd_cluster_pairs) {
    REQUIRE_SM90();
    printf("FA3C_FWD_CLUSTER=%d FA3C_FWD_CLUSTER_256=%d\n", FA3C_FWD_CLUSTER, FA3C_FWD_CLUSTER_256);
    const cluster_case cases[] = {
        {BF16, 2, 512, 512, 40, 40, 128, 0.f, "hdim128, more cluster tiles than clusters"},
        {BF16, 1, 1000, 777, 3, 3, 128, 0.f, "hdim128, ragged keys"},
        {BF16, 1, 130, 300, 2, 2, 128, 0.f, "hdim128, rank 1's second warpgroup idle"},
        {FP16, 2, 384, 600, 12, 2, 64, 20.f, "hdim64 (384-row pairs), GQA 6:1, softcap"},
        {BF16, 1, 256, 333, 4, 4, 96, 0.f, "hdim96 (64-byte swizzle, register stores)"},
        {BF16, 1, 256, 500, 4, 4, 192, 0.f, "hdim192 (O staged in the V ring)"},
        {FP16, 1, 512, 300, 64, 8, 256, 0.f, "hdim256, GQA 8:1, several tiles per cluster"},
        {BF16, 1, 256, 50, 40, 40, 256, 0.f, "hdim256, one key block per tile"},
        // O staged in the V ring across several tiles per cluster: with one key
        // block per tile warpgroup 0 stages in the previous tile's slot; an
        // idle warpgroup in every rank-1 tile; hdim 192.
        {BF16, 2, 256, 50, 80, 80, 256, 0.f, "hdim256, one key block per tile, several tiles per cluster"},
        {BF16, 2, 130, 300, 80, 80, 256, 0.f, "hdim256, idle warpgroup, several tiles per cluster"},
        {BF16, 1, 256, 400, 80, 80, 192, 0.f, "hdim192, several tiles per cluster"},
    };
    run_cluster_cases(cases, sizeof cases / sizeof cases[0]);
}

// A few small paired shapes for compute-sanitizer (tools/experiments/cluster.sh):
// a plain pair, and O staged in the V ring with one key block per tile.
TEST(fwd_cluster_pairs_small) {
    REQUIRE_SM90();
    const cluster_case cases[] = {
        {BF16, 1, 256, 300, 2, 2, 128, 0.f, "pair hdim128"},
        {BF16, 1, 256, 50, 2, 2, 256, 0.f, "pair hdim256, one key block"},
    };
    run_cluster_cases(cases, sizeof cases / sizeof cases[0]);
}

TEST(fwd_long_noncausal) {
    REQUIRE_SM90();
    // seqlen_k >= 2048, non-causal: a partial last key block (2500 keys), GQA
    // with softcap in fp16, and a window over long keys.
    run_case("long keys bf16", base_case(BF16, 1, 300, 2500, 2, 128));
    fwd_case c = base_case(FP16, 2, 129, 2048, 4, 128);
    c.heads_kv = 2;
    c.softcap = 20.f;
    run_case("long keys fp16 gqa softcap", c);
    c = base_case(BF16, 1, 200, 2200, 2, 128);
    c.window_left = 300;
    run_case("long keys, window", c);
}

TEST(fwd_padded_output_rows) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 2, 300, 300, 2, 128);   // row pitch not a multiple of 16 B: 4-byte stores
    c.out_pad = 2;
    run_case("out pad 2", c);
    c = base_case(FP16, 1, 130, 130, 3, 64);             // 16-byte multiple: vector stores, padding untouched
    c.out_pad = 8;
    run_case("out pad 8", c);
}

TEST(fwd_hdim96_and_192) {
    REQUIRE_SM90();
    fwd_case c = causal_case(BF16, 2, 333, 333, 2, 96);   // 64-byte swizzle path
    run_case("hdim96 causal", c);
    run_case("hdim96 fp16", base_case(FP16, 1, 200, 260, 2, 96));
    c = base_case(BF16, 1, 300, 300, 4, 192);
    c.heads_kv = 2;
    run_case("hdim192 gqa", c);
    run_case("hdim192 fp16", base_case(FP16, 1, 257, 257, 2, 192));
}

// A value head dim of its own (problem.headdim_v; MLA prefill: q, k 192 with
// v 128), on the kernel of the wider head dim: v's extra columns read as
// zeros, out holds v's columns only (guards around it). Against the float64
// reference with the naive low-precision one as the scale, both from the CPU.
static void run_headdim_v_case(const char *label, fa3c_dtype dt, int B, int SQ, int SK, int HQ, int HK, int D,
                               int DV, int causal, int num_splits) {
    printf("[%s] %s b=%d sq=%d sk=%d hq=%d hkv=%d d=%d dv=%d causal=%d splits=%d\n", label, tu_dtype_name(dt), B, SQ,
           SK, HQ, HK, D, DV, causal, num_splits);
    const size_t es = tu_dtype_size(dt);
    const int64_t nq = (int64_t)B * SQ * HQ * D, nk = (int64_t)B * SK * HK * D, nv = (int64_t)B * SK * HK * DV;
    const int64_t no = (int64_t)B * SQ * HQ * DV, nl = (int64_t)B * HQ * SQ;
    void *hq = tu_alloc(nq * es), *hk = tu_alloc(nk * es), *hv = tu_alloc(nv * es);
    tu_fill_normal(hq, dt, nq, 1.f);
    tu_fill_normal(hk, dt, nk, 1.f);
    tu_fill_normal(hv, dt, nv, 1.f);
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, dt, B, SQ, SK, HQ, HK, D);
    p.problem.headdim_v = DV;
    p.problem.causal = causal;
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)D));
    p.num_splits = num_splits;
    p.q = tu_tensor(hq, B, SQ, HQ, D), p.k = tu_tensor(hk, B, SK, HK, D), p.v = tu_tensor(hv, B, SK, HK, DV);
    p.out = tu_tensor(NULL, B, SQ, HQ, DV);
    float *fq = (float *)tu_alloc(nq * 4), *fk = (float *)tu_alloc(nk * 4), *fv = (float *)tu_alloc(nv * 4);
    for (int64_t i = 0; i < nq; i++) fq[i] = tu_load(hq, dt, i);
    for (int64_t i = 0; i < nk; i++) fk[i] = tu_load(hk, dt, i);
    for (int64_t i = 0; i < nv; i++) fv[i] = tu_load(hv, dt, i);
    float *ref = (float *)tu_alloc(no * 4), *ref_lse = (float *)tu_alloc(nl * 4);
    fa3c_fwd_params r = p;
    r.problem.dtype = FA3C_DTYPE_FP32;
    r.q.data = fq, r.k.data = fk, r.v.data = fv, r.out.data = ref, r.lse = ref_lse;
    r.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&r, NULL) == FA3C_STATUS_OK, "reference: %s", fa3c_last_error());
    void *lowp = tu_alloc(no * es);
    fa3c_fwd_params lp = p;
    lp.out.data = lowp;
    CHECK(fa3c_cpu_fwd_reference_lowp(&lp) == FA3C_STATUS_OK, "lowp reference: %s", fa3c_last_error());
    const int64_t guard = 4096;
    void *dq = to_device(hq, nq * es), *dk = to_device(hk, nk * es), *dv = to_device(hv, nv * es), *dout_alloc = NULL;
    float *dlse = NULL;
    CUDA_OK(cudaMalloc(&dout_alloc, (size_t)(no + 2 * guard) * es));
    CUDA_OK(cudaMalloc((void **)&dlse, (size_t)nl * 4));
    void *gout[2] = {tu_alloc(no * es), tu_alloc(no * es)};
    float *glse = (float *)tu_alloc(nl * 4);
    for (int run = 0; run < 2; run++) {
        CUDA_OK(cudaMemset(dout_alloc, 0xFF, (size_t)(no + 2 * guard) * es));
        fa3c_fwd_params g = p;
        g.q.data = dq, g.k.data = dk, g.v.data = dv, g.out.data = (char *)dout_alloc + guard * es, g.lse = dlse;
        g.backend = FA3C_BACKEND_CUDA;
        fa3c_status st = fa3c_fwd(&g, NULL);
        CHECK(st == FA3C_STATUS_OK, "fa3c_fwd(CUDA): %s: %s", fa3c_status_string(st), fa3c_last_error());
        if (st != FA3C_STATUS_OK) return;
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(gout[run], (char *)dout_alloc + guard * es, (size_t)no * es, cudaMemcpyDeviceToHost));
        if (run == 0) CUDA_OK(cudaMemcpy(glse, dlse, (size_t)nl * 4, cudaMemcpyDeviceToHost));
    }
    float *gf = (float *)tu_alloc(no * 4), *lf = (float *)tu_alloc(no * 4);
    for (int64_t i = 0; i < no; i++) gf[i] = tu_load(gout[0], dt, i), lf[i] = tu_load(lowp, dt, i);
    check_outputs(dt, gf, lf, ref, no, glse, ref_lse, nl, memcmp(gout[0], gout[1], (size_t)no * es) == 0,
                  guards_written(dout_alloc, guard, no, es));
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout_alloc), cudaFree(dlse);
    free(hq), free(hk), free(hv), free(fq), free(fk), free(fv), free(ref), free(ref_lse), free(lowp);
    free(gout[0]), free(gout[1]), free(glse), free(gf), free(lf);
}

TEST(fwd_headdim_v) {
    REQUIRE_SM90();
    run_headdim_v_case("MLA prefill 192/128 causal", BF16, 2, 300, 300, 4, 4, 192, 128, 1, 1);
    run_headdim_v_case("MLA prefill 192/128 gqa, 3 splits", BF16, 1, 77, 500, 8, 2, 192, 128, 0, 3);
    run_headdim_v_case("128/192 fp16 (v wider)", FP16, 1, 129, 257, 2, 2, 128, 192, 1, 1);
    run_headdim_v_case("64/40 decode gqa 8, auto splits", BF16, 2, 1, 1000, 16, 2, 64, 40, 0, 0);
    run_headdim_v_case("256/64", BF16, 1, 200, 200, 2, 1, 256, 64, 0, 1);
}

// GQA packing (fwd_host.c: the query heads of a KV head share a tile when
// seqlen_q is short): the 5-D Q box, row -> (query, head) in the mask and
// the epilogue, and a consumer warpgroup with no real rows (idle).
TEST(fwd_gqa_packed_decode) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 2, 1, 1000, 16, 128);   // 8 heads per KV head: 8 of 128 rows
    c.heads_kv = 2;
    c.num_splits = 1;
    run_case("decode gqa 8", c);
    c = base_case(BF16, 1, 5, 700, 32, 128);             // 32 per KV head: a box of 32 heads x 4 queries
    c.heads_kv = 1;
    c.causal = 1;
    c.num_splits = 1;
    run_case("mqa 32, sq 5, causal", c);
    c = base_case(FP16, 2, 17, 300, 12, 64);             // 6 per KV head into 192 rows, 102 real
    c.heads_kv = 2;
    c.window_left = 40;
    c.window_right = 3;
    c.num_splits = 1;
    run_case("gqa 6, sq 17, window", c);
    c = base_case(BF16, 1, 3, 500, 8, 256);
    c.heads_kv = 2;
    c.softcap = 15.f;
    c.num_splits = 1;
    run_case("gqa 4 hdim256 softcap", c);
}

// Split-KV: key ranges in separate tiles, partial results merged by
// fwd_combine.cu; splits with no key for some rows (causal, window) carry
// lse = -inf into the merge.
TEST(fwd_split_kv) {
    REQUIRE_SM90();
    fwd_case c = base_case(BF16, 2, 1, 3000, 16, 128);   // auto: few tiles, many key blocks
    c.heads_kv = 2;
    run_case("decode auto splits", c);
    c = causal_case(BF16, 1, 300, 1000, 2, 64);
    c.num_splits = 5;
    run_case("causal sq<sk, 5 splits", c);
    c = base_case(FP16, 1, 17, 2500, 3, 256);
    c.num_splits = 3;
    run_case("fp16 hdim256 sq 17, 3 splits", c);
    c = base_case(BF16, 1, 600, 300, 2, 96);             // rows before the keys start: no split sees a key
    c.window_left = 20;
    c.window_right = 0;
    c.num_splits = 4;
    run_case("window fully masked rows, 4 splits", c);
    c = base_case(BF16, 1, 4, 200, 4, 192);              // more splits asked than key blocks
    c.heads_kv = 1;
    c.num_splits = 64;
    c.out_pad = 2;
    run_case("64 splits asked, 2 key blocks", c);
}

// Sequences with their own number of keys (seqused_k: a KV cache of
// seqlen_k rows per sequence, filled up to used[b]): the variable-length
// instances. The rows past each count are NaN in K and V (run_case), so a
// masked key that leaked, or a V row that P·V multiplied by P = 0 without
// v_guard's zeros, shows in the output. Counts of 0 (zeros, LSE -inf), 1,
// a whole block, one past a block, and all keys; every head dim and both
// dtypes; causal (bottom-right aligned per sequence), window, softcap.
// The variable-length kernels are built unless FA3C_CUDA_VARLEN=OFF (or when listed in FA3C_INSTANCES).
#define REQUIRE_VARLEN_KERNELS()                                                                         \
    do {                                                                                                 \
        int32_t used_ = 1;                                                                               \
        fa3c_problem pr_;                                                                                \
        memset(&pr_, 0, sizeof pr_);                                                                     \
        pr_.dtype = FA3C_DTYPE_BF16;                                                                     \
        pr_.headdim = 128;                                                                               \
        pr_.seqused_k = &used_;                                                                          \
        if (fa3c_cuda_fwd_block_n(&pr_) == 0)                                                            \
            SKIP("this build has no variable-length (seqused_k) kernels: cmake -DFA3C_CUDA_VARLEN=ON");  \
    } while (0)

static fwd_case used_case(fwd_case c, int u0, int u1, int u2, int u3) {
    const int u[4] = {u0, u1, u2, u3};
    c.seqused = 1;
    for (int b = 0; b < c.batch; b++) c.used[b] = u[b % 4];
    return c;
}

TEST(fwd_seqused_k) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    run_case("hdim128", used_case(base_case(BF16, 4, 300, 1000, 2, 128), 0, 1, 517, 1000));
    run_case("hdim128 causal", used_case(causal_case(BF16, 4, 300, 1000, 2, 128), 129, 1, 517, 300));
    fwd_case c = used_case(base_case(FP16, 2, 200, 640, 2, 128), 128, 257, 0, 0);
    c.softcap = 20.f;
    run_case("hdim128 fp16 softcap", c);
    c = used_case(causal_case(BF16, 3, 200, 700, 2, 64), 129, 700, 64, 0);   // 192-row tiles
    run_case("hdim64 causal", c);
    c = used_case(base_case(FP16, 2, 130, 300, 2, 96), 33, 250, 0, 0);   // 64-byte swizzle, register stores
    run_case("hdim96 fp16", c);
    c = used_case(base_case(BF16, 2, 100, 260, 4, 192), 113, 5, 0, 0);    // 112-key blocks
    c.heads_kv = 2;
    run_case("hdim192 gqa", c);
    c = used_case(base_case(BF16, 2, 256, 400, 2, 256), 81, 333, 0, 0);   // 80-key blocks, O in the V ring
    c.window_left = 100;
    c.window_right = 0;
    run_case("hdim256 window (100, 0)", c);
    c = used_case(base_case(BF16, 3, 150, 900, 2, 128), 640, 333, 129, 0);   // left bound only; then both, right > 0
    c.window_left = 200;
    run_case("hdim128 window (200, -1)", c);
    c.window_left = 50;
    c.window_right = 30;
    run_case("hdim128 window (50, 30)", c);
    c = used_case(causal_case(FP16, 2, 180, 700, 2, 256), 700, 161, 0, 0);   // short causal: still 80-key blocks
    c.softcap = 30.f;
    run_case("hdim256 fp16 causal softcap", c);
}

// The same for decoding from a KV cache: GQA packing, split-KV (auto and
// asked), a split past a sequence's last key (an empty partial).
TEST(fwd_seqused_k_decode) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    fwd_case c = used_case(base_case(BF16, 3, 1, 3000, 16, 128), 1, 2999, 1500, 0);
    c.heads_kv = 2;
    run_case("decode gqa 8, auto splits", c);
    c.num_splits = 4;
    run_case("decode gqa 8, 4 splits", c);
    c = used_case(base_case(BF16, 4, 4, 900, 8, 64), 0, 4, 130, 899);
    c.heads_kv = 1;
    c.causal = 1;
    c.num_splits = 1;
    run_case("mqa 8 hdim64, sq 4, causal", c);
}

// Small enough for compute-sanitizer (tools/gpu.sh check).
TEST(fwd_seqused_k_small) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    run_case("small hdim128", used_case(causal_case(BF16, 2, 70, 300, 2, 128), 129, 37, 0, 0));
    run_case("small hdim256", used_case(base_case(BF16, 2, 70, 200, 2, 256), 81, 0, 0, 0));
}

// A paged KV cache (page_table): K and V of each sequence in pages of a
// shuffled table, the rest of the cache NaN. Page sizes against the key
// block (128 keys for hdim 64-128, 112 for 192, 80 for 256): larger (one box
// per block), equal, and smaller, so that a block is read as several boxes
// of gcd(block, page) rows from different pages (16: 8 boxes; 48 and 64
// with 80- or 128-key blocks: boxes of 16; 8 for hdim 96); with seqused_k,
// GQA packing, split-KV, causal and window masks.
static fwd_case paged_case(fwd_case c, int page_size) {
    c.page_size = page_size;
    return c;
}

TEST(fwd_paged_kv) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    fwd_case c = used_case(base_case(BF16, 3, 1, 1000, 16, 128), 1000, 513, 1, 0);
    c.heads_kv = 2;
    run_case("decode gqa 8, pages of 256", paged_case(c, 256));
    run_case("decode gqa 8, pages of 128", paged_case(c, 128));
    run_case("causal hdim128, pages of 16", paged_case(causal_case(BF16, 2, 200, 700, 2, 128), 16));
    run_case("fp16 hdim64, pages of 48", paged_case(used_case(base_case(FP16, 2, 100, 500, 2, 64), 130, 500, 0, 0), 48));
    c = used_case(base_case(BF16, 2, 64, 400, 2, 256), 81, 400, 0, 0);
    c.window_left = 100;
    c.window_right = 0;
    run_case("hdim256 window, pages of 64", paged_case(c, 64));
    run_case("hdim192, pages of 32", paged_case(base_case(BF16, 2, 50, 300, 2, 192), 32));
    run_case("fp16 hdim96, pages of 8", paged_case(base_case(FP16, 2, 33, 200, 2, 96), 8));
    c = used_case(base_case(BF16, 2, 1, 3000, 16, 128), 3000, 1777, 0, 0);   // auto split-KV
    c.heads_kv = 2;
    run_case("decode split-KV, pages of 128", paged_case(c, 128));
    run_case("hdim128, pages of 512", paged_case(used_case(base_case(BF16, 2, 130, 1500, 2, 128), 1500, 700, 0, 0), 512));
    // Boxes of 8 rows of 128 bytes, and boxes that are not a power of two (40, 56 rows).
    run_case("hdim128, pages of 8", paged_case(used_case(base_case(BF16, 2, 40, 300, 2, 128), 300, 99, 0, 0), 8));
    run_case("hdim128 causal, pages of 24", paged_case(causal_case(FP16, 2, 100, 333, 2, 128), 24));
    run_case("hdim256, pages of 40", paged_case(used_case(base_case(BF16, 2, 64, 400, 2, 256), 399, 121, 0, 0), 40));
    run_case("hdim192, pages of 56", paged_case(used_case(causal_case(BF16, 2, 64, 400, 2, 192), 400, 57, 0, 0), 56));
    // Boxes that start inside a swizzle atom: pages of 1 (SGLang's default), 3, 12 and 17 keys (boxes of
    // 1 or 4 rows), and hdim 96's 64-byte rows with even pages (boxes of 2).
    c = used_case(base_case(BF16, 3, 1, 700, 16, 128), 700, 313, 1, 0);
    c.heads_kv = 2;
    run_case("decode gqa 8, pages of 1", paged_case(c, 1));
    run_case("hdim64 causal, pages of 3", paged_case(used_case(causal_case(BF16, 2, 90, 400, 2, 64), 400, 131, 0, 0), 3));
    run_case("hdim256, pages of 12", paged_case(used_case(base_case(FP16, 2, 64, 300, 2, 256), 299, 13, 0, 0), 12));
    run_case("hdim192 causal, pages of 17", paged_case(used_case(causal_case(BF16, 2, 50, 300, 2, 192), 300, 18, 0, 0), 17));
    run_case("hdim96, pages of 6", paged_case(used_case(base_case(BF16, 2, 33, 250, 2, 96), 250, 7, 0, 0), 6));
    // 8 x 10 x 2 = 160 tiles: CTAs take several, so the producer waits for the last tile's O stores to
    // read the V slot hdim 256 stages O in (o_free).
    run_case("hdim256 causal, pages of 1, 160 tiles",
             paged_case(used_case(causal_case(BF16, 8, 256, 300, 10, 256), 300, 161, 256, 1), 1));
}

// Small enough for compute-sanitizer (tools/gpu.sh check).
TEST(fwd_paged_kv_small) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    run_case("small paged hdim128", paged_case(used_case(causal_case(BF16, 2, 70, 300, 2, 128), 129, 37, 0, 0), 16));
    // Pages of 1: one-row TMA boxes.
    run_case("small paged hdim128, pages of 1", paged_case(used_case(causal_case(BF16, 2, 70, 300, 2, 128), 129, 37, 0, 0), 1));
}

// Packed sequences (cu_seqlens): q and out (and k, v when keys are packed)
// hold the sequences one after the other, lengths lens_q[b] (lens_k[b]);
// unpacked keys are (batch, seqlen_k) with each sequence's first lens_k[b]
// used (seqused_k). The references read the same packed tensors with host
// cu_seqlens; the GPU output lies between poisoned guard regions (a tile's
// rows above its sequence are computed from the previous sequence's tokens,
// or zeros before the tensor, and must never be stored). Every element
// written, the accuracy rule, the LSE ((heads, total_q)), two runs equal.
typedef struct {
    fa3c_dtype dtype;
    int batch, heads_q, heads_kv, headdim;
    int lens_q[6], lens_k[6];
    int packed_k;        // 0: keys (batch, seqlen_k) with seqused_k = lens_k
    int causal, window_left, window_right;
    float softcap;
    int num_splits;      // 0: auto (packed_base)
    int fixed_q;         // 1: q and out (batch, lens_q[0], ...) without cu_seqlens_q (every lens_q equal)
    int must_split;      // 1: the call must run with more than one key split
    int seqused_q;       // 1: sequence b uses its first used_q[b] queries (problem.seqused_q); the
    int used_q[6];       //    others are NaN in q and their out / lse rows must stay unwritten
    int leftpad;         // 1: sequence b's keys start past leftpad_k[b] rows of its lens_k[b] (problem.leftpad_k),
    int leftpad_k[6];    //    rows which are NaN in k and v
} packed_case;

static packed_case packed_base(fa3c_dtype dt, int batch, int h, int d, const int *lens_q, const int *lens_k) {
    packed_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.batch = batch;
    c.heads_q = c.heads_kv = h;
    c.headdim = d;
    for (int b = 0; b < batch; b++) {
        c.lens_q[b] = lens_q[b];
        c.lens_k[b] = lens_k[b];
    }
    c.packed_k = 1;
    c.window_left = c.window_right = -1;
    return c;
}

static void run_packed_case(const char *label, packed_case c) {
    const int B = c.batch, HQ = c.heads_q, HK = c.heads_kv, D = c.headdim;
    const size_t es = tu_dtype_size(c.dtype);
    int32_t cu_q[7] = {0}, cu_k[7] = {0};
    int max_q = 1, max_k = 1;
    for (int b = 0; b < B; b++) {
        cu_q[b + 1] = cu_q[b] + c.lens_q[b];
        cu_k[b + 1] = cu_k[b] + c.lens_k[b];
        max_q = c.lens_q[b] > max_q ? c.lens_q[b] : max_q;
        max_k = c.lens_k[b] > max_k ? c.lens_k[b] : max_k;
    }
    for (int b = 0; b < B && c.fixed_q; b++)
        if (c.lens_q[b] != max_q) {
            CHECK(0, "%s: queries (batch, seqlen_q) need every lens_q equal", label);
            return;
        }
    const int64_t TQ = cu_q[B], k_rows = c.packed_k ? cu_k[B] : (int64_t)B * max_k;
    printf("[%s] %s b=%d hq=%d hkv=%d d=%d causal=%d window=(%d,%d) softcap=%g splits=%d queries %s, keys %s, lengths",
           label, tu_dtype_name(c.dtype), B, HQ, HK, D, c.causal, c.window_left, c.window_right, c.softcap,
           c.num_splits, c.fixed_q ? "(batch, seqlen_q)" : "packed",
           c.packed_k ? "packed" : "(batch, seqlen_k) with seqused_k");
    for (int b = 0; b < B; b++) printf(" %d/%d", c.lens_q[b], c.lens_k[b]);
    for (int b = 0; c.seqused_q && b < B; b++) printf("%s%d", b ? "," : ", seqused_q ", c.used_q[b]);
    for (int b = 0; c.leftpad && b < B; b++) printf("%s%d", b ? "," : ", leftpad_k ", c.leftpad_k[b]);
    printf("\n");
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem.dtype = c.dtype;
    p.problem.batch = B;
    p.problem.seqlen_q = max_q;
    p.problem.seqlen_k = max_k;
    p.problem.heads_q = HQ;
    p.problem.heads_kv = HK;
    p.problem.headdim = D;
    p.problem.causal = c.causal;
    p.problem.window_left = c.window_left;
    p.problem.window_right = c.window_right;
    p.problem.softcap = c.softcap;
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)D));
    p.num_splits = c.num_splits;
    if (!c.fixed_q) p.problem.cu_seqlens_q = cu_q;
    int32_t used[6];
    for (int b = 0; b < B; b++) used[b] = c.lens_k[b];
    if (c.packed_k) p.problem.cu_seqlens_k = cu_k;
    else p.problem.seqused_k = used;
    if (c.seqused_q) p.problem.seqused_q = c.used_q;
    if (c.leftpad) p.problem.leftpad_k = c.leftpad_k;
    const int64_t nq = TQ * HQ * D, nk = k_rows * HK * D;
    void *hq = tu_alloc((nq + 1) * es), *hk = tu_alloc((nk + 1) * es), *hv = tu_alloc((nk + 1) * es);
    tu_fill_normal(hq, c.dtype, nq, 1.f);
    tu_fill_normal(hk, c.dtype, nk, 1.f);
    tu_fill_normal(hv, c.dtype, nk, 1.f);
    // Queries past seqused_q: NaN (a row of its own in the forward, never stored).
    for (int b = 0; c.seqused_q && b < B; b++)
        for (int64_t i = (int64_t)(cu_q[b] + c.used_q[b]) * HQ * D; i < (int64_t)cu_q[b + 1] * HQ * D; i++)
            tu_store(hq, c.dtype, i, NAN);
    // Keys before leftpad_k: NaN (the cache's padding, never read as keys; V rows there zeroed).
    for (int b = 0; c.leftpad && b < B; b++) {
        const int64_t row0 = c.packed_k ? cu_k[b] : (int64_t)b * max_k;
        for (int64_t i = row0 * HK * D; i < (row0 + c.leftpad_k[b]) * HK * D; i++) {
            tu_store(hk, c.dtype, i, NAN);
            tu_store(hv, c.dtype, i, NAN);
        }
    }
    const int64_t q_st[4] = {c.fixed_q ? max_q * HQ * D : 0, HQ * D, D, 1},
                  k_st[4] = {c.packed_k ? 0 : max_k * HK * D, HK * D, D, 1};
    memcpy(p.q.stride, q_st, sizeof q_st);
    memcpy(p.out.stride, q_st, sizeof q_st);
    memcpy(p.k.stride, k_st, sizeof k_st);
    memcpy(p.v.stride, k_st, sizeof k_st);
    // The float64 reference on fp32 copies, and the naive low-precision one.
    float *fq = (float *)tu_alloc((nq + 1) * 4), *fk = (float *)tu_alloc((nk + 1) * 4), *fv = (float *)tu_alloc((nk + 1) * 4);
    for (int64_t i = 0; i < nq; i++) fq[i] = tu_load(hq, c.dtype, i);
    for (int64_t i = 0; i < nk; i++) {
        fk[i] = tu_load(hk, c.dtype, i);
        fv[i] = tu_load(hv, c.dtype, i);
    }
    float *ref = (float *)tu_alloc((nq + 1) * 4), *ref_lse = (float *)tu_alloc((HQ * TQ + 1) * 4);
    fa3c_fwd_params r = p;
    r.problem.dtype = FA3C_DTYPE_FP32;
    r.q.data = fq;
    r.k.data = fk;
    r.v.data = fv;
    r.out.data = ref;
    r.lse = ref_lse;
    r.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&r, NULL) == FA3C_STATUS_OK, "reference: %s", fa3c_last_error());
    void *lowp = tu_alloc((nq + 1) * es);
    fa3c_fwd_params lp = p;
    lp.q.data = hq;
    lp.k.data = hk;
    lp.v.data = hv;
    lp.out.data = lowp;
    CHECK(fa3c_cpu_fwd_reference_lowp(&lp) == FA3C_STATUS_OK, "lowp reference: %s", fa3c_last_error());

    // The GPU run, twice; the output between guard regions of 256 token rows.
    const int64_t guard = 256 * (int64_t)HQ * D;
    void *dq = to_device(hq, (size_t)(nq + 1) * es), *dk = to_device(hk, (size_t)(nk + 1) * es);
    void *dv = to_device(hv, (size_t)(nk + 1) * es);
    int32_t *dcu_q = (int32_t *)to_device(cu_q, sizeof cu_q), *dcu_k = (int32_t *)to_device(cu_k, sizeof cu_k);
    int32_t *dused = (int32_t *)to_device(used, sizeof used);
    int32_t *dused_q = (int32_t *)to_device(c.used_q, sizeof c.used_q);
    int32_t *dleftpad = (int32_t *)to_device(c.leftpad_k, sizeof c.leftpad_k);
    void *dout_alloc = NULL;
    float *dlse = NULL;
    CUDA_OK(cudaMalloc(&dout_alloc, (size_t)(nq + 2 * guard) * es));
    CUDA_OK(cudaMalloc((void **)&dlse, (size_t)(HQ * TQ + 1) * 4));
    void *dout = (char *)dout_alloc + guard * es;
    void *gout[2] = {tu_alloc((nq + 1) * es), tu_alloc((nq + 1) * es)};
    float *glse = (float *)tu_alloc((HQ * TQ + 1) * 4);
    for (int run = 0; run < 2; run++) {
        CUDA_OK(cudaMemset(dout_alloc, 0xFF, (size_t)(nq + 2 * guard) * es));   // NaN poison
        CUDA_OK(cudaMemset(dlse, 0xFF, (size_t)(HQ * TQ + 1) * 4));
        fa3c_fwd_params g = p;
        g.q.data = dq;
        g.k.data = dk;
        g.v.data = dv;
        g.out.data = dout;
        g.lse = dlse;
        if (!c.fixed_q) g.problem.cu_seqlens_q = dcu_q;
        if (c.packed_k) g.problem.cu_seqlens_k = dcu_k;
        else g.problem.seqused_k = dused;
        if (c.seqused_q) g.problem.seqused_q = dused_q;
        if (c.leftpad) g.problem.leftpad_k = dleftpad;
        g.backend = FA3C_BACKEND_CUDA;
        fa3c_status st = fa3c_fwd(&g, NULL);
        CHECK(st == FA3C_STATUS_OK, "fa3c_fwd(CUDA): %s: %s", fa3c_status_string(st), fa3c_last_error());
        if (st != FA3C_STATUS_OK) return;
        if (run == 0) printf("    ran with %d key splits\n", fa3c_cuda_fwd_last_num_splits());
        CHECK(!c.must_split || fa3c_cuda_fwd_last_num_splits() > 1, "%s: ran with %d key splits, want more than 1",
              label, fa3c_cuda_fwd_last_num_splits());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(gout[run], dout, (size_t)nq * es, cudaMemcpyDeviceToHost));
        if (run == 0) CUDA_OK(cudaMemcpy(glse, dlse, (size_t)HQ * TQ * 4, cudaMemcpyDeviceToHost));
    }
    float *gf = (float *)tu_alloc((nq + 1) * 4), *lf = (float *)tu_alloc((nq + 1) * 4);
    for (int64_t i = 0; i < nq; i++) {
        gf[i] = tu_load(gout[0], c.dtype, i);
        lf[i] = tu_load(lowp, c.dtype, i);
    }
    // Rows past seqused_q: still the poison (NaN) on the GPU; then left out of the comparison.
    int64_t written_past_used = 0;
    for (int b = 0; c.seqused_q && b < B; b++)
        for (int q = c.used_q[b]; q < c.lens_q[b]; q++)
            for (int h = 0; h < HQ; h++) {
                const int64_t row = (int64_t)(cu_q[b] + q) * HQ + h;
                for (int64_t i = row * D; i < (row + 1) * D; i++) {
                    written_past_used += !isnan(gf[i]);
                    gf[i] = lf[i] = ref[i] = 0.f;
                }
                const int64_t l = c.fixed_q ? ((int64_t)b * HQ + h) * max_q + q : (int64_t)h * TQ + cu_q[b] + q;
                written_past_used += !isnan(glse[l]);
                glse[l] = ref_lse[l] = 0.f;
            }
    CHECK(written_past_used == 0, "%s: %lld out / lse values written past seqused_q", label,
          (long long)written_past_used);
    check_outputs(c.dtype, gf, lf, ref, nq, glse, ref_lse, HQ * TQ, memcmp(gout[0], gout[1], (size_t)nq * es) == 0,
                  guards_written(dout_alloc, guard, nq, es));
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dcu_q); cudaFree(dcu_k); cudaFree(dused); cudaFree(dused_q); cudaFree(dleftpad);
    cudaFree(dout_alloc); cudaFree(dlse);
    free(hq); free(hk); free(hv); free(fq); free(fk); free(fv); free(ref); free(ref_lse); free(lowp);
    free(gout[0]); free(gout[1]); free(glse); free(gf); free(lf);
}

// Sequences of 0, 1, a block, a block + 1 rows and keys, every head dim,
// both dtypes, causal (bottom-right per sequence), windows, softcap, GQA
// (packed into a tile's rows where that takes fewer tiles); keys packed too,
// or per sequence with seqused_k.
TEST(fwd_packed_sequences) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int a[4] = {300, 1, 0, 129};
    packed_case c = packed_base(BF16, 4, 2, 128, a, a);
    run_packed_case("hdim128 self", c);
    c.causal = 1;
    run_packed_case("hdim128 self causal", c);
    const int q64[3] = {500, 77, 200}, k64[3] = {520, 77, 193};
    c = packed_base(BF16, 3, 2, 64, q64, k64);
    c.causal = 1;
    run_packed_case("hdim64 causal (192-row tiles)", c);
    const int q256[2] = {81, 300}, k256[2] = {400, 300};
    c = packed_base(BF16, 2, 2, 256, q256, k256);
    c.window_left = 100;
    c.window_right = 0;
    run_packed_case("hdim256 window (O in the V ring)", c);
    const int q96[2] = {33, 130}, k96[2] = {200, 50};
    c = packed_base(FP16, 2, 2, 96, q96, k96);
    c.softcap = 20.f;
    run_packed_case("fp16 hdim96 cross, softcap (register stores)", c);
    const int q192[2] = {113, 250}, k192[2] = {113, 250};
    c = packed_base(BF16, 2, 4, 192, q192, k192);
    c.heads_kv = 2;
    c.causal = 1;
    run_packed_case("hdim192 gqa causal", c);
    const int qd[3] = {5, 40, 1}, kd[3] = {300, 1, 777};
    c = packed_base(BF16, 3, 8, 128, qd, kd);
    c.heads_kv = 1;
    c.packed_k = 0;
    c.causal = 1;
    run_packed_case("mqa, packed queries, keys with seqused_k", c);
    c.packed_k = 1;
    run_packed_case("mqa, packed queries and keys", c);
    // GQA packing (the query heads of a KV head as the rows of one tile): decode (one query per
    // sequence, 8 heads per KV head), and 4 heads per KV head with a tile starting above a sequence.
    const int q1[6] = {1, 1, 1, 1, 1, 1}, k1[6] = {700, 1, 300, 129, 0, 1000};
    c = packed_base(BF16, 6, 16, 128, q1, k1);
    c.heads_kv = 2;
    run_packed_case("varlen decode, gqa 8", c);
    c.packed_k = 0;
    run_packed_case("varlen decode, gqa 8, keys with seqused_k", c);
    const int q4[2] = {5, 40}, k4[2] = {333, 40};
    c = packed_base(FP16, 2, 8, 64, q4, k4);
    c.heads_kv = 2;
    c.causal = 1;
    run_packed_case("gqa 4, causal, hdim64", c);
    // Queries without keys (empty tiles: zeros and LSE -inf, by TMA box or, for a warpgroup with rows on
    // both sides of the sequence's start, from registers), and a window that empties whole tiles.
    const int qe[3] = {70, 5, 200}, ke[3] = {90, 0, 0};
    c = packed_base(BF16, 3, 2, 128, qe, ke);
    run_packed_case("queries without keys", c);
    const int qw[2] = {600, 300}, kw[2] = {100, 300};
    c = packed_base(BF16, 2, 2, 128, qw, kw);
    c.window_left = 50;
    c.window_right = 0;
    run_packed_case("window (50, 0), sq > sk: empty tiles", c);
}

// Split-KV with packed queries (vLLM's decode and mixed batches): each
// split's partials per query of a sequence, merged by fwd_combine.cu into
// the sequence's tokens; sequences with fewer key blocks than the longest
// get empty splits (lse -inf), sequences without queries nothing. The
// cases above run with num_splits 0 (auto), which splits the decode ones.
TEST(fwd_packed_sequences_split_kv) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int q1[6] = {1, 1, 1, 1, 1, 1}, k1[6] = {700, 1, 300, 129, 0, 1000};
    packed_case c = packed_base(BF16, 6, 16, 128, q1, k1);
    c.heads_kv = 2;
    c.num_splits = 5;
    c.must_split = 1;
    run_packed_case("varlen decode, gqa 8, 5 splits asked (4 ranges of 2 blocks)", c);
    c.packed_k = 0;
    run_packed_case("varlen decode, gqa 8, keys with seqused_k, 5 splits asked", c);
    const int q64[3] = {500, 77, 200}, k64[3] = {520, 77, 193};
    c = packed_base(BF16, 3, 2, 64, q64, k64);
    c.causal = 1;
    c.num_splits = 3;
    c.must_split = 1;
    run_packed_case("hdim64 causal, 3 splits", c);
    const int q256[3] = {81, 0, 300}, k256[3] = {400, 50, 300};
    c = packed_base(BF16, 3, 2, 256, q256, k256);
    c.window_left = 100;
    c.window_right = 0;
    c.num_splits = 4;
    c.must_split = 1;
    run_packed_case("hdim256 window, a sequence without queries, 4 splits asked (3 ranges)", c);
    const int q96[2] = {33, 130}, k96[2] = {200, 50};
    c = packed_base(FP16, 2, 2, 96, q96, k96);
    c.softcap = 20.f;
    c.num_splits = 2;
    c.must_split = 1;
    run_packed_case("fp16 hdim96 cross, softcap, 2 splits", c);
    const int qd[3] = {5, 40, 1}, kd[3] = {300, 1, 777};
    c = packed_base(BF16, 3, 8, 192, qd, kd);
    c.heads_kv = 1;
    c.packed_k = 0;
    c.causal = 1;
    c.num_splits = 64;
    c.must_split = 1;   // more than key blocks: one split per block
    run_packed_case("mqa hdim192 causal, keys with seqused_k, 64 splits asked", c);
    const int qm[4] = {1, 1, 37, 1}, km[4] = {2000, 3000, 37, 1};   // mixed: decode and a short prefill
    c = packed_base(BF16, 4, 8, 128, qm, km);
    c.heads_kv = 2;
    c.causal = 1;
    c.must_split = 1;
    run_packed_case("mixed decode and prefill, gqa 4, auto splits", c);
}

// Queries used per sequence (problem.seqused_q: FA3's, for padded batches and
// speculative decoding): sequence b has its first used_q[b] queries, the
// causal diagonal aligned to them; the rows past them are NaN in q and must
// stay unwritten in out and lse. Packed queries and (batch, seqlen_q) ones,
// GQA packed into a tile's rows, split-KV (the combine skips those rows too),
// every head dim. Small enough for compute-sanitizer (tools/gpu.sh check).
TEST(fwd_seqused_q) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int a[4] = {300, 1, 5, 129}, ua[4] = {200, 1, 0, 64};
    packed_case c = packed_base(BF16, 4, 2, 128, a, a);
    c.causal = 1;
    c.seqused_q = 1;
    memcpy(c.used_q, ua, sizeof ua);
    run_packed_case("hdim128 causal, packed queries", c);
    const int q64[3] = {150, 150, 150}, k64[3] = {150, 400, 7}, u64[3] = {150, 37, 0};
    c = packed_base(BF16, 3, 2, 64, q64, k64);
    c.fixed_q = 1;
    c.packed_k = 0;
    c.causal = 1;
    c.seqused_q = 1;
    memcpy(c.used_q, u64, sizeof u64);
    run_packed_case("hdim64 causal, (batch, seqlen_q), keys with seqused_k", c);
    // Speculative decoding: 4 query slots per sequence, some used; GQA 8 packed into the rows.
    const int q4[4] = {4, 4, 4, 4}, k4[4] = {700, 100, 1000, 5}, u4[4] = {4, 1, 2, 3};
    c = packed_base(BF16, 4, 16, 128, q4, k4);
    c.heads_kv = 2;
    c.fixed_q = 1;
    c.packed_k = 0;
    c.causal = 1;
    c.seqused_q = 1;
    memcpy(c.used_q, u4, sizeof u4);
    run_packed_case("speculative decode, gqa 8, (batch, 4 queries)", c);
    c.num_splits = 4;
    c.must_split = 1;
    run_packed_case("speculative decode, gqa 8, (batch, 4 queries), 4 splits asked", c);
    const int q256[3] = {81, 0, 300}, k256[3] = {400, 50, 300}, u256[3] = {80, 0, 1};
    c = packed_base(BF16, 3, 2, 256, q256, k256);
    c.window_left = 100;
    c.window_right = 0;
    c.num_splits = 3;
    c.must_split = 1;
    c.seqused_q = 1;
    memcpy(c.used_q, u256, sizeof u256);
    run_packed_case("hdim256 window, packed queries, 3 splits", c);
    const int q96[2] = {33, 130}, k96[2] = {200, 50}, u96[2] = {17, 129};
    c = packed_base(FP16, 2, 2, 96, q96, k96);
    c.softcap = 20.f;
    c.seqused_q = 1;
    memcpy(c.used_q, u96, sizeof u96);
    run_packed_case("fp16 hdim96 cross, softcap, packed queries", c);
    const int q192[2] = {250, 250}, k192[2] = {113, 250}, u192[2] = {113, 200};
    c = packed_base(BF16, 2, 4, 192, q192, k192);
    c.heads_kv = 2;
    c.fixed_q = 1;
    c.causal = 1;
    c.seqused_q = 1;
    memcpy(c.used_q, u192, sizeof u192);
    run_packed_case("hdim192 gqa causal, (batch, seqlen_q), packed keys", c);
}

// A left-padded KV cache (problem.leftpad_k: FA3's cache_leftpad): sequence
// b's keys start past leftpad_k[b] rows of its cache, which hold NaN; the
// causal diagonal aligns to the keys after the padding. Caches per sequence
// with seqused_k (decode, GQA packed into a tile's rows, split-KV) and packed
// keys; a sequence padded to its last key (no keys: out 0, lse -inf).
TEST(fwd_leftpad_k) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int q1[4] = {1, 1, 1, 1}, k1[4] = {700, 100, 1000, 5}, lp1[4] = {13, 0, 999, 5};
    packed_case c = packed_base(BF16, 4, 16, 128, q1, k1);
    c.heads_kv = 2;
    c.fixed_q = 1;
    c.packed_k = 0;
    c.causal = 1;
    c.leftpad = 1;
    memcpy(c.leftpad_k, lp1, sizeof lp1);
    run_packed_case("decode, gqa 8, cache with seqused_k, auto splits", c);
    c.num_splits = 4;
    c.must_split = 1;
    run_packed_case("decode, gqa 8, cache with seqused_k, 4 splits asked", c);
    const int q64[3] = {100, 1, 250}, k64[3] = {120, 77, 250}, lp64[3] = {20, 76, 0};
    c = packed_base(BF16, 3, 2, 64, q64, k64);
    c.causal = 1;
    c.leftpad = 1;
    memcpy(c.leftpad_k, lp64, sizeof lp64);
    run_packed_case("hdim64 causal, packed queries and keys", c);
    const int q256[2] = {40, 40}, k256[2] = {400, 300}, lp256[2] = {129, 1};
    c = packed_base(FP16, 2, 2, 256, q256, k256);
    c.fixed_q = 1;
    c.packed_k = 0;
    c.window_left = 100;
    c.window_right = 0;
    c.leftpad = 1;
    memcpy(c.leftpad_k, lp256, sizeof lp256);
    run_packed_case("fp16 hdim256 window, (batch, seqlen_q), cache with seqused_k", c);
}

// Any head dim, a multiple of 8 up to 256, on the next wider instance (64,
// 96, 128, 192, 256): TMA reads the columns past the tensors' as zeros and
// no store may write them (a write there lands in the next head's columns:
// wrong values, or a race between runs). Row stores, TMA boxes, split-KV's
// combine, GQA packing, packed sequences and a paged cache.
TEST(fwd_padded_head_dims) {
    REQUIRE_SM90();
    run_case("hdim 8", base_case(BF16, 1, 130, 130, 2, 8));
    run_case("hdim 40 causal", causal_case(BF16, 2, 200, 200, 2, 40));
    fwd_case c = causal_case(FP16, 1, 150, 300, 4, 80);   // on hdim 96's kernel
    c.heads_kv = 2;
    run_case("hdim 80 fp16 causal gqa", c);
    c = base_case(BF16, 1, 257, 257, 2, 112);
    c.softcap = 20.f;
    run_case("hdim 112 softcap", c);
    c = base_case(BF16, 2, 1, 2000, 16, 120);             // decode: gqa packing and split-KV
    c.heads_kv = 2;
    run_case("hdim 120 decode gqa 8, auto splits", c);
    run_case("hdim 160", base_case(BF16, 1, 300, 300, 2, 160));
    c = causal_case(BF16, 1, 100, 700, 2, 200);
    c.num_splits = 3;
    run_case("hdim 200 causal, 3 splits", c);
    c = base_case(FP16, 1, 129, 129, 2, 248);
    c.out_pad = 8;
    run_case("hdim 248 fp16, padded output rows", c);
    int32_t used1 = 1;   // the variable-length kernels (paged KV, packed sequences), where built
    fa3c_problem vl;
    memset(&vl, 0, sizeof vl);
    vl.dtype = FA3C_DTYPE_BF16, vl.headdim = 72, vl.seqused_k = &used1;
    if (fa3c_cuda_fwd_block_n(&vl) == 0) {
        printf("  (no variable-length kernels in this build: paged and packed cases not run)\n");
        return;
    }
    c = base_case(BF16, 2, 64, 300, 2, 72);
    c.page_size = 16;
    run_case("hdim 72 paged, pages of 16", c);
    const int q[3] = {100, 1, 250}, k[3] = {120, 77, 250};
    packed_case p = packed_base(BF16, 3, 2, 176, q, k);
    p.causal = 1;
    run_packed_case("hdim 176 packed sequences causal", p);
}

// Small enough for compute-sanitizer (tools/gpu.sh check).
TEST(fwd_packed_sequences_small) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int q[3] = {70, 1, 129}, k[3] = {90, 200, 129};
    packed_case c = packed_base(BF16, 3, 2, 128, q, k);
    c.causal = 1;
    run_packed_case("small packed hdim128", c);
    c.num_splits = 2;
    c.must_split = 1;
    run_packed_case("small packed hdim128, 2 splits", c);
}

// Packed keys (cu_seqlens_k) with queries per sequence, (batch, seqlen_q): the
// keys' end-aligned blocks without the queries' (the scheduler test's plans
// cover it on the CPU; this is its GPU run).
TEST(fwd_packed_keys_only) {
    REQUIRE_SM90();
    REQUIRE_VARLEN_KERNELS();
    const int q[4] = {77, 77, 77, 77}, k[4] = {300, 1, 0, 129};
    packed_case c = packed_base(BF16, 4, 2, 128, q, k);
    c.fixed_q = 1;
    c.causal = 1;
    run_packed_case("hdim128 causal", c);
    const int q1[4] = {1, 1, 1, 1}, k1[4] = {700, 1, 300, 1000};
    c = packed_base(FP16, 4, 16, 64, q1, k1);
    c.heads_kv = 2;
    c.fixed_q = 1;
    c.must_split = 1;
    run_packed_case("decode hdim64 gqa 8, auto splits", c);
    const int q2[2] = {100, 100}, k2[2] = {81, 400};
    c = packed_base(BF16, 2, 2, 256, q2, k2);
    c.fixed_q = 1;
    c.window_left = 60;
    c.window_right = 10;
    run_packed_case("hdim256 window (60, 10)", c);
}

// Calls the CUDA backend can't do: NOT_SUPPORTED with a message, output untouched.
static void expect_not_supported(const char *what, fa3c_fwd_params p, const char *needle) {
    size_t bytes = (size_t)p.problem.batch * p.problem.seqlen_q * p.problem.heads_q * p.problem.headdim * 2;
    void *dout = NULL;
    if (cudaMalloc(&dout, bytes) != cudaSuccess) { CHECK(0, "cudaMalloc"); return; }
    cudaMemset(dout, 0xAB, bytes);
    p.out.data = dout;
    fa3c_status st = fa3c_fwd(&p, NULL);
    printf("    %s -> %s: %s\n", what, fa3c_status_string(st), fa3c_last_error());
    CHECK(st == FA3C_STATUS_NOT_SUPPORTED, "%s: got %s", what, fa3c_status_string(st));
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what, fa3c_last_error(), needle);
    uint8_t *h = (uint8_t *)malloc(bytes);
    cudaMemcpy(h, dout, bytes, cudaMemcpyDeviceToHost);
    size_t touched = 0;
    for (size_t i = 0; i < bytes; i++) touched += h[i] != 0xAB;
    CHECK(touched == 0, "%s: %zu output bytes written", what, touched);
    free(h);
    cudaFree(dout);
}

TEST(fwd_not_supported_is_reported) {
    REQUIRE_SM90();
    const int B = 1, S = 64, H = 2, D = 128;
    void *buf = NULL;
    CUDA_OK(cudaMalloc(&buf, (size_t)B * S * 3 * H * D * 2 + 64));
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem.dtype = FA3C_DTYPE_BF16;
    p.problem.batch = B;
    p.problem.seqlen_q = p.problem.seqlen_k = S;
    p.problem.heads_q = p.problem.heads_kv = H;
    p.problem.headdim = D;
    p.q = tu_tensor(buf, B, S, H, D);
    p.k = tu_tensor(buf, B, S, H, D);
    p.v = tu_tensor(buf, B, S, H, D);
    p.out = tu_tensor(NULL, B, S, H, D);
    p.backend = FA3C_BACKEND_CUDA;

    fa3c_fwd_params x = p;   // (every head dim up to 256 runs now: fwd_padded_head_dims)
    x.k.stride[1] = H * D + 4;   // 8-byte row pitch remainder: TMA needs multiples of 16 bytes
    expect_not_supported("k row stride", x, "k:");
    x = p;
    x.problem.dtype = FA3C_DTYPE_FP32;
    expect_not_supported("fp32", x, "fp32");
    x = p;   // sinks on the fp8 kernel: not yet (a device array, past the tensors); with
             // FA3C_CUDA_SINKS 0, not on any kernel
    x.problem.dtype = FA3C_DTYPE_E4M3;
    x.problem.sinks = (const float *)((char *)buf + (size_t)B * S * 3 * H * D * 2);
    expect_not_supported("fp8 sinks", x, "sinks");
    if (!FA3C_CUDA_SINKS) {
        x.problem.dtype = FA3C_DTYPE_BF16;
        expect_not_supported("sinks (FA3C_CUDA_SINKS 0)", x, "FA3C_CUDA_SINKS");
    }
    x = p;   // a value head dim above 256 (absorbed MLA decode's 512): CPU backends only so far
    x.problem.headdim_v = 264;
    x.v = tu_tensor(buf, B, S, H, 264);
    x.out = tu_tensor(NULL, B, S, H, 264);
    expect_not_supported("headdim_v 264", x, "headdim_v");
    x = p;   // queries used per sequence: not on the fp8 kernel yet (a device array, past the tensors)
    x.problem.dtype = FA3C_DTYPE_E4M3;
    x.problem.seqused_q = (const int32_t *)((char *)buf + (size_t)B * S * 3 * H * D * 2);
    expect_not_supported("fp8 seqused_q", x, "seqused_q");
    x = p;   // FA3's qv (absorbed MLA decode): the CPU backends only so far
    x.qv = tu_tensor((char *)buf + (size_t)B * S * H * D * 2, B, S, H, D);
    expect_not_supported("qv", x, "qv");
    // Device arrays the host never reads: cu_seqlens {0, 64}, a page table of zeros.
    int32_t *arrays = NULL;
    int32_t host_arrays[16] = {0, S};   // the rest: page 0
    CUDA_OK(cudaMalloc((void **)&arrays, sizeof host_arrays));
    CUDA_OK(cudaMemcpy(arrays, host_arrays, sizeof host_arrays, cudaMemcpyHostToDevice));
    fa3c_fwd_params paged = p;   // pages of 8 keys
    paged.problem.page_table = arrays + 2;
    paged.problem.page_table_stride = 8;
    paged.problem.page_size = 8;
    paged.problem.num_pages = 1;
    fa3c_fwd_params paged96 = paged;   // hdim 96 (64-byte rows), pages of 5: 1-row boxes off 128-byte boundaries
    paged96.problem.headdim = 96;
    paged96.problem.page_table_stride = 13;
    paged96.problem.page_size = 5;
    x = p;
    x.problem.seqused_k = arrays + 1;   // {64}
    if (fa3c_cuda_fwd_block_n(&x.problem) == 0) {   // a build without the variable-length kernels
        expect_not_supported("seqused_k without FA3C_CUDA_VARLEN", x, "FA3C_CUDA_VARLEN");
        expect_not_supported("page table without FA3C_CUDA_VARLEN", paged, "FA3C_CUDA_VARLEN");
        x = p;
        x.problem.cu_seqlens_q = x.problem.cu_seqlens_k = arrays;
        expect_not_supported("cu_seqlens without FA3C_CUDA_VARLEN", x, "FA3C_CUDA_VARLEN");
    }
    fa3c_problem fixed96 = paged96.problem;
    fixed96.page_table = NULL;
    if (fa3c_cuda_fwd_block_n(&paged96.problem) != 0 && fa3c_cuda_fwd_block_n(&fixed96) != 0)   // both hdim-96 kernels
        expect_not_supported("hdim 96, page size 5", paged96, "even page_size");
    cudaFree(arrays);
    cudaFree(buf);
}

// The differential over random problems (issue 35): the cases above, drawn
// at random (seeded: FA3C_SEED replays), each through run_case's checks
// against the float64 reference. The head dims this build has, bf16 / fp16,
// GQA, causal, windows, softcap, outliers, split-KV, seqused_k, paged caches
// (any page size; even at hdim 96), sinks, padded output rows.
// FA3C_GPU_DIFF_CASES: problems (default 24).
TEST(fwd_random_problems) {
    REQUIRE_SM90();
    const long n = tu_env_long("FA3C_GPU_DIFF_CASES", 24);
    int dims[5], ndims = 0;
    const int all[5] = {64, 96, 128, 192, 256};
    for (int i = 0; i < 5; i++) {
        fa3c_problem pr;
        memset(&pr, 0, sizeof pr);
        pr.dtype = FA3C_DTYPE_BF16, pr.headdim = all[i], pr.seqlen_q = pr.seqlen_k = 1;
        if (fa3c_cuda_fwd_block_n(&pr) > 0) dims[ndims++] = all[i];
    }
    if (ndims == 0) SKIP("this build has no bf16 forward instance");
    int32_t used1 = 1;
    fa3c_problem vl;
    memset(&vl, 0, sizeof vl);
    vl.dtype = FA3C_DTYPE_BF16, vl.headdim = 128, vl.seqused_k = &used1;
    const int varlen = fa3c_cuda_fwd_block_n(&vl) > 0;
    const int page_sizes[6] = {1, 2, 16, 48, 64, 256};
    for (long i = 0; i < n; i++) {
        int d = dims[tu_rand_int(0, ndims - 1)];
        if (tu_rand_int(0, 5) == 0) {   // 1 in 6: any head dim (padded), where this build has a kernel for it
            fa3c_problem pd;
            memset(&pd, 0, sizeof pd);
            pd.dtype = FA3C_DTYPE_BF16, pd.headdim = 8 * tu_rand_int(1, 32), pd.seqlen_q = pd.seqlen_k = 1;
            if (fa3c_cuda_fwd_block_n(&pd) > 0) d = pd.headdim;
        }
        const int hkv = tu_rand_int(1, 2);
        fwd_case c = base_case(tu_rand_int(0, 1) ? BF16 : FP16, tu_rand_int(1, 2),
                               tu_rand_int(0, 4) ? tu_rand_int(1, 200) : 1, tu_rand_int(1, 300), hkv, d);   // 1 in 5 decodes
        c.heads_q = hkv * (1 << tu_rand_int(0, 2));
        if (tu_rand_int(0, 9) < 3) c.causal = 1;
        if (tu_rand_int(0, 9) < 2) c.window_left = tu_rand_int(0, 200), c.window_right = tu_rand_int(0, 1) ? 0 : tu_rand_int(0, 64);
        if (tu_rand_int(0, 9) < 2) c.softcap = (float)tu_rand_int(5, 30);
        if (tu_rand_int(0, 9) < 1) c.outlier = 10.f;
        if (tu_rand_int(0, 9) < 1) c.out_pad = 2;
        c.num_splits = tu_rand_int(0, 2) == 0 ? 0 : tu_rand_int(1, 4);
        if (FA3C_CUDA_SINKS && tu_rand_int(0, 9) < 2) c.sinks = 1;
        if (varlen && tu_rand_int(0, 9) < 3) {
            c.seqused = 1;
            for (int b = 0; b < c.batch; b++) c.used[b] = tu_rand_int(0, c.seqlen_k);
        }
        if (varlen && tu_rand_int(0, 9) < 2) {
            int ps = page_sizes[tu_rand_int(0, 5)];
            if (d > 64 && d <= 96 && ps % 2) ps = 2;   // on hdim 96's kernel: 64-byte rows
            c.page_size = ps;
        }
        char label[32];
        snprintf(label, sizeof label, "random %ld", i);
        run_case(label, c);
    }
}

TEST_MAIN()
