// fa3c_append_kv on the GPU against a host reference (the CPU backend's
// definition, tests/test_append.c): contiguous and paged caches (pages
// of 3 rows: appends across page boundaries), 16-byte rows (the vector path)
// and rows of 24 bytes (element by element), headdim_v of its own. Then device
// metadata that breaks the contract: a length past the cache and a page entry
// past the pages must write nothing for those tokens, and
// fa3c_append_kv_check_device must name them.
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

TEST_MAIN()
