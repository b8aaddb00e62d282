// fa3c_append_kv on the GPU against a host reference (the CPU backend's
// definition, tests/test_append.c): contiguous and paged caches (pages
// of 3 rows: appends across page boundaries), 16-byte rows (the vector path)
// and rows of 24 bytes (element by element), headdim_v of its own. Then device
// metadata that breaks the contract: a length past the cache and a page entry
// past the pages must write nothing for those tokens, and
// fa3c_append_kv_check_device must name them. And the optional parts (rotary
// embedding of the new keys and of q, packed new tokens) against the CPU
// backend, whose rotation tests/test_append_rotary.c checks in float64, and
// their device metadata broken for one sequence (rotary_seqlens, cu_seqlens_new).
#include "gpu_util.cuh"
#include "backend.h"

enum { B = 3, NEW = 5, H = 2, PS = 3, PAGES = 30, ROWS = 24 };

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

// One case: head dims d (k) and dv (v) of bf16; paged or contiguous; lens and
// table as given (the host copies for the CPU run, device copies for the GPU).
static void run_case(const char *what, int d, int dv, int paged, const int32_t lens[B], const int32_t *table) {
    const size_t k_row = (size_t)H * d, v_row = (size_t)H * dv, rows = paged ? (size_t)PAGES * PS : (size_t)B * ROWS;
    uint16_t *kn = (uint16_t *)tu_alloc((size_t)B * NEW * k_row * 2), *vn = (uint16_t *)tu_alloc((size_t)B * NEW * v_row * 2);
    uint16_t *kc = (uint16_t *)tu_alloc(rows * k_row * 2), *vc = (uint16_t *)tu_alloc(rows * v_row * 2);
    for (size_t i = 0; i < B * NEW * k_row; i++) kn[i] = (uint16_t)tu_rand_int(0, 0xFFFF);
    for (size_t i = 0; i < B * NEW * v_row; i++) vn[i] = (uint16_t)tu_rand_int(0, 0xFFFF);
    for (size_t i = 0; i < rows * k_row; i++) kc[i] = (uint16_t)tu_rand_int(0, 0xFFFF);
    for (size_t i = 0; i < rows * v_row; i++) vc[i] = (uint16_t)tu_rand_int(0, 0xFFFF);
    void *dkn = to_device(kn, B * NEW * k_row * 2), *dvn = to_device(vn, B * NEW * v_row * 2);
    void *dkc = to_device(kc, rows * k_row * 2), *dvc = to_device(vc, rows * v_row * 2);
    int32_t *dlens = (int32_t *)to_device(lens, B * 4), *dtable = paged ? (int32_t *)to_device(table, B * 8 * 4) : NULL;

    fa3c_append_params p;
    fa3c_append_params_init(&p);
    p.batch = B, p.seqlen_new = NEW, p.heads_kv = H, p.headdim = d, p.headdim_v = dv;
    p.k_new = (fa3c_tensor){kn, {(int64_t)(NEW * k_row), (int64_t)k_row, d, 1}};
    p.v_new = (fa3c_tensor){vn, {(int64_t)(NEW * v_row), (int64_t)v_row, dv, 1}};
    const int64_t outer_rows = paged ? PS : ROWS;
    p.k_cache = (fa3c_tensor){kc, {(int64_t)(outer_rows * k_row), (int64_t)k_row, d, 1}};
    p.v_cache = (fa3c_tensor){vc, {(int64_t)(outer_rows * v_row), (int64_t)v_row, dv, 1}};
    p.seqlen_cache = ROWS;
    p.cache_seqlens = lens;
    if (paged) p.page_table = table, p.page_table_stride = 8, p.page_size = PS, p.num_pages = PAGES;

    // The reference, on the host copies: every token in range copied (as the
    // CPU backend does, tests/test_append.c), a token past the cache or with
    // a page entry outside [0, PAGES) skipped, as the kernel must.
    int broken = 0;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NEW; j++) {
            const int64_t pos = (int64_t)lens[b] + j;
            int64_t outer = b, row = pos;
            int ok = lens[b] >= 0 && pos < (paged ? 8 * PS : ROWS);
            if (ok && paged) {
                outer = table[b * 8 + pos / PS];
                row = pos % PS;
                ok = outer >= 0 && outer < PAGES;
            }
            broken += !ok;
            if (!ok) continue;
            for (int h = 0; h < H; h++) {
                memcpy(kc + (outer * outer_rows + row) * k_row + h * d, kn + ((size_t)b * NEW + j) * k_row + h * d, d * 2);
                memcpy(vc + (outer * outer_rows + row) * v_row + h * dv, vn + ((size_t)b * NEW + j) * v_row + h * dv, dv * 2);
            }
        }

    fa3c_append_params g = p;
    g.k_new.data = dkn, g.v_new.data = dvn, g.k_cache.data = dkc, g.v_cache.data = dvc;
    g.cache_seqlens = dlens, g.page_table = dtable;
    g.backend = FA3C_BACKEND_CUDA;
    fa3c_status dc = fa3c_append_kv_check_device(&g, NULL);
    printf("  [%s] check_device: %s %s\n", what, fa3c_status_string(dc), fa3c_last_error());
    CHECK((dc == FA3C_STATUS_OK) == (broken == 0) && (broken == 0 || dc == FA3C_STATUS_INVALID_ARGUMENT),
          "%s: check_device said %s with %d tokens out of range", what, fa3c_status_string(dc), broken);
    fa3c_status s = fa3c_append_kv(&g, NULL);
    CHECK(s == FA3C_STATUS_OK, "%s: %s", what, fa3c_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *gk = (uint16_t *)tu_alloc(rows * k_row * 2), *gv = (uint16_t *)tu_alloc(rows * v_row * 2);
    CUDA_OK(cudaMemcpy(gk, dkc, rows * k_row * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gv, dvc, rows * v_row * 2, cudaMemcpyDeviceToHost));
    CHECK(memcmp(gk, kc, rows * k_row * 2) == 0 && memcmp(gv, vc, rows * v_row * 2) == 0,
          "%s: the caches differ from the reference's (%d tokens skipped)", what, broken);
    cudaFree(dkn), cudaFree(dvn), cudaFree(dkc), cudaFree(dvc), cudaFree(dlens), cudaFree(dtable);
    free(kn), free(vn), free(kc), free(vc), free(gk), free(gv);
}

// 8 pages per sequence, shuffled over the PAGES (7 and PAGES are coprime: all distinct).
static void shuffled_table(int32_t table[B * 8]) {
    for (int i = 0; i < B * 8; i++) table[i] = (i * 7 + 3) % PAGES;
}

TEST(append_matches_the_cpu) {
    REQUIRE_SM90();
    int32_t table[B * 8];
    shuffled_table(table);
    const int32_t lens[B] = {0, 7, 19};
    run_case("contiguous, 16-byte rows", 64, 128, 0, lens, table);
    run_case("paged, 16-byte rows", 64, 128, 1, lens, table);
    run_case("contiguous, 24-byte rows", 12, 12, 0, lens, table);
    run_case("paged, rows of 24 and 8 bytes", 12, 4, 1, lens, table);
}

TEST(append_hostile_metadata) {
    REQUIRE_SM90();
    int32_t table[B * 8];
    shuffled_table(table);
    const int32_t past[B] = {0, 7, 5000};
    run_case("a length past the cache", 64, 64, 0, past, table);
    run_case("a length past the pages", 64, 64, 1, past, table);
    const int32_t lens[B] = {0, 7, 19};
    table[2 * 8 + 7] = 999;   // sequence 2's last new rows
    run_case("a page entry past the pages", 64, 64, 1, lens, table);
    table[2 * 8 + 7] = -5;
    run_case("a negative page entry", 64, 64, 1, lens, table);
}

// ---- the optional parts: the same call on both backends -----------------------

enum { RB = 3, RNEW = 4, RH = 2, RHQ = 4, RSQ = 3, RROWS = 24, RTROWS = 40 };

struct Buf { void *host, *dev; size_t bytes; };

static Buf make_buf(size_t bytes, fa3c_dtype dt, int fill_normal) {
    Buf b = {tu_alloc(bytes), NULL, bytes};
    if (fill_normal) tu_fill_normal(b.host, dt, (int64_t)(bytes / tu_dtype_size(dt)), 1.f);
    else tu_poison(b.host, bytes);
    b.dev = to_device(b.host, bytes);
    return b;
}

// Outputs of the two backends: bit for bit where copied or left unwritten,
// within one unit of the dtype's last place where rotated (the GPU may fuse a
// multiply-add).
static int close_enough(const void *cpu, const void *gpu, size_t bytes, fa3c_dtype dt, int *worst_index) {
    const size_t es = tu_dtype_size(dt);
    const double ulp = dt == FA3C_DTYPE_FP32 ? 0x1p-22 : dt == FA3C_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
    for (size_t i = 0; i < bytes / es; i++) {
        // Bit-identical elements match, NaN included (the poison a hostile case leaves unwritten).
        if (!memcmp((const char *)cpu + i * es, (const char *)gpu + i * es, es)) continue;
        const double a = tu_load(cpu, dt, (int64_t)i), b = tu_load(gpu, dt, (int64_t)i);
        // fp32: a fused multiply-add changes a rotated value by up to an ulp of its terms
        // (|x|·|cos| + |y|·|sin| < 8 here), which is more than one of a small result's.
        const double terms = dt == FA3C_DTYPE_FP32 ? 8 * 0x1p-23 : 0;
        if (!(a == b || fabs(a - b) <= ulp * fabs(a) + terms)) {
            *worst_index = (int)i;
            return 0;
        }
    }
    return 1;
}

// hostile: device metadata that breaks the contract for sequence 2 only (1: its
// rotary_seqlens past the tables, 2: negative, 3: its cu_seqlens_new end past the
// new tokens): the GPU must write nothing for that sequence (the CPU reference
// then runs the first two sequences) and fa3c_append_kv_check_device name it.
enum { HOSTILE_NONE, HOSTILE_ROT_PAST, HOSTILE_ROT_NEG, HOSTILE_CU_PAST };

static void rotary_case(const char *what, fa3c_dtype dt, int d, int rotary_dim, int interleaved, int by_row,
                        int packed, int paged, int in_place, int hostile = HOSTILE_NONE) {
    const size_t es = tu_dtype_size(dt), row = (size_t)RH * d * es;
    Buf kn = make_buf(RB * RNEW * row, dt, 1), vn = make_buf(RB * RNEW * row, dt, 1);
    Buf kc = make_buf(RB * RROWS * row, dt, 1), vc = make_buf(RB * RROWS * row, dt, 1);
    Buf q = make_buf((size_t)RB * RSQ * RHQ * d * es, dt, 1), qo = make_buf(q.bytes, dt, 0);
    const int half = rotary_dim / 2;
    Buf cs = make_buf((size_t)RTROWS * half * es, dt, 0), sn = make_buf(cs.bytes, dt, 0);
    for (int t = 0; t < RTROWS; t++)
        for (int i = 0; i < half; i++) {
            const double a = t * pow(10000.0, -(double)i / half);
            tu_store(cs.host, dt, (int64_t)t * half + i, (float)cos(a));
            tu_store(sn.host, dt, (int64_t)t * half + i, (float)sin(a));
        }
    CUDA_OK(cudaMemcpy(cs.dev, cs.host, cs.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sn.dev, sn.host, sn.bytes, cudaMemcpyHostToDevice));
    int32_t lens[RB] = {0, 9, 20}, cu[RB + 1] = {0, 3, 3, 7}, table[RB * 6], rot[RB] = {4, 0, 30};
    if (hostile == HOSTILE_ROT_PAST) rot[2] = 1000;
    if (hostile == HOSTILE_ROT_NEG) rot[2] = -3;
    if (hostile == HOSTILE_CU_PAST) cu[3] = 1000;
    for (int i = 0; i < RB * 6; i++) table[i] = RB * 6 - 1 - i;
    int32_t *dlens = (int32_t *)to_device(lens, sizeof lens), *dcu = (int32_t *)to_device(cu, sizeof cu);
    int32_t *dtable = (int32_t *)to_device(table, sizeof table), *drot = (int32_t *)to_device(rot, sizeof rot);

    fa3c_append_params p;
    fa3c_append_params_init(&p);
    p.dtype = dt, p.batch = RB, p.seqlen_new = RNEW, p.heads_kv = RH, p.headdim = d;
    p.k_new = tu_tensor(kn.host, packed ? 1 : RB, packed ? RB * RNEW : RNEW, RH, d);
    p.v_new = tu_tensor(vn.host, packed ? 1 : RB, packed ? RB * RNEW : RNEW, RH, d);
    p.k_cache = paged ? tu_tensor(kc.host, RB * 6, 4, RH, d) : tu_tensor(kc.host, RB, RROWS, RH, d);
    p.v_cache = paged ? tu_tensor(vc.host, RB * 6, 4, RH, d) : tu_tensor(vc.host, RB, RROWS, RH, d);
    p.seqlen_cache = RROWS;
    p.cache_seqlens = lens;
    if (packed) p.cu_seqlens_new = cu;
    if (paged) p.page_table = table, p.page_table_stride = 6, p.page_size = 4, p.num_pages = RB * 6;
    if (rotary_dim) {
        p.rotary_dim = rotary_dim, p.rotary_rows = RTROWS, p.rotary_interleaved = interleaved;
        p.rotary_cos = cs.host, p.rotary_sin = sn.host;
        p.q = tu_tensor(q.host, RB, RSQ, RHQ, d);
        p.q_out = in_place ? p.q : tu_tensor(qo.host, RB, RSQ, RHQ, d);
        p.seqlen_q = RSQ, p.heads_q = RHQ, p.rotary_q_by_row = by_row;
        if (hostile == HOSTILE_ROT_PAST || hostile == HOSTILE_ROT_NEG) p.rotary_seqlens = rot;
    }
    fa3c_append_params g = p;
    g.k_new.data = kn.dev, g.v_new.data = vn.dev, g.k_cache.data = kc.dev, g.v_cache.data = vc.dev;
    g.cache_seqlens = dlens, g.cu_seqlens_new = packed ? dcu : NULL, g.page_table = paged ? dtable : NULL;
    if (rotary_dim) {
        g.rotary_cos = cs.dev, g.rotary_sin = sn.dev, g.q.data = q.dev, g.q_out.data = in_place ? q.dev : qo.dev;
        if (p.rotary_seqlens) g.rotary_seqlens = drot;
    }
    g.backend = FA3C_BACKEND_CUDA;
    p.backend = FA3C_BACKEND_CPU;
    if (hostile) p.batch = 2;   // the reference: sequence 2 gets nothing
    const fa3c_status dc = fa3c_append_kv_check_device(&g, NULL);
    if (hostile) {
        printf("  [%s] check_device: %s %s\n", what, fa3c_status_string(dc), fa3c_last_error());
        CHECK(dc == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), hostile == HOSTILE_CU_PAST ? "cu_seqlens_new"
                                                                                         : "rotary_seqlens[2]"),
              "%s: check_device said %s: %s", what, fa3c_status_string(dc), fa3c_last_error());
    } else {
        CHECK(dc == FA3C_STATUS_OK, "%s: check_device: %s", what, fa3c_last_error());
    }
    CHECK(fa3c_append_kv(&g, NULL) == FA3C_STATUS_OK, "%s: GPU: %s", what, fa3c_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(fa3c_append_kv(&p, NULL) == FA3C_STATUS_OK, "%s: CPU: %s", what, fa3c_last_error());
    Buf *outs[3] = {&kc, &vc, in_place ? &q : &qo};
    const char *names[3] = {"k_cache", "v_cache", "q_out"};
    for (int o = 0; o < (rotary_dim ? 3 : 2); o++) {
        void *back = tu_alloc(outs[o]->bytes);
        CUDA_OK(cudaMemcpy(back, outs[o]->dev, outs[o]->bytes, cudaMemcpyDeviceToHost));
        int where = -1;
        CHECK(close_enough(outs[o]->host, back, outs[o]->bytes, dt, &where), "%s: %s differs from the CPU's at element %d",
              what, names[o], where);
        free(back);
    }
    Buf *all[8] = {&kn, &vn, &kc, &vc, &q, &qo, &cs, &sn};
    for (int i = 0; i < 8; i++) cudaFree(all[i]->dev), free(all[i]->host);
    cudaFree(dlens), cudaFree(dcu), cudaFree(dtable), cudaFree(drot);
}

TEST(append_rotary_and_packed_match_the_cpu) {
    REQUIRE_SM90();
    rotary_case("bf16 rotary 64 of 64, interleaved, q by row", FA3C_DTYPE_BF16, 64, 64, 1, 1, 0, 0, 0);
    rotary_case("bf16 rotary 32 of 128, NeoX, paged, q in place", FA3C_DTYPE_BF16, 128, 32, 0, 0, 0, 1, 1);
    rotary_case("fp16 rotary 6 of 24, interleaved, packed", FA3C_DTYPE_FP16, 24, 6, 1, 1, 1, 0, 0);
    rotary_case("fp32 rotary 16 of 16, NeoX, packed and paged", FA3C_DTYPE_FP32, 16, 16, 0, 1, 1, 1, 0);
    rotary_case("bf16 packed, no rotary (vector path)", FA3C_DTYPE_BF16, 64, 0, 0, 0, 1, 0, 0);
}

TEST(append_rotary_hostile_metadata) {
    REQUIRE_SM90();
    rotary_case("rotary_seqlens past the tables", FA3C_DTYPE_BF16, 64, 64, 1, 1, 0, 0, 0, HOSTILE_ROT_PAST);
    rotary_case("negative rotary_seqlens, paged", FA3C_DTYPE_BF16, 64, 32, 0, 1, 0, 1, 0, HOSTILE_ROT_NEG);
    rotary_case("cu_seqlens_new past the new tokens", FA3C_DTYPE_FP16, 24, 0, 0, 0, 1, 0, 0, HOSTILE_CU_PAST);
}

TEST_MAIN()
