/* Number formats: OCP e4m3fn encode/decode (every code, ties, saturation, NaN,
 * signed zero, subnormals, brute-force nearest), and the CPU backend's
 * internal fp16/bf16 conversions against the independent ones in testutil.h. */
#include <math.h>
#include "harness.h"
#include "testutil.h"
#include "cpu/convert.h"

/* value of a code from its bit fields, computed independently in double */
static double e4m3_expected(int code, int *is_nan) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    *is_nan = e == 15 && m == 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

TEST(e4m3_decode_all_codes) {
    int nan_count = 0;
    for (int c = 0; c < 256; c++) {
        int is_nan;
        const double want = e4m3_expected(c, &is_nan);
        const float got = fa3c_e4m3_to_float((uint8_t)c);
        if (is_nan) {
            nan_count++;
            CHECK(isnan(got), "code 0x%02x should be NaN, got %g", c, got);
            continue;
        }
        CHECK((double)got == want && (signbit(got) != 0) == ((c & 0x80) != 0), "code 0x%02x: got %.9g want %.9g", c, got, want);
    }
    CHECK(nan_count == 2, "e4m3fn has exactly two NaN codes (got %d)", nan_count);
    CHECK(fa3c_e4m3_to_float(0x7e) == 448.0f && fa3c_e4m3_to_float(0xfe) == -448.0f, "max finite");
    CHECK(fa3c_e4m3_to_float(0x01) == ldexpf(1.0f, -9), "min subnormal");
    CHECK(fa3c_e4m3_to_float(0x08) == ldexpf(1.0f, -6), "min normal");
}

TEST(e4m3_encode_roundtrip) {
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        const uint8_t back = fa3c_float_to_e4m3(fa3c_e4m3_to_float((uint8_t)c));
        CHECK(back == c, "code 0x%02x -> %g -> 0x%02x", c, fa3c_e4m3_to_float((uint8_t)c), back);
    }
}

TEST(e4m3_midpoints_tie_to_even) {
    for (int c = 0; c < 0x7e; c++) {
        for (int sgn = 0; sgn < 2; sgn++) {
            const int lo = c | (sgn << 7), hi = (c + 1) | (sgn << 7);
            const float a = fa3c_e4m3_to_float((uint8_t)lo), b = fa3c_e4m3_to_float((uint8_t)hi);
            const float mid = (a + b) / 2; /* exact: 4 significant bits in float */
            const int even = (c & 1) ? hi : lo;
            CHECK(fa3c_float_to_e4m3(mid) == even, "midpoint %.9g of 0x%02x/0x%02x -> 0x%02x, want 0x%02x", mid, lo, hi,
                  fa3c_float_to_e4m3(mid), even);
            /* just off the midpoint goes to the nearer one */
            CHECK(fa3c_float_to_e4m3(nextafterf(mid, a)) == lo, "below midpoint of 0x%02x", lo);
            CHECK(fa3c_float_to_e4m3(nextafterf(mid, b)) == hi, "above midpoint of 0x%02x", lo);
        }
    }
}

TEST(e4m3_saturation) {
    const float big[7] = {448.0f, 448.5f, 449.0f, 464.0f, 480.0f, 1e9f, INFINITY};
    for (int i = 0; i < 7; i++) {
        CHECK(fa3c_float_to_e4m3(big[i]) == 0x7e, "%g -> 0x%02x, want 0x7e (448)", big[i], fa3c_float_to_e4m3(big[i]));
        CHECK(fa3c_float_to_e4m3(-big[i]) == 0xfe, "%g -> 0x%02x, want 0xfe (-448)", -big[i], fa3c_float_to_e4m3(-big[i]));
    }
    CHECK(fa3c_float_to_e4m3(3.4028234663852886e38f) == 0x7e, "FLT_MAX");
}

TEST(e4m3_nan_and_signed_zero) {
    CHECK(fa3c_float_to_e4m3(NAN) == 0x7f, "NaN -> 0x%02x", fa3c_float_to_e4m3(NAN));
    CHECK(fa3c_float_to_e4m3(-NAN) == 0x7f, "-NaN -> 0x%02x (canonical 0x7f)", fa3c_float_to_e4m3(-NAN));
    CHECK(isnan(fa3c_e4m3_to_float(0x7f)) && isnan(fa3c_e4m3_to_float(0xff)), "NaN codes decode to NaN");
    CHECK(fa3c_float_to_e4m3(0.0f) == 0x00, "+0");
    CHECK(fa3c_float_to_e4m3(-0.0f) == 0x80, "-0 -> 0x%02x", fa3c_float_to_e4m3(-0.0f));
    const float nz = fa3c_e4m3_to_float(0x80);
    CHECK(nz == 0.0f && signbit(nz), "0x80 decodes to -0");
    CHECK(fa3c_float_to_e4m3(-1e-30f) == 0x80, "tiny negative rounds to -0");
}

TEST(e4m3_subnormals) {
    const float u = ldexpf(1.0f, -9); /* smallest subnormal */
    struct { float x; int code; } t[9] = {
        {u, 0x01}, {0.5f * u, 0x00}, {0.5001f * u, 0x01}, {1.5f * u, 0x02}, {2.5f * u, 0x02},
        {3.5f * u, 0x04}, {7.0f * u, 0x07}, {7.5f * u, 0x08}, {-6.0f * u, 0x86}};
    for (int i = 0; i < 9; i++)
        CHECK(fa3c_float_to_e4m3(t[i].x) == t[i].code, "%g (= %g x 2^-9) -> 0x%02x, want 0x%02x", t[i].x, t[i].x / u,
              fa3c_float_to_e4m3(t[i].x), t[i].code);
}

TEST(e4m3_random_vs_brute_force) {
    /* nearest finite code by exhaustive search, ties to the even code, saturating */
    for (int it = 0; it < 20000; it++) {
        const float x = (float)(tu_normal() * ldexp(1.0, tu_rand_int(-12, 9)));
        int best = -1;
        double bd = INFINITY;
        for (int c = 0; c < 256; c++) {
            if ((c & 0x7f) == 0x7f) continue;
            const double dd = fabs((double)fa3c_e4m3_to_float((uint8_t)c) - x);
            if (dd < bd || (dd == bd && (c & 1) == 0)) { /* ties: the even code */
                bd = dd;
                best = c;
            }
        }
        if (fabs(x) >= 448) best = signbit(x) ? 0xfe : 0x7e;
        const uint8_t got = fa3c_float_to_e4m3(x);
        if (got != best && fa3c_e4m3_to_float(got) == fa3c_e4m3_to_float((uint8_t)best)) continue; /* +-0 */
        CHECK(got == best, "%.9g -> 0x%02x, nearest is 0x%02x", x, got, best);
        if (got != best) break;
    }
}

TEST(fp16_bf16_internal_conversions) {
    /* every half value round-trips; random floats round like testutil's independent code */
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fa3c_half_to_float((uint16_t)h), g = tu_half_to_float((uint16_t)h);
        if (isnan(g)) {
            CHECK(isnan(f), "half 0x%04x should be NaN", h);
            CHECK(isnan(fa3c_half_to_float(fa3c_float_to_half(f))), "NaN kept");
            continue;
        }
        CHECK(memcmp(&f, &g, 4) == 0, "half 0x%04x -> %g, want %g", h, f, g);
        CHECK(fa3c_float_to_half(f) == h, "half 0x%04x does not round-trip", h);
        CHECK(fa3c_bf16_to_float((uint16_t)h) == tu_bf16_to_float((uint16_t)h) || isnan(tu_bf16_to_float((uint16_t)h)),
              "bf16 0x%04x", h);
    }
    int bad_h = 0, bad_b = 0;
    for (int it = 0; it < 200000; it++) {
        uint32_t u = (uint32_t)tu_rand_u64();
        if (it & 1) u = (u & 0x807fffffu) | ((uint32_t)tu_rand_int(100, 145) << 23); /* near the half range */
        const float x = tu_bits_f(u);
        if (isnan(x)) continue;
        bad_h += fa3c_float_to_half(x) != tu_float_to_half(x);
        bad_b += fa3c_float_to_bf16(x) != tu_float_to_bf16(x);
    }
    CHECK(bad_h == 0 && bad_b == 0, "%d fp16 and %d bf16 roundings differ from the independent ones", bad_h, bad_b);
    CHECK(fa3c_float_to_half(65519.99f) == 0x7bff && fa3c_float_to_half(65520.0f) == 0x7c00, "fp16 overflow threshold");
    CHECK(fa3c_float_to_bf16(INFINITY) == 0x7f80 && (fa3c_float_to_bf16(-NAN) & 0x7fff) > 0x7f80, "bf16 inf/NaN");
}

TEST_MAIN()
