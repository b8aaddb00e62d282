/* The public structs' layout as this library was built (fa3c_struct_layout),
 * so that bindings that mirror them (python/fa3c/_lib.py) can refuse a
 * library whose structs differ from theirs instead of reading them wrong. */
#include <stddef.h>
#include <string.h>

#include "fa3c.h"

typedef struct {
    const char *type, *field;   /* field NULL: the struct's size */
    size_t value;
} layout_entry;

#define SIZE(T) {#T, NULL, sizeof(T)}
#define FIELD(T, f) {#T, #f, offsetof(T, f)}
static const layout_entry layout[] = {
    SIZE(fa3c_tensor), FIELD(fa3c_tensor, data), FIELD(fa3c_tensor, stride),
    SIZE(fa3c_problem), FIELD(fa3c_problem, dtype), FIELD(fa3c_problem, batch), FIELD(fa3c_problem, seqlen_q),
    FIELD(fa3c_problem, seqlen_k), FIELD(fa3c_problem, heads_q), FIELD(fa3c_problem, heads_kv),
    FIELD(fa3c_problem, headdim), FIELD(fa3c_problem, softmax_scale), FIELD(fa3c_problem, causal),
    FIELD(fa3c_problem, window_left), FIELD(fa3c_problem, window_right), FIELD(fa3c_problem, softcap),
    FIELD(fa3c_problem, cu_seqlens_q), FIELD(fa3c_problem, cu_seqlens_k), FIELD(fa3c_problem, seqused_k),
    FIELD(fa3c_problem, page_table), FIELD(fa3c_problem, page_table_stride), FIELD(fa3c_problem, page_size),
    FIELD(fa3c_problem, num_pages), FIELD(fa3c_problem, sinks),
    FIELD(fa3c_problem, headdim_v), FIELD(fa3c_problem, seqused_q), FIELD(fa3c_problem, leftpad_k),
    SIZE(fa3c_fwd_params), FIELD(fa3c_fwd_params, problem), FIELD(fa3c_fwd_params, q), FIELD(fa3c_fwd_params, k),
    FIELD(fa3c_fwd_params, v), FIELD(fa3c_fwd_params, out), FIELD(fa3c_fwd_params, lse),
    FIELD(fa3c_fwd_params, q_descale), FIELD(fa3c_fwd_params, k_descale), FIELD(fa3c_fwd_params, v_descale),
    FIELD(fa3c_fwd_params, num_splits), FIELD(fa3c_fwd_params, backend), FIELD(fa3c_fwd_params, qv),
    FIELD(fa3c_fwd_params, q_block_descale), FIELD(fa3c_fwd_params, k_block_descale),
    FIELD(fa3c_fwd_params, v_block_descale),
    SIZE(fa3c_bwd_params), FIELD(fa3c_bwd_params, problem), FIELD(fa3c_bwd_params, q), FIELD(fa3c_bwd_params, k),
    FIELD(fa3c_bwd_params, v), FIELD(fa3c_bwd_params, out), FIELD(fa3c_bwd_params, dout),
    FIELD(fa3c_bwd_params, lse), FIELD(fa3c_bwd_params, dq), FIELD(fa3c_bwd_params, dk), FIELD(fa3c_bwd_params, dv),
    FIELD(fa3c_bwd_params, dsinks), FIELD(fa3c_bwd_params, deterministic), FIELD(fa3c_bwd_params, backend),
    SIZE(fa3c_append_params), FIELD(fa3c_append_params, dtype), FIELD(fa3c_append_params, batch),
    FIELD(fa3c_append_params, seqlen_new), FIELD(fa3c_append_params, heads_kv), FIELD(fa3c_append_params, headdim),
    FIELD(fa3c_append_params, headdim_v), FIELD(fa3c_append_params, k_new), FIELD(fa3c_append_params, v_new),
    FIELD(fa3c_append_params, k_cache), FIELD(fa3c_append_params, v_cache), FIELD(fa3c_append_params, seqlen_cache),
    FIELD(fa3c_append_params, cache_seqlens), FIELD(fa3c_append_params, page_table),
    FIELD(fa3c_append_params, page_table_stride), FIELD(fa3c_append_params, page_size),
    FIELD(fa3c_append_params, num_pages), FIELD(fa3c_append_params, backend),
    FIELD(fa3c_append_params, cu_seqlens_new), FIELD(fa3c_append_params, rotary_cos),
    FIELD(fa3c_append_params, rotary_sin), FIELD(fa3c_append_params, rotary_dim),
    FIELD(fa3c_append_params, rotary_rows), FIELD(fa3c_append_params, rotary_stride),
    FIELD(fa3c_append_params, rotary_interleaved), FIELD(fa3c_append_params, rotary_seqlens),
    FIELD(fa3c_append_params, q), FIELD(fa3c_append_params, q_out), FIELD(fa3c_append_params, seqlen_q),
    FIELD(fa3c_append_params, heads_q), FIELD(fa3c_append_params, rotary_q_by_row),
    SIZE(fa3c_quantize_params), FIELD(fa3c_quantize_params, dtype), FIELD(fa3c_quantize_params, batch),
    FIELD(fa3c_quantize_params, seqlen), FIELD(fa3c_quantize_params, heads), FIELD(fa3c_quantize_params, headdim),
    FIELD(fa3c_quantize_params, group), FIELD(fa3c_quantize_params, x), FIELD(fa3c_quantize_params, out),
    FIELD(fa3c_quantize_params, descale), FIELD(fa3c_quantize_params, hadamard), FIELD(fa3c_quantize_params, signs),
    FIELD(fa3c_quantize_params, backend), FIELD(fa3c_quantize_params, block_rows),
};
#undef SIZE
#undef FIELD

int64_t fa3c_struct_layout(const char *type, const char *field) {
    if (!type) return -1;
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
        const layout_entry *e = &layout[i];
        if (strcmp(e->type, type) != 0) continue;
        if (field ? e->field && strcmp(e->field, field) == 0 : !e->field) return (int64_t)e->value;
    }
    return -1;
}
