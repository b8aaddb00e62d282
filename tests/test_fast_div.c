/* src/cuda/forward/fast_div.h: the multiply-shift division of the tile scheduler,
 * against C's division, for small and large divisors and dividends up to
 * 2^31 - 1 (the same code runs on the GPU). */
#include "harness.h"
#include "testutil.h"
#include "cuda/forward/fast_div.h"

static int check_one(int32_t n, int32_t d) {
    fa3c_fast_div f = fa3c_fast_div_make(d);
    int32_t q = fa3c_div(n, f), r = fa3c_mod(n, f);
    CHECK(q == n / d && r == n % d, "%d / %d: got %d rem %d, want %d rem %d", n, d, q, r, n / d, n % d);
    return q == n / d && r == n % d;
}

TEST(fast_div_small_divisors_all_small_dividends) {
    for (int32_t d = 1; d <= 300; d++)
        for (int32_t n = 0; n < 5000; n++)
            if (!check_one(n, d)) return;
}

TEST(fast_div_edges_and_random) {
    const int32_t big = 0x7fffffff;
    const int32_t ds[] = {1, 2, 3, 6, 7, 127, 128, 129, 1000, 65535, 65536, 65537, 1 << 30, (1 << 30) + 1, big - 1, big};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        int32_t d = ds[i];
        const int32_t ns[] = {0, 1, d - 1, d, big - 1, big, big - big % d, big - big % d - 1};
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            if (ns[j] >= 0 && !check_one(ns[j], d)) return;
    }
    for (int i = 0; i < 2000000; i++) {
        int32_t d = (int32_t)(tu_rand_u64() % (i % 2 ? 5000u : 0x7fffffffu)) + 1;
        int32_t n = (int32_t)(tu_rand_u64() & 0x7fffffff);
        if (!check_one(n, d)) return;
    }
}

// Rows above row 0 (fwd_params.h, m_shift) are negative; they occur only
// without GQA packing, where the divisor is 1 and the quotient must be n.
TEST(fast_div_by_one_keeps_negative_dividends) {
    fa3c_fast_div f = fa3c_fast_div_make(1);
    for (int32_t n = -300; n < 0; n++) CHECK(fa3c_div(n, f) == n, "%d / 1: got %d", n, fa3c_div(n, f));
}

TEST_MAIN()
