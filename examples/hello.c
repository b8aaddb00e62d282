/* The README's example: causal attention on the CPU, fp32, one sequence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <fa3c.h>

int main(void) {
    enum { S = 128, H = 4, D = 64 }; /* seqlen, heads, head dim */
    float *q = malloc(sizeof(float) * S * H * D), *k = malloc(sizeof(float) * S * H * D);
    float *v = malloc(sizeof(float) * S * H * D), *o = malloc(sizeof(float) * S * H * D);
    if (!q || !k || !v || !o) return 1;
    for (int i = 0; i < S * H * D; i++) {
        q[i] = sinf(0.1f * i);
        k[i] = cosf(0.7f * i);
        v[i] = sinf(0.3f * i + 1.0f);
    }

    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p); /* always start from the defaults */
    p.problem.dtype = FA3C_DTYPE_FP32;
    p.problem.batch = 1;
    p.problem.seqlen_q = p.problem.seqlen_k = S;
    p.problem.heads_q = p.problem.heads_kv = H;
    p.problem.headdim = D;
    p.problem.causal = 1;
    /* (batch, seqlen, heads, headdim), contiguous; strides in elements */
    fa3c_tensor t = {NULL, {S * H * D, H * D, D, 1}};
    p.q = t, p.q.data = q;
    p.k = t, p.k.data = k;
    p.v = t, p.v.data = v;
    p.out = t, p.out.data = o;

    fa3c_status s = fa3c_fwd(&p, NULL); /* host pointers: runs on the CPU */
    if (s != FA3C_STATUS_OK) {
        fprintf(stderr, "fa3c_fwd: %s: %s\n", fa3c_status_string(s), fa3c_last_error());
        return 1;
    }
    printf("fa3c %s: out[0][0][0..3] = %.4f %.4f %.4f %.4f\n", fa3c_version(), o[0], o[1], o[2], o[3]);
    free(q), free(k), free(v), free(o);
    return 0;
}
