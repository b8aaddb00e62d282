// fa3c_quantize_fp8's kernels against the CPU backend (tests/test_quantize.c
// checks that one in float64): bf16, fp16 and fp32 inputs, groups of heads,
// padded rows, the rotation at head dims 16 to 256 (16: lanes past the row in
// the shuffles) and none at 24 and 512, a NaN block and an all-zero block,
// descales per block of 128 rows (block_rows);
// e4m3 bytes and descales equal bit for bit (NaN bytes as NaN), the row
// padding untouched. Runs where the CUDA path is on (-DFA3C_CUDA_QUANTIZE=1).
#include "gpu_util.cuh"
#include "backend.h"

static void run_case(const char *what, fa3c_dtype dt, int b, int s, int h, int d, int group, int hadamard, int pad,
                     int poison, int block_rows) {
    const size_t row_blocks = block_rows ? (size_t)(s + block_rows - 1) / block_rows : 1;
    const size_t es = tu_dtype_size(dt), row = (size_t)h * d + pad, n = (size_t)b * s * row;
    const size_t nd = (size_t)b * (h / group) * row_blocks;
    void *x = tu_alloc(n * es);
    tu_fill_normal(x, dt, (int64_t)n, 2.f);
    if (poison) {   // block (0, 0): one NaN; the last block: all zeros
        tu_store(x, dt, 5, NAN);
        for (int si = 0; si < s; si++)
            for (int hh = h - group; hh < h; hh++)
                for (int j = 0; j < d; j++) tu_store(x, dt, ((int64_t)(b - 1) * s + si) * row + hh * d + j, 0.f);
    }
    float signs[256];
    for (int j = 0; j < d && j < 256; j++) signs[j] = tu_rand_int(0, 1) ? 1.f : -1.f;
    uint8_t *out = (uint8_t *)tu_alloc(n), *gout = (uint8_t *)tu_alloc(n);
    float *ds = (float *)tu_alloc(nd * 4), *gds = (float *)tu_alloc(nd * 4);
    memset(out, 0xee, n);
    void *dx, *dout, *dds, *dsigns;
    CUDA_OK(cudaMalloc(&dx, n * es));
    CUDA_OK(cudaMalloc(&dout, n));
    CUDA_OK(cudaMalloc(&dds, nd * 4));
    CUDA_OK(cudaMalloc(&dsigns, sizeof signs));
    CUDA_OK(cudaMemcpy(dx, x, n * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dout, out, n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dsigns, signs, sizeof signs, cudaMemcpyHostToDevice));

    fa3c_quantize_params p;
    fa3c_quantize_params_init(&p);
    p.dtype = dt, p.batch = b, p.seqlen = s, p.heads = h, p.headdim = d, p.group = group, p.hadamard = hadamard;
    p.x = (fa3c_tensor){x, {(int64_t)s * (int64_t)row, (int64_t)row, d, 1}};
    p.out = (fa3c_tensor){out, {(int64_t)s * (int64_t)row, (int64_t)row, d, 1}};
    p.descale = ds, p.signs = hadamard ? signs : NULL, p.backend = FA3C_BACKEND_CPU, p.block_rows = block_rows;
    CHECK(fa3c_quantize_fp8(&p, NULL) == FA3C_STATUS_OK, "%s: CPU: %s", what, fa3c_last_error());
    fa3c_quantize_params g = p;
    g.x.data = dx, g.out.data = dout, g.descale = (float *)dds, g.signs = hadamard ? (const float *)dsigns : NULL;
    g.backend = FA3C_BACKEND_CUDA;
    CHECK(fa3c_quantize_fp8(&g, NULL) == FA3C_STATUS_OK, "%s: GPU: %s", what, fa3c_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(gout, dout, n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gds, dds, nd * 4, cudaMemcpyDeviceToHost));
    int bad_ds = 0;
    for (size_t i = 0; i < nd; i++) bad_ds += !(gds[i] == ds[i] || (isnan(gds[i]) && isnan(ds[i])));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const int same = gout[i] == out[i] || (isnan(fa3c_e4m3_to_float(gout[i])) && isnan(fa3c_e4m3_to_float(out[i])));
        if (!same && !bad++) first = i;
    }
    CHECK(bad_ds == 0 && bad == 0, "%s: %d descales and %zu bytes differ from the CPU's (first byte %zu: 0x%02x vs 0x%02x)",
          what, bad_ds, bad, first, gout[first], out[first]);
    printf("  [%s] descale[0] %g: %s\n", what, (double)gds[0], bad_ds == 0 && bad == 0 ? "bit for bit" : "DIFFERS");
    cudaFree(dx), cudaFree(dout), cudaFree(dds), cudaFree(dsigns);
    free(x), free(out), free(gout), free(ds), free(gds);
}

TEST(quantize_matches_the_cpu) {
    REQUIRE_SM90();
    if (!FA3C_CUDA_QUANTIZE) SKIP("the CUDA quantization kernels are off in this build (-DFA3C_CUDA_QUANTIZE=1 turns them on)");
    run_case("bf16 hdim 128, rotated, groups of 4, NaN and zero blocks", FA3C_DTYPE_BF16, 2, 300, 8, 128, 4, 1, 0, 1, 0);
    run_case("fp16 hdim 256, rotated, padded rows", FA3C_DTYPE_FP16, 1, 65, 2, 256, 1, 1, 16, 0, 0);
    run_case("fp32 hdim 64, rotated", FA3C_DTYPE_FP32, 3, 17, 3, 64, 3, 1, 0, 0, 0);
    run_case("bf16 hdim 16, rotated (half a warp)", FA3C_DTYPE_BF16, 1, 100, 2, 16, 1, 1, 8, 0, 0);
    run_case("bf16 hdim 128, rotated, rows padded by 2 (no vector loads)", FA3C_DTYPE_BF16, 2, 33, 4, 128, 2, 1, 2, 0, 0);
    run_case("bf16 hdim 256, rotated (16-byte vectors)", FA3C_DTYPE_BF16, 1, 90, 4, 256, 4, 1, 0, 1, 0);
    run_case("bf16 hdim 24, not rotated", FA3C_DTYPE_BF16, 2, 40, 4, 24, 2, 0, 0, 1, 0);
    run_case("fp32 hdim 512, not rotated", FA3C_DTYPE_FP32, 1, 70, 2, 512, 1, 0, 0, 0, 0);
}

// A descale per block of 128 rows: chunks of 64 rows that cross a block's
// end and a head's (groups), ragged last blocks, NaN and zero blocks.
TEST(quantize_block_rows_matches_the_cpu) {
    REQUIRE_SM90();
    if (!FA3C_CUDA_QUANTIZE) SKIP("the CUDA quantization kernels are off in this build (-DFA3C_CUDA_QUANTIZE=1 turns them on)");
    run_case("bf16 hdim 128, rotated, blocks of 128 rows", FA3C_DTYPE_BF16, 2, 300, 4, 128, 1, 1, 0, 1, FA3C_FP8_BLOCK_ROWS);
    run_case("bf16 hdim 128, groups of 4, blocks of 128 rows", FA3C_DTYPE_BF16, 2, 290, 8, 128, 4, 0, 0, 1, FA3C_FP8_BLOCK_ROWS);
    run_case("fp16 hdim 256, rotated, 100 rows (one short block)", FA3C_DTYPE_FP16, 1, 100, 2, 256, 1, 1, 16, 0, FA3C_FP8_BLOCK_ROWS);
    run_case("fp32 hdim 64, groups of 3, 257 rows", FA3C_DTYPE_FP32, 2, 257, 3, 64, 3, 1, 0, 0, FA3C_FP8_BLOCK_ROWS);
}

TEST_MAIN()
