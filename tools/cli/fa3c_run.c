/* fa3c-run: run one attention problem on random inputs, time it, and check
 * a sample of rows against a float64 recomputation.
 *
 *   fa3c-run --batch 2 --seqlen 4096 --heads 16 --hdim 128 --dtype bf16 --causal
 *
 * Exit status: 0 PASS, 1 FAIL or any error, 2 bad command line. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_mem.h"
#include "elem.h"
#include "fa3c.h"
#include "row_check.h"

/* ---- options ---- */

enum device { DEV_AUTO, DEV_CPU, DEV_CUDA, DEV_REFERENCE };

typedef struct options {
    int batch, seqlen, seqlen_k, heads, heads_kv, hdim;
    int causal, window_left, window_right;
    double softcap, scale;
    fa3c_dtype dtype;
    int backward, print_device;
    enum device device;
    int iters, warmup, check_rows;
    uint64_t seed;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: fa3c-run [options]\n"
            "Runs attention on random N(0,1) inputs, reports the median time and TFLOPS, and checks\n"
            "sampled rows against a float64 recomputation (PASS: max error <= 2x the error of the\n"
            "same math done naively in the input precision, plus a few output ulps).\n"
            "\n"
            "  --batch N          batch size (default 1)\n"
            "  --seqlen N         query length (default 1024)\n"
            "  --seqlen-k N       key length (default: --seqlen)\n"
            "  --heads N          query heads (default 8)\n"
            "  --heads-kv N       key/value heads, divides --heads (default: --heads)\n"
            "  --hdim N           head dimension, a multiple of 8 in [8, 256] (default 128)\n"
            "  --causal           causal mask, bottom-right aligned\n"
            "  --window L,R       sliding window: keys [i+sk-sq-L, i+sk-sq+R]; -1 = unbounded\n"
            "  --softcap X        scores become X*tanh(score/X) (default 0 = off)\n"
            "  --scale X          softmax scale (default 1/sqrt(hdim))\n"
            "  --dtype T          bf16 | fp16 | fp32 | e4m3 (default bf16; e4m3 is forward only)\n"
            "  --backward         time the backward (after one forward for out and lse)\n"
            "  --device D         auto | cpu | cuda | reference (default auto: cuda when usable)\n"
            "  --iters N          timed iterations, median reported (default 20 on cuda, 3 on cpu)\n"
            "  --warmup N         untimed iterations first (default 3 on cuda, 0 on cpu)\n"
            "  --check-rows N     query rows checked per (batch, head), spread over the sequence;\n"
            "                     for --backward also key rows (default 64; 0 = no check)\n"
            "  --seed S           random seed (default 0)\n"
            "  --print-device     print the device --device auto would use (cuda or cpu) and exit\n"
            "  --help             this text\n"
            "\n"
            "FLOPs: 4*batch*heads*hdim*(unmasked query-key pairs); x2.5 for the backward.\n"
            "Exit status: 0 PASS, 1 FAIL or error, 2 bad command line.\n");
}

static int bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fa3c-run: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n\n", stderr);
    va_end(ap);
    usage(stderr);
    return 2;
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* Returns 0 to go on, else the exit status (help: 0 via *done). */
static int parse_args(int argc, char **argv, options *o, int *done) {
    *o = (options){.batch = 1, .seqlen = 1024, .heads = 8, .hdim = 128, .window_left = -1, .window_right = -1,
                   .dtype = FA3C_DTYPE_BF16, .device = DEV_AUTO, .iters = -1, .warmup = -1, .check_rows = 64};
    *done = 0;
    for (int a = 1; a < argc; a++) {
        char *flag = argv[a], *val = NULL;
        char *eq = strncmp(flag, "--", 2) == 0 ? strchr(flag, '=') : NULL;
        if (eq) { *eq = '\0'; val = eq + 1; } /* --flag=value */
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            usage(stdout);
            *done = 1;
            return 0;
        }
        int is_switch = !strcmp(flag, "--causal") || !strcmp(flag, "--backward") || !strcmp(flag, "--print-device");
        if (is_switch && val) return bad_usage("%s takes no value", flag);
        if (!strcmp(flag, "--causal")) { o->causal = 1; continue; }
        if (!strcmp(flag, "--backward")) { o->backward = 1; continue; }
        if (!strcmp(flag, "--print-device")) { o->print_device = 1; continue; }
        static const char *const with_value[] = {"--batch", "--seqlen", "--seqlen-k", "--heads", "--heads-kv",
                                                 "--hdim", "--iters", "--warmup", "--check-rows", "--softcap",
                                                 "--scale", "--seed", "--window", "--dtype", "--device"};
        int known = 0;
        for (size_t i = 0; i < sizeof with_value / sizeof with_value[0]; i++) known |= !strcmp(flag, with_value[i]);
        if (!known) return bad_usage("unknown option '%s'", flag);
        if (!val) {
            if (a + 1 >= argc) return bad_usage("%s needs a value", flag);
            val = argv[++a];
        }
        const long BIG = 1L << 30;
        int ok = 1;
        if (!strcmp(flag, "--batch")) ok = parse_int(val, 1, BIG, &o->batch);
        else if (!strcmp(flag, "--seqlen")) ok = parse_int(val, 1, BIG, &o->seqlen);
        else if (!strcmp(flag, "--seqlen-k")) ok = parse_int(val, 1, BIG, &o->seqlen_k);
        else if (!strcmp(flag, "--heads")) ok = parse_int(val, 1, BIG, &o->heads);
        else if (!strcmp(flag, "--heads-kv")) ok = parse_int(val, 1, BIG, &o->heads_kv);
        else if (!strcmp(flag, "--hdim")) ok = parse_int(val, 1, BIG, &o->hdim);
        else if (!strcmp(flag, "--iters")) ok = parse_int(val, 1, BIG, &o->iters);
        else if (!strcmp(flag, "--warmup")) ok = parse_int(val, 0, BIG, &o->warmup);
        else if (!strcmp(flag, "--check-rows")) ok = parse_int(val, 0, BIG, &o->check_rows);
        else if (!strcmp(flag, "--softcap")) ok = parse_double(val, &o->softcap) && o->softcap >= 0;
        else if (!strcmp(flag, "--scale")) ok = parse_double(val, &o->scale) && o->scale > 0;
        else if (!strcmp(flag, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(val, &end, 0);
            ok = !errno && end != val && !*end;
        } else if (!strcmp(flag, "--window")) {
            char *comma = strchr(val, ',');
            if (!comma) ok = 0;
            else {
                *comma = '\0';
                ok = parse_int(val, -1, INT32_MAX, &o->window_left) && parse_int(comma + 1, -1, INT32_MAX, &o->window_right);
                *comma = ',';
            }
        } else if (!strcmp(flag, "--dtype")) {
            if (!strcmp(val, "bf16")) o->dtype = FA3C_DTYPE_BF16;
            else if (!strcmp(val, "fp16")) o->dtype = FA3C_DTYPE_FP16;
            else if (!strcmp(val, "fp32")) o->dtype = FA3C_DTYPE_FP32;
            else if (!strcmp(val, "e4m3")) o->dtype = FA3C_DTYPE_E4M3;
            else ok = 0;
        } else if (!strcmp(flag, "--device")) {
            if (!strcmp(val, "auto")) o->device = DEV_AUTO;
            else if (!strcmp(val, "cpu")) o->device = DEV_CPU;
            else if (!strcmp(val, "cuda")) o->device = DEV_CUDA;
            else if (!strcmp(val, "reference")) o->device = DEV_REFERENCE;
            else ok = 0;
        } else
            return bad_usage("unknown option '%s'", flag);
        if (!ok) return bad_usage("bad value '%s' for %s", val, flag);
    }
    if (!o->seqlen_k) o->seqlen_k = o->seqlen;
    if (!o->heads_kv) o->heads_kv = o->heads;
    if (o->heads % o->heads_kv) return bad_usage("--heads (%d) must be a multiple of --heads-kv (%d)", o->heads, o->heads_kv);
    if (o->backward && o->dtype == FA3C_DTYPE_E4M3) return bad_usage("--dtype e4m3 has no backward");
    return 0;
}

/* ---- progress on stderr ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double t_start, t_last_note;

static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[fa3c-run %7.1fs] ", now_s() - t_start);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    t_last_note = now_s();
}

/* For long loops: a line every few seconds, not every step. */
static void progress(const char *what, int64_t done, int64_t total) {
    if (now_s() - t_last_note >= 3.0) note("%s: %lld/%lld", what, (long long)done, (long long)total);
}

/* ---- random inputs ---- */

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_normal(void) {
    double u1 = ((rng_next() >> 11) + 0.5) * 0x1p-53, u2 = (rng_next() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* n N(0,1) values stored in dt, and the stored values as exact floats. */
static void fill_random(void *buf, float *exact, fa3c_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        elem_store(buf, dt, i, (float)rng_normal());
        exact[i] = elem_load(buf, dt, i);
    }
}

/* ---- the run ---- */

/* Host buffers and, on cuda, their device twins. */
typedef struct buffer {
    void *host, *dev;
    size_t bytes;
} buffer;

static int on_device;

static int buf_alloc(buffer *b, size_t bytes) {
    b->bytes = bytes;
    b->dev = NULL;
    b->host = malloc(bytes ? bytes : 1);
    if (!b->host) return 0;
    if (on_device && !(b->dev = dm_alloc(bytes))) return 0;
    return 1;
}

static void *buf_ptr(const buffer *b) { return on_device ? b->dev : b->host; }

static int buf_upload(buffer *b) { return !on_device || dm_upload(b->dev, b->host, b->bytes) == 0; }
static int buf_download(buffer *b) { return !on_device || dm_download(b->host, b->dev, b->bytes) == 0; }

/* All-ones bytes are NaN in every dtype: unwritten output shows up in the scan. */
static int buf_poison(buffer *b) {
    memset(b->host, 0xff, b->bytes);
    return !on_device || dm_fill(b->dev, 0xff, b->bytes) == 0;
}

static void buf_free(buffer *b) {
    free(b->host);
    if (b->dev) dm_free(b->dev);
}

static int64_t count_nonfinite(const void *buf, fa3c_dtype dt, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += !isfinite(elem_load(buf, dt, i));
    return c;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static fa3c_tensor bshd(void *data, int s, int h, int d) {
    fa3c_tensor t = {data, {(int64_t)s * h * d, (int64_t)h * d, d, 1}};
    return t;
}

static const char *dtype_str(fa3c_dtype dt) {
    return dt == FA3C_DTYPE_FP32 ? "fp32" : dt == FA3C_DTYPE_FP16 ? "fp16" : dt == FA3C_DTYPE_BF16 ? "bf16" : "e4m3";
}

/* One forward or backward call, timed in ms (CUDA events on the GPU). */
static fa3c_status timed_call(const fa3c_fwd_params *fp, const fa3c_bwd_params *bp, double *ms) {
    double t0 = now_s();
    if (on_device && dm_timer_start() != 0) return FA3C_STATUS_CUDA_ERROR;
    fa3c_status s = bp ? fa3c_bwd(bp, NULL) : fa3c_fwd(fp, NULL);
    if (on_device) {
        double dev_ms = dm_timer_stop_ms();
        if (s == FA3C_STATUS_OK && dev_ms < 0) {
            fprintf(stderr, "fa3c-run: CUDA: %s\n", dm_error());
            return FA3C_STATUS_CUDA_ERROR;
        }
        *ms = dev_ms;
    } else
        *ms = (now_s() - t0) * 1e3;
    return s;
}

static int report_stats(const char *name, const rc_stats *st, fa3c_dtype dt, int is_lse) {
    double bound;
    int pass = rc_pass(st, dt, is_lse, &bound);
    printf("%-5s max err %.3e  rel l2 %.3e  naive %s err %.3e  bound %.3e  %s\n", name, st->max_err, rc_rel_l2(st),
           is_lse ? "fp32" : dtype_str(dt), st->naive_err, bound, pass ? "ok" : "FAIL");
    return pass;
}

static int fail(const char *what, fa3c_status s) {
    fprintf(stderr, "fa3c-run: %s: %s: %s\n", what, fa3c_status_string(s), fa3c_last_error());
    return 1;
}

int main(int argc, char **argv) {
    options o;
    int help, rc = parse_args(argc, argv, &o, &help);
    if (rc || help) return rc;
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep results and progress lines in order */
    t_start = t_last_note = now_s();
    rng_state = o.seed;

    /* Backend. */
    int cuda_ok = dm_compiled() && fa3c_cuda_available();
    if (o.print_device) {
        printf("%s\n", cuda_ok ? "cuda" : "cpu");
        return 0;
    }
    if (o.device == DEV_CUDA && !cuda_ok) {
        fprintf(stderr, "fa3c-run: --device cuda: %s\n",
                !dm_compiled() ? "fa3c-run was built without the CUDA runtime"
                               : "no usable sm_90 GPU (fa3c_cuda_available() is 0)");
        return 1;
    }
    on_device = o.device == DEV_CUDA || (o.device == DEV_AUTO && cuda_ok);
    fa3c_backend backend = on_device ? FA3C_BACKEND_CUDA
                         : o.device == DEV_REFERENCE ? FA3C_BACKEND_CPU_REFERENCE : FA3C_BACKEND_CPU;
    const char *backend_name = on_device ? "cuda" : o.device == DEV_REFERENCE ? "cpu-reference" : "cpu";
    if (o.iters < 0) o.iters = on_device ? 20 : 3;
    if (o.warmup < 0) o.warmup = on_device ? 3 : 0;

    fa3c_dtype dt = o.dtype, out_dt = elem_out_dtype(dt);
    int b = o.batch, sq = o.seqlen, sk = o.seqlen_k, hq = o.heads, hkv = o.heads_kv, d = o.hdim;
    printf("fa3c-run %s: %s %s batch %d seqlen_q %d seqlen_k %d heads %d/%d hdim %d causal %d window (%d,%d) "
           "softcap %g, %s backend\n",
           fa3c_version(), o.backward ? "backward" : "forward", dtype_str(dt), b, sq, sk, hq, hkv, d, o.causal,
           o.window_left, o.window_right, o.softcap, backend_name);

    int64_t nq = (int64_t)b * sq * hq * d, nk = (int64_t)b * sk * hkv * d, nl = (int64_t)b * hq * sq;
    int es = elem_size(dt), os = elem_size(out_dt);
    buffer q, k, v, out, lse, dout = {0}, dq = {0}, dk = {0}, dv = {0};
    float *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4), *dof = NULL, *outf = NULL;
    int ok = qf && kf && vf && buf_alloc(&q, nq * es) && buf_alloc(&k, nk * es) && buf_alloc(&v, nk * es) &&
             buf_alloc(&out, nq * os) && buf_alloc(&lse, nl * 4);
    if (ok && o.backward)
        ok = (dof = malloc(nq * 4)) && (outf = malloc(nq * 4)) && buf_alloc(&dout, nq * es) &&
             buf_alloc(&dq, nq * es) && buf_alloc(&dk, nk * es) && buf_alloc(&dv, nk * es);
    if (!ok) {
        fprintf(stderr, "fa3c-run: out of memory%s%s\n", on_device ? " (device: " : "", on_device ? dm_error() : "");
        if (on_device) fputs(")\n", stderr);
        return 1;
    }
    note("generating %.1f M random inputs", (double)(nq + 2 * nk + (o.backward ? nq : 0)) / 1e6);
    fill_random(q.host, qf, dt, nq);
    fill_random(k.host, kf, dt, nk);
    fill_random(v.host, vf, dt, nk);
    if (o.backward) fill_random(dout.host, dof, dt, nq);
    if (!buf_upload(&q) || !buf_upload(&k) || !buf_upload(&v) || (o.backward && !buf_upload(&dout))) {
        fprintf(stderr, "fa3c-run: copying inputs to the device: %s\n", dm_error());
        return 1;
    }

    fa3c_fwd_params fp;
    fa3c_fwd_params_init(&fp);
    fa3c_problem *pr = &fp.problem;
    pr->dtype = dt;
    pr->batch = b;
    pr->seqlen_q = sq;
    pr->seqlen_k = sk;
    pr->heads_q = hq;
    pr->heads_kv = hkv;
    pr->headdim = d;
    pr->softmax_scale = (float)o.scale;
    pr->causal = o.causal;
    pr->window_left = o.window_left;
    pr->window_right = o.window_right;
    pr->softcap = (float)o.softcap;
    fp.q = bshd(buf_ptr(&q), sq, hq, d);
    fp.k = bshd(buf_ptr(&k), sk, hkv, d);
    fp.v = bshd(buf_ptr(&v), sk, hkv, d);
    fp.out = bshd(buf_ptr(&out), sq, hq, d);
    fp.lse = buf_ptr(&lse);
    fp.backend = backend;

    fa3c_bwd_params bp;
    fa3c_bwd_params_init(&bp);
    if (o.backward) {
        bp.problem = *pr;
        bp.q = fp.q;
        bp.k = fp.k;
        bp.v = fp.v;
        bp.out = fp.out;
        bp.dout = bshd(buf_ptr(&dout), sq, hq, d);
        bp.lse = fp.lse;
        bp.dq = bshd(buf_ptr(&dq), sq, hq, d);
        bp.dk = bshd(buf_ptr(&dk), sk, hkv, d);
        bp.dv = bshd(buf_ptr(&dv), sk, hkv, d);
        bp.backend = backend;
    }

    /* Refuse early, with the library's own message. */
    fa3c_status s = fa3c_fwd_check(&fp);
    if (s != FA3C_STATUS_OK) return fail("fa3c_fwd_check", s);
    if (o.backward && (s = fa3c_bwd_check(&bp)) != FA3C_STATUS_OK) return fail("fa3c_bwd_check", s);

    /* Forward once (the backward's inputs, and the forward's check), then time. */
    if (!buf_poison(&out) || !buf_poison(&lse)) return fail("poisoning outputs", FA3C_STATUS_CUDA_ERROR);
    double *times = malloc(sizeof(double) * (o.iters + o.warmup + 1));
    const fa3c_bwd_params *timed_bwd = o.backward ? &bp : NULL;
    int first_is_timed = !o.backward && o.warmup == 0; /* on the CPU the first forward counts */
    note("forward%s", first_is_timed ? " (iteration 1)" : "");
    if ((s = timed_call(&fp, NULL, &times[0])) != FA3C_STATUS_OK) return fail("fa3c_fwd", s);
    if (!buf_download(&out) || !buf_download(&lse)) return fail("copying outputs to the host", FA3C_STATUS_CUDA_ERROR);
    if (o.backward)
        for (int64_t i = 0; i < nq; i++) outf[i] = elem_load(out.host, dt, i);
    if (o.backward && (!buf_poison(&dq) || !buf_poison(&dk) || !buf_poison(&dv)))
        return fail("poisoning outputs", FA3C_STATUS_CUDA_ERROR);

    int n_timed = 0;
    if (first_is_timed) n_timed = 1;
    for (int it = first_is_timed ? 1 : 0; it < o.warmup + o.iters; it++) {
        double ms;
        if ((s = timed_call(&fp, timed_bwd, &ms)) != FA3C_STATUS_OK) return fail(o.backward ? "fa3c_bwd" : "fa3c_fwd", s);
        if (it >= o.warmup) times[n_timed++] = ms;
        if (!on_device && (ms > 2000 || now_s() - t_last_note > 3))
            note("%s iteration %d/%d: %.1f ms", o.backward ? "backward" : "forward", it + 1, o.warmup + o.iters, ms);
    }
    qsort(times, n_timed, sizeof(double), cmp_double);
    double med = n_timed % 2 ? times[n_timed / 2] : 0.5 * (times[n_timed / 2 - 1] + times[n_timed / 2]);
    if (o.backward && (!buf_download(&dq) || !buf_download(&dk) || !buf_download(&dv)))
        return fail("copying gradients to the host", FA3C_STATUS_CUDA_ERROR);

    rc_problem rp = {.dtype = dt, .batch = b, .sq = sq, .sk = sk, .hq = hq, .hkv = hkv, .d = d,
                     .scale = o.scale > 0 ? (double)(float)o.scale : (double)(1.0f / sqrtf((float)d)),
                     .softcap = (double)(float)o.softcap, .causal = o.causal, .window_left = o.window_left,
                     .window_right = o.window_right, .q = qf, .k = kf, .v = vf, .dout = dof, .out = outf,
                     .lse = lse.host};
    double flops = 4.0 * b * hq * d * (double)rc_visible_pairs(&rp) * (o.backward ? 2.5 : 1.0);
    printf("time  %.3f ms (median of %d)\n", med, n_timed);
    printf("perf  %.3f TFLOPS\n", med > 0 ? flops / (med * 1e-3) / 1e12 : 0.0);

    /* Outputs were poisoned with NaN: any non-finite value is unwritten or wrong. */
    int pass = 1;
    int64_t bad = count_nonfinite(out.host, out_dt, nq);
    if (bad) { printf("out   %lld non-finite elements (unwritten or overflow)\n", (long long)bad); pass = 0; }
    int64_t bad_lse = 0;
    for (int64_t i = 0; i < nl; i++) bad_lse += isnan(((float *)lse.host)[i]) || ((float *)lse.host)[i] == INFINITY;
    if (bad_lse) { printf("lse   %lld NaN/+inf values\n", (long long)bad_lse); pass = 0; }
    if (o.backward) {
        buffer *g[3] = {&dq, &dk, &dv};
        const char *gn[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) {
            int64_t nb = count_nonfinite(g[i]->host, dt, i ? nk : nq);
            if (nb) { printf("%-5s %lld non-finite elements\n", gn[i], (long long)nb); pass = 0; }
        }
    }

    if (o.check_rows > 0) {
        int *qrows = malloc(sizeof(int) * (sq < o.check_rows ? sq : o.check_rows));
        int *krows = malloc(sizeof(int) * (sk < o.check_rows ? sk : o.check_rows));
        int nqr = rc_spread(o.check_rows, sq, qrows), nkr = rc_spread(o.check_rows, sk, krows);
        note("checking %d query rows x %d (batch, head) pairs against float64", nqr, b * hq);
        rc_stats so, sl;
        rc_check_fwd(&rp, qrows, nqr, out.host, out_dt, lse.host, &so, &sl, progress);
        pass &= report_stats("out", &so, out_dt, 0);
        pass &= report_stats("lse", &sl, out_dt, 1);
        if (o.backward) {
            note("checking gradients: %d query rows, %d key rows", nqr, nkr);
            rc_stats s1, s2, s3;
            rc_check_bwd(&rp, qrows, nqr, krows, nkr, dq.host, dk.host, dv.host, &s1, &s2, &s3, progress);
            pass &= report_stats("dq", &s1, dt, 0);
            pass &= report_stats("dk", &s2, dt, 0);
            pass &= report_stats("dv", &s3, dt, 0);
        }
        free(qrows);
        free(krows);
    } else
        printf("check skipped (--check-rows 0)\n");
    printf("%s\n", pass ? "PASS" : "FAIL");

    buffer *all[] = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 9; i++)
        if (all[i]->host) buf_free(all[i]);
    free(qf); free(kf); free(vf); free(dof); free(outf); free(times);
    return pass ? 0 : 1;
}
