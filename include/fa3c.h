/*
 * fa3c: exact attention (FlashAttention-3) for NVIDIA Hopper GPUs and the CPU.
 *
 *   O = softmax(Q·Kᵀ·scale + mask)·V,  forward and backward.
 *
 * The only public header. Plain C99; needs no CUDA header. All functions are
 * thread-safe; the detailed error message is kept per thread.
 *
 * Tensors are (batch, seqlen, heads, headdim) with strides in ELEMENTS and a
 * unit stride on headdim, so packed QKV and transposed views work without a
 * copy. See docs/API.md for the full contract.
 */
#ifndef FA3C_H
#define FA3C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#  define FA3C_API __attribute__((visibility("default")))
#else
#  define FA3C_API
#endif

#define FA3C_VERSION_MAJOR 0
#define FA3C_VERSION_MINOR 7
#define FA3C_VERSION_PATCH 0
/* 10000*major + 100*minor + patch */
#define FA3C_VERSION (FA3C_VERSION_MAJOR * 10000 + FA3C_VERSION_MINOR * 100 + FA3C_VERSION_PATCH)

/* Status codes. Append-only: values never change. */
typedef enum fa3c_status {
    FA3C_STATUS_OK = 0,
    FA3C_STATUS_INVALID_ARGUMENT = 1, /* a parameter is wrong; fa3c_last_error() says which */
    FA3C_STATUS_NOT_SUPPORTED = 2,    /* valid, but this backend cannot do it (yet) */
    FA3C_STATUS_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
    FA3C_STATUS_NO_DEVICE = 4,        /* backend CUDA asked for, but no usable sm_90 GPU */
    FA3C_STATUS_CUDA_ERROR = 5,       /* the CUDA runtime reported an error */
    FA3C_STATUS_INTERNAL_ERROR = 6    /* a bug in fa3c: please report it */
} fa3c_status;

/* Element types. E4M3 is fp8 (OCP e4m3fn: no infinities, max 448), forward only. */
typedef enum fa3c_dtype {
    FA3C_DTYPE_FP32 = 0,
    FA3C_DTYPE_FP16 = 1,
    FA3C_DTYPE_BF16 = 2,
    FA3C_DTYPE_E4M3 = 3
} fa3c_dtype;

/* Where the work runs. AUTO: CUDA when the pointers are device memory and an
 * sm_90 GPU is there, else CPU. CPU_REFERENCE is the naive float64 oracle. */
typedef enum fa3c_backend {
    FA3C_BACKEND_AUTO = 0,
    FA3C_BACKEND_CPU = 1,
    FA3C_BACKEND_CUDA = 2,
    FA3C_BACKEND_CPU_REFERENCE = 3
} fa3c_backend;

/* A 4-D view (batch, seqlen, heads, headdim). stride[] in elements; stride[3]
 * must be 1. Strides may be any non-negative values (0 broadcasts).
 * Variable length (cu_seqlens set): rows of sequence b start at token
 * cu_seqlens[b]; stride[0] is ignored and stride[1] steps over tokens.
 * Paged KV (page_table set): k and v are (num_pages, page_size, heads_kv,
 * headdim), stride[0] steps over pages. data is never NULL, even where a
 * packed batch holds no tokens (TMA needs a real address; any 16-byte
 * aligned allocation does). */
typedef struct fa3c_tensor {
    void *data;
    int64_t stride[4];
} fa3c_tensor;

/* Largest seqlen_q, seqlen_k (and page_size) any backend accepts. */
#define FA3C_MAX_SEQLEN (1 << 30)

/* Rows per block of the e4m3 forward's block descales (fa3c_fwd_params). */
#define FA3C_FP8_BLOCK_ROWS 128

/* The attention problem shared by forward and backward. */
typedef struct fa3c_problem {
    fa3c_dtype dtype;      /* of q, k, v (and out, dout, dq, dk, dv; E4M3 in -> BF16 out) */
    int batch;             /* 0 (or heads_q 0, or a forward's seqlen_q 0): nothing to do, success (docs/API.md) */
    int seqlen_q;          /* 0..FA3C_MAX_SEQLEN; with cu_seqlens_q: the maximum over the batch */
    int seqlen_k;          /* with cu_seqlens_k / page_table: the maximum over the batch */
    int heads_q;
    int heads_kv;          /* heads_q % heads_kv == 0 (GQA / MQA) */
    int headdim;           /* of q and k (and dq, dk): 8..256, a multiple of 8 */
    float softmax_scale;   /* 0 means 1/sqrt(headdim) */
    int causal;            /* bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q */
    int window_left;       /* sliding window, -1 = unbounded; query i sees keys in */
    int window_right;      /*   [i + sk - sq - left, i + sk - sq + right] */
    float softcap;         /* 0 = off; else scores become softcap * tanh(score / softcap) */
    /* Variable-length batches (NULL = fixed length): batch+1 prefix sums of
     * the sequence lengths, int32, in the same memory as the tensors. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    /* Optional (NULL = all): number of keys actually used per sequence (batch
     * int32), e.g. the filled length of a KV cache. */
    const int32_t *seqused_k;
    /* Paged KV cache (NULL = contiguous): page_table[b * page_table_stride + i]
     * is the page holding keys [i*page_size, (i+1)*page_size) of sequence b. */
    const int32_t *page_table;
    int64_t page_table_stride;
    int page_size;
    int num_pages;         /* pages in k and v; page_table entries must be < num_pages */
    /* Optional (NULL = none): a learned attention sink per query head
     * (heads_q float32, as gpt-oss): one more logit, in the units of the
     * scaled (and softcapped) scores, in every row's softmax, with no value
     * row, so out = Σ_j p_j v_j with p = softmax([scores, sink]) over the
     * visible keys and the sink, and lse includes it (a row that sees no key
     * gets out = 0 and lse = sink). CPU backends, and CUDA in bf16 / fp16
     * (not e4m3: NOT_SUPPORTED; docs/API.md). */
    const float *sinks;
    /* Head dim of v, out, dout and dv when it differs from headdim (MLA:
     * q, k 192 with v 128): 8..512, a multiple of 8; 0 = headdim. CPU
     * backends; the CUDA backend in bf16 / fp16 up to 256 (NOT_SUPPORTED
     * above: absorbed decode's 512). */
    int headdim_v;
    /* Optional (NULL = all): number of queries actually used per sequence
     * (batch int32, FA3's seqused_q), in the same memory as the tensors.
     * Sequence b then has min(seqused_q[b], its queries) queries: the causal
     * diagonal and windows align to that count, out and lse rows past it are
     * not written, and the backward writes zeros to their dq rows. CPU
     * backends; the CUDA forward and backward in bf16 / fp16 (e4m3 returns
     * NOT_SUPPORTED so far). Rows past the count may hold anything. */
    const int32_t *seqused_q;
    /* Optional (NULL = none): left padding of a KV cache (batch int32, FA3's
     * leftpad_k / cache_leftpad), in the same memory as the tensors. Sequence
     * b's keys then start at row leftpad_k[b] of its cache (of its packed
     * keys with cu_seqlens_k; of its pages' positions with a page table) and
     * end where they would without it (seqused_k[b], or its stored keys): it
     * has that count minus leftpad_k[b] keys, key j at row leftpad_k[b] + j,
     * and the causal diagonal and windows align to that count. Each entry in
     * [0, the sequence's keys]. Forward only (the backward returns
     * NOT_SUPPORTED, as FA3 has none); CPU backends, and the CUDA forward in
     * bf16 / fp16 without a page table. */
    const int32_t *leftpad_k;
} fa3c_problem;

typedef struct fa3c_fwd_params {
    fa3c_problem problem;
    fa3c_tensor q, k, v;   /* inputs */
    fa3c_tensor out;       /* output, heads_q heads */
    /* Optional output (NULL = not written): float32 log-sum-exp of the scaled
     * scores, natural log, contiguous (batch, heads_q, seqlen_q); with
     * cu_seqlens_q it is (heads_q, total_q). Fully masked rows get -inf and an
     * output row of zeros. */
    float *lse;
    /* E4M3 only (NULL = 1.0): float32 descale factors of shape (batch, heads_kv),
     * contiguous: the true value is stored value * descale. */
    const float *q_descale, *k_descale, *v_descale;
    int num_splits;        /* split-KV decoding: 0 = auto, 1 = off, n = at most n splits */
    fa3c_backend backend;
    /* Optional (data NULL = none): FA3's qv, for absorbed MLA decode (q the
     * rope part, v the latent that K shares). Shaped as out (heads_q heads,
     * headdim_v); the scores become softmax_scale · (q·kᵀ + qv·vᵀ), and
     * softmax_scale 0 means 1/sqrt(headdim + headdim_v). Not with E4M3; the
     * CPU backends only: the CUDA backend returns NOT_SUPPORTED for now. */
    fa3c_tensor qv;
    /* E4M3 only (NULL = 1.0): float32 descales per block of
     * FA3C_FP8_BLOCK_ROWS rows, multiplying q_descale, k_descale, v_descale
     * (the true value is stored value * descale * block descale):
     * q_block_descale (batch, heads_q, ceil(seqlen_q / 128)), k_ and
     * v_block_descale (batch, heads_kv, ceil(seqlen_k / 128)), contiguous,
     * seqlen_q / seqlen_k the maxima with cu_seqlens or a page table. A row's
     * block is its position in its sequence / 128: query i's is i / 128, key
     * j's is (leftpad_k + j) / 128, the key's row in its sequence's cache
     * (contiguous, packed or paged alike). fa3c_quantize_fp8 writes them
     * (block_rows = FA3C_FP8_BLOCK_ROWS, group 1). Both backends. */
    const float *q_block_descale, *k_block_descale, *v_block_descale;
} fa3c_fwd_params;

typedef struct fa3c_bwd_params {
    fa3c_problem problem;
    fa3c_tensor q, k, v, out, dout; /* inputs (out and lse from the forward) */
    const float *lse;               /* as written by the forward; required */
    fa3c_tensor dq, dk, dv;         /* outputs; dk, dv have heads_kv heads */
    /* Optional output with problem.sinks (NULL = not written): float32
     * gradient of each head's sink, heads_q values, summed over the batch
     * and rows: dsinks[h] = -Σ exp(sink[h] - lse) · rowsum(dout ⊙ out). */
    float *dsinks;
    int deterministic;              /* 1 = bitwise reproducible run to run */
    fa3c_backend backend;
} fa3c_bwd_params;

/* Defaults: dtype BF16, softmax_scale 0 (= 1/sqrt(d)), no mask, windows -1,
 * no varlen/paging, backend AUTO, everything else zero/NULL. Always start
 * from these: a zeroed struct means window (0, 0), not "no window". */
FA3C_API void fa3c_fwd_params_init(fa3c_fwd_params *p);
FA3C_API void fa3c_bwd_params_init(fa3c_bwd_params *p);

/* Forward: out (and lse) from q, k, v. stream: a cudaStream_t for the CUDA
 * backend (NULL = default stream), ignored on the CPU. Everything is checked
 * before any work starts; on error nothing has been written. */
FA3C_API fa3c_status fa3c_fwd(const fa3c_fwd_params *p, void *stream);

/* Backward: dq, dk, dv from dout and the forward's q, k, v, out, lse. */
FA3C_API fa3c_status fa3c_bwd(const fa3c_bwd_params *p, void *stream);

/* Validate only: the status fa3c_fwd / fa3c_bwd would return before starting,
 * without doing any work (backend AUTO resolves as the call would). */
FA3C_API fa3c_status fa3c_fwd_check(const fa3c_fwd_params *p);
FA3C_API fa3c_status fa3c_bwd_check(const fa3c_bwd_params *p);

/* fa3c_fwd_check / fa3c_bwd_check, and for a call on the CUDA backend also
 * the device-resident arrays (cu_seqlens_q/k, seqused_k, page_table, the
 * descales): copied to the host on `stream`, which this synchronizes, and
 * checked as the CPU backends check theirs, naming the array and the entry
 * (e.g. "problem.seqused_k[3]: must be in [0, problem.seqlen_k = 64] (got
 * 5000)"). A debugging aid and a check before capturing a step in a CUDA
 * graph; not itself capturable. On the CPU backends the same as
 * fa3c_*_check. */
FA3C_API fa3c_status fa3c_fwd_check_device(const fa3c_fwd_params *p, void *stream);
FA3C_API fa3c_status fa3c_bwd_check_device(const fa3c_bwd_params *p, void *stream);

/* A short fixed string for a status ("invalid argument"). Never NULL. */
FA3C_API const char *fa3c_status_string(fa3c_status s);

/* The detailed message of the last failed call on this thread, e.g.
 * "k: stride of dim 3 must be 1 (got 2)"; "" after a successful call. */
FA3C_API const char *fa3c_last_error(void);

/* "0.5.0" */
FA3C_API const char *fa3c_version(void);

/* The layout of a public struct as this library was built: with field NULL
 * the size of struct `type` ("fa3c_tensor", "fa3c_problem",
 * "fa3c_fwd_params", "fa3c_bwd_params", "fa3c_append_params", "fa3c_quantize_params"), else the byte offset of `field` in
 * it; -1 for a name it does not know. For bindings that mirror the structs
 * (python/fa3c checks every field and refuses a library that differs). */
FA3C_API int64_t fa3c_struct_layout(const char *type, const char *field);

/* 1 when the CUDA backend was compiled in and an sm_90 GPU is usable. */
FA3C_API int fa3c_cuda_available(void);

/* ---- KV cache appends (a decode step's write) ----------------------------- */

/* New keys and values written into a KV cache at each sequence's filled
 * length, as FA3's flash_attn_with_kvcache(k=, v=) does before attending:
 * token j of sequence b goes to position cache_seqlens[b] + j of that
 * sequence, in its rows of a contiguous cache or through its page table.
 * cache_seqlens is not changed (the caller advances it). On the CUDA backend
 * nothing is read back to the host: the call can be captured in a CUDA graph
 * with the rest of the step. Where cache_seqlens lives on the GPU the API
 * cannot read it; the kernel then skips a token whose position is past the
 * cache or whose page entry is outside [0, num_pages) (fa3c_append_kv_check_device
 * names such entries).
 *
 * FA3's cache_batch_idx (sequence b in row cache_batch_idx[b] of a contiguous
 * cache) is a page table of one page per sequence: page_table = cache_batch_idx,
 * page_table_stride = 1, page_size = seqlen_cache, num_pages = the cache's rows.
 * The attention calls take the same page table.
 *
 * Optional parts, as flash_attn_with_kvcache has them (zero / NULL = off):
 * - cu_seqlens_new: the new tokens packed. Sequence b appends rows
 *   cu_seqlens_new[b] .. cu_seqlens_new[b + 1] - 1 of k_new / v_new, which are
 *   (1, total, heads_kv, .) (stride[0] ignored); seqlen_new is then the most any
 *   sequence appends.
 * - Rotary embedding (rotary_dim > 0; FP32, FP16, BF16): the first rotary_dim
 *   columns of each new key are rotated as they are written, and those of q
 *   into q_out (the other columns copied), in float, rounded once. New token j
 *   of sequence b is at position pos_b + j, pos_b = rotary_seqlens[b] (NULL:
 *   cache_seqlens[b]); query i at pos_b + i when rotary_q_by_row (what FA3
 *   does for causal or local attention), else at pos_b. A pair (x, y) at
 *   position t and frequency f becomes (x·cos - y·sin, x·sin + y·cos) with
 *   cos = rotary_cos[t][f], sin = rotary_sin[t][f]. A position outside
 *   [0, rotary_rows) is refused where the API can read the lengths; in a
 *   kernel that token or query row is skipped. */
typedef struct fa3c_append_params {
    fa3c_dtype dtype;             /* of the new tokens and the caches (E4M3: bytes) */
    int batch, seqlen_new, heads_kv, headdim;
    int headdim_v;                /* v's columns; 0 = headdim */
    fa3c_tensor k_new, v_new;     /* (batch, seqlen_new, heads_kv, headdim / headdim_v) */
    /* (batch, seqlen_cache, heads_kv, .) rows of each sequence, or with a page
     * table (num_pages, page_size, heads_kv, .): stride[0] steps over pages. */
    fa3c_tensor k_cache, v_cache;
    int seqlen_cache;             /* contiguous: rows per sequence (1..FA3C_MAX_SEQLEN) */
    const int32_t *cache_seqlens; /* batch filled lengths (required), the tensors' memory */
    const int32_t *page_table;    /* NULL = contiguous; else batch rows of page_table_stride */
    int64_t page_table_stride;
    int page_size, num_pages;
    fa3c_backend backend;         /* AUTO: CUDA for device memory, else CPU */
    const int32_t *cu_seqlens_new;  /* batch + 1 prefix sums: the new tokens packed (above) */
    const void *rotary_cos, *rotary_sin;  /* dtype, (rotary_rows, rotary_dim / 2), rows rotary_stride apart */
    int rotary_dim;               /* 0 = no rotary; else even, <= headdim */
    int rotary_rows;
    int64_t rotary_stride;        /* in elements; 0 = rotary_dim / 2 */
    int rotary_interleaved;       /* 1: pairs (2f, 2f + 1) (GPT-J); 0: (f, f + rotary_dim / 2) (GPT-NeoX) */
    const int32_t *rotary_seqlens;  /* batch positions of the first new token; NULL = cache_seqlens */
    fa3c_tensor q, q_out;         /* q.data NULL = none; (batch, seqlen_q, heads_q, headdim); q_out may be q */
    int seqlen_q, heads_q;
    int rotary_q_by_row;          /* 1: query i at pos_b + i; 0: every query at pos_b */
} fa3c_append_params;

FA3C_API void fa3c_append_params_init(fa3c_append_params *p);
FA3C_API fa3c_status fa3c_append_kv(const fa3c_append_params *p, void *stream);
/* The status fa3c_append_kv would return, without writing (host arrays read). */
FA3C_API fa3c_status fa3c_append_kv_check(const fa3c_append_params *p);
/* fa3c_append_kv_check, and on the CUDA backend cache_seqlens and the page
 * table copied to the host on stream (synchronized) and checked too. */
FA3C_API fa3c_status fa3c_append_kv_check_device(const fa3c_append_params *p, void *stream);

/* ---- fp8 quantization (the input of the e4m3 forward) -------------------- */

/* x (batch, seqlen, heads, headdim) of FP32 / FP16 / BF16 to e4m3 bytes in
 * out (same shape), with one float32 descale per (batch, group of `group`
 * consecutive heads) written to descale ((batch, heads / group), contiguous):
 * out * descale ≈ x. group = heads_q / heads_kv for q gives the (batch,
 * heads_kv) q_descale the forward takes; 1 for k and v. The descale is the
 * block's largest |value| / 448 (1 for an all-zero block), values are rounded
 * to nearest even, and a NaN or inf in a block makes its descale NaN or inf,
 * so it propagates. With hadamard = 1 each row is first rotated as by
 * fa3c_hadamard_rotate_f32 (headdim a power of two <= 256; signs: headdim
 * entries of +1 / -1, or NULL): rotate q and k with the same signs and Q·Kᵀ
 * is unchanged while outliers spread over the row (FA3's incoherent
 * processing). Any backend: CPU memory on the CPU, device memory on CUDA
 * (nothing read back to the host). */
typedef struct fa3c_quantize_params {
    fa3c_dtype dtype;             /* of x: FP32, FP16 or BF16 */
    int batch, seqlen, heads, headdim;
    int group;                    /* heads per descale, dividing heads (0 = 1) */
    fa3c_tensor x, out;           /* out: e4m3 bytes, unit stride on the last dimension */
    float *descale;
    int hadamard;
    const float *signs;           /* with hadamard; the tensors' memory */
    fa3c_backend backend;
    /* 0: one descale per (batch, group) over all rows, as above.
     * FA3C_FP8_BLOCK_ROWS: one per (batch, group, block of 128 rows): descale
     * is then (batch, heads / group, ceil(seqlen / 128)), contiguous, the
     * forward's q_block_descale (group 1) or k_ / v_block_descale. */
    int block_rows;
} fa3c_quantize_params;

FA3C_API void fa3c_quantize_params_init(fa3c_quantize_params *p);
FA3C_API fa3c_status fa3c_quantize_fp8(const fa3c_quantize_params *p, void *stream);
/* The status fa3c_quantize_fp8 would return, without writing. */
FA3C_API fa3c_status fa3c_quantize_fp8_check(const fa3c_quantize_params *p);

/* ---- fp8 and incoherent processing helpers (host, CPU memory) ----------- */

/* float -> e4m3fn byte: round to nearest even, saturating to +-448, NaN -> 0x7f. */
FA3C_API uint8_t fa3c_float_to_e4m3(float x);
FA3C_API float fa3c_e4m3_to_float(uint8_t x);

/* In place, n rows of length len (a power of two <= 256, rows contiguous):
 * x <- x·H/sqrt(len) with H the Sylvester Hadamard matrix, after multiplying
 * column j by signs[j] (+1/-1; NULL = all +1). Orthogonal, so applying it to
 * both Q and K leaves Q·Kᵀ unchanged while spreading outliers across the row. */
FA3C_API fa3c_status fa3c_hadamard_rotate_f32(float *x, int64_t n, int len, const float *signs);

#ifdef __cplusplus
}
#endif
#endif /* FA3C_H */
