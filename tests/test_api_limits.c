/* Size limits and check order of the public API: lengths near INT_MAX once made
 * the CPU loops wrap (a hang) and page-table checks overflow (an out-of-bounds
 * read); a malformed backward call must be named before an unsupported one. */
#include <limits.h>
#include "harness.h"
#include "testutil.h"

static float q_buf[64], k_buf[64], v_buf[64], o_buf[64];

/* A tiny valid fp32 forward: batch 1, seqlen 2, 1 head, headdim 8. */
static fa3c_fwd_params tiny_fwd(void) {
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem.dtype = FA3C_DTYPE_FP32;
    p.problem.batch = 1;
    p.problem.seqlen_q = p.problem.seqlen_k = 2;
    p.problem.heads_q = p.problem.heads_kv = 1;
    p.problem.headdim = 8;
    p.q = tu_tensor(q_buf, 1, 2, 1, 8);
    p.k = tu_tensor(k_buf, 1, 2, 1, 8);
    p.v = tu_tensor(v_buf, 1, 2, 1, 8);
    p.out = tu_tensor(o_buf, 1, 2, 1, 8);
    p.backend = FA3C_BACKEND_CPU;
    return p;
}

TEST(seqlen_past_the_limit_is_refused) {
    fa3c_fwd_params p = tiny_fwd();
    p.problem.seqlen_k = INT_MAX;   /* k, v broadcast: the call would be cheap to attempt */
    p.k.stride[0] = p.k.stride[1] = p.v.stride[0] = p.v.stride[1] = 0;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "seqlen_k INT_MAX accepted");
    CHECK(strstr(fa3c_last_error(), "problem.seqlen_k") && strstr(fa3c_last_error(), "FA3C_MAX_SEQLEN"),
          "message: %s", fa3c_last_error());
    p = tiny_fwd();
    p.problem.seqlen_q = FA3C_MAX_SEQLEN + 1;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "seqlen_q past the limit accepted");
    CHECK(strstr(fa3c_last_error(), "problem.seqlen_q") != NULL, "message: %s", fa3c_last_error());
}

TEST(page_table_sizes_are_bounded) {
    static int32_t table[4] = {0, 5, 0, 0};
    fa3c_fwd_params p = tiny_fwd();
    p.problem.page_table = table;
    p.problem.num_pages = 1;
    p.problem.page_size = FA3C_MAX_SEQLEN + 1;
    p.problem.page_table_stride = 2;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "page_size past the limit accepted");
    CHECK(strstr(fa3c_last_error(), "problem.page_size") != NULL, "message: %s", fa3c_last_error());
    p.problem.page_size = 1;
    p.problem.page_table_stride = (int64_t)INT_MAX + 1;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "huge page_table_stride accepted");
    CHECK(strstr(fa3c_last_error(), "problem.page_table_stride") != NULL, "message: %s", fa3c_last_error());
    /* Entry 1 (page 5 of 1) covers used key 1: it must be named, not read. */
    p.problem.page_table_stride = 2;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "out-of-range page accepted");
    CHECK(strstr(fa3c_last_error(), "problem.page_table[0][1]") != NULL, "message: %s", fa3c_last_error());
}

TEST(backward_names_malformed_before_unsupported) {
    static float lse[4];
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem.dtype = FA3C_DTYPE_E4M3;   /* unsupported in the backward ... */
    p.problem.batch = 1;
    p.problem.seqlen_q = p.problem.seqlen_k = 2;
    p.problem.heads_q = p.problem.heads_kv = 1;
    p.problem.headdim = 8;
    fa3c_tensor t = tu_tensor(q_buf, 1, 2, 1, 8);
    p.q = p.k = p.v = p.out = p.dout = p.dq = p.dk = p.dv = t;
    p.q.data = NULL;                      /* ... but first of all malformed */
    p.lse = lse;
    p.backend = FA3C_BACKEND_CPU;
    CHECK(fa3c_bwd_check(&p) == FA3C_STATUS_INVALID_ARGUMENT, "got %s: %s", fa3c_status_string(fa3c_bwd_check(&p)),
          fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), "q") != NULL, "message: %s", fa3c_last_error());
    p.q.data = q_buf;
    p.dk.data = k_buf;
    p.dv.data = v_buf;
    p.dq.data = o_buf;
    CHECK(fa3c_bwd_check(&p) == FA3C_STATUS_NOT_SUPPORTED, "well-formed E4M3 backward: got %s: %s",
          fa3c_status_string(fa3c_bwd_check(&p)), fa3c_last_error());
}

TEST_MAIN()
