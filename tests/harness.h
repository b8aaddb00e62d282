/* A minimal test harness. Each test file defines cases with TEST(name) and
 * ends with TEST_MAIN(). The build registers every TEST(name) line of a file
 * as its own ctest case (tests/CMakeLists.txt reads them from the source),
 * running `exe name`. `exe` alone runs all cases of the file.
 *
 *   TEST(fwd_small) { CHECK(err < 1e-3, "err %g", err); }
 *   SKIP("no sm_90 GPU")  -> exits 77, which ctest reports as skipped.
 */
#ifndef FA3C_TEST_HARNESS_H
#define FA3C_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*harness_fn)(void);
struct harness_case { const char *name; harness_fn fn; };

#define HARNESS_MAX_CASES 512
static struct harness_case harness_cases[HARNESS_MAX_CASES];
static int harness_ncases;
static int harness_failures;
static int harness_skipped;
static const char *harness_current;

static void harness_register(const char *name, harness_fn fn) {
    if (harness_ncases < HARNESS_MAX_CASES) {
        harness_cases[harness_ncases].name = name;
        harness_cases[harness_ncases].fn = fn;
        harness_ncases++;
    }
}

#define TEST(name)                                                                   \
    static void test_##name(void);                                                   \
    __attribute__((constructor)) static void harness_reg_##name(void) {              \
        harness_register(#name, test_##name);                                        \
    }                                                                                \
    static void test_##name(void)

/* Record a failure and go on (so one run shows every broken check). */
#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            harness_failures++;                                                      \
            fprintf(stderr, "FAIL %s (%s:%d): %s: ", harness_current, __FILE__,      \
                    __LINE__, #cond);                                                \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
        }                                                                            \
    } while (0)

/* Stop this case and report it skipped (exit code 77 under ctest). */
#define SKIP(...)                                                                    \
    do {                                                                             \
        printf("SKIPPED %s: ", harness_current);                                     \
        printf(__VA_ARGS__);                                                         \
        printf("\n");                                                                \
        harness_skipped = 1;                                                         \
        return;                                                                      \
    } while (0)

static int harness_run(int argc, char **argv) {
    int ran = 0;
    for (int c = 0; c < harness_ncases; c++) {
        if (argc > 1 && strcmp(argv[1], harness_cases[c].name) != 0) continue;
        harness_current = harness_cases[c].name;
        int before = harness_failures;
        harness_skipped = 0;
        harness_cases[c].fn();
        ran++;
        if (harness_skipped) continue;
        printf("%s %s\n", harness_failures == before ? "ok  " : "FAIL", harness_current);
    }
    if (ran == 0) {
        fprintf(stderr, "no test case named '%s'\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    if (harness_failures) return 1;
    return (ran == 1 && harness_skipped) ? 77 : 0;
}

#define TEST_MAIN() \
    int main(int argc, char **argv) { return harness_run(argc, argv); }

#endif
