/* fa3c-run's accuracy check: attention recomputed for a sample of rows,
 * once exactly (float64) and once "naively in the input precision" (float
 * accumulation, intermediates rounded to the storage type, as an eager
 * framework would do it). The library passes when, on the sampled rows,
 *
 *     max |lib - exact|  <=  2 * max |naive - exact|  +  atol,
 *
 * the rule FA3's own tests use; atol is a few output-type ulps of the
 * largest reference value. The mask is implemented here independently of
 * the library, from the contract in include/fa3c.h. */
#ifndef FA3C_RUN_ROW_CHECK_H
#define FA3C_RUN_ROW_CHECK_H

#include <stdint.h>

#include "fa3c.h"

/* Inputs are contiguous (batch, seqlen, heads, headdim) arrays of float
 * holding the stored values exactly; out and lse are what the library's
 * forward returned (used by the backward check, whose result is a function
 * of them). */
typedef struct rc_problem {
    fa3c_dtype dtype;
    int batch, sq, sk, hq, hkv, d;
    double scale, softcap;
    int causal, window_left, window_right;
    const float *q, *k, *v, *dout, *out, *lse; /* lse: (batch, hq, sq) */
} rc_problem;

/* Errors of one output over the compared elements. */
typedef struct rc_stats {
    double max_err;   /* library vs exact */
    double naive_err; /* naive vs exact */
    double ref_max;   /* largest |exact| */
    double err_sq, ref_sq;
    int64_t count;
} rc_stats;

/* Called now and then during long checks (done of total units). */
typedef void (*rc_progress_fn)(const char *what, int64_t done, int64_t total);

/* Up to n indices spread evenly over [0, len), first and last included. */
int rc_spread(int n, int len, int *out);

/* Keys [lo, hi] that query i sees (empty when lo > hi). */
void rc_key_range(const rc_problem *pr, int i, int *lo, int *hi);

/* Number of (query, key) pairs the mask lets through, for one (batch, head). */
int64_t rc_visible_pairs(const rc_problem *pr);

/* Forward: compare out (out_dtype) and lse (NULL = not checked) of the
 * library on rows x all (batch, head) pairs. */
void rc_check_fwd(const rc_problem *pr, const int *rows, int nrows, const void *lib_out, fa3c_dtype out_dtype,
                  const float *lib_lse, rc_stats *out_st, rc_stats *lse_st, rc_progress_fn progress);

/* Backward: dq on q rows, dk and dv on k rows, all (batch, head) pairs. */
void rc_check_bwd(const rc_problem *pr, const int *qrows, int nq, const int *krows, int nk, const void *lib_dq,
                  const void *lib_dk, const void *lib_dv, rc_stats *dq_st, rc_stats *dk_st, rc_stats *dv_st,
                  rc_progress_fn progress);

/* The accuracy rule for one output; *bound receives the allowed max error. */
int rc_pass(const rc_stats *st, fa3c_dtype out_dtype, int is_lse, double *bound);

/* Relative L2 error ||lib - exact|| / ||exact|| over the compared elements. */
double rc_rel_l2(const rc_stats *st);

#endif
