// Small inline-PTX helpers for sm_90a. Each is a few lines with a one-line
// contract and the PTX ISA section it implements, so kernels read like the
// algorithm. Shared-memory addresses are 32-bit .shared::cta addresses
// (smem_addr()).
#pragma once
#include <stdint.h>
#include <stdio.h>   // device printf in the debug hang trap
#include <cuda.h>   // CUtensorMap (types only)

#define FA3C_DEVICE static __device__ __forceinline__
// Pure arithmetic that host tests call too (scheduler.cuh, mask.cuh).
#define FA3C_HOST_DEVICE static __host__ __device__ __forceinline__

FA3C_DEVICE uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// The same value, made opaque to the compiler, so that what is derived from
// it is computed where it is used instead of hoisted out of a loop (where it
// would hold registers across the loop; fwd_consumer.cuh, gemm_qk).
FA3C_DEVICE uint32_t opaque_u32(uint32_t x) {
    asm volatile("mov.b32 %0, %1;" : "=r"(x) : "r"(x));
    return x;
}

// ---- mbarrier (PTX ISA 9.7.13.15) -------------------------------------------

// Initialise a barrier that completes a phase after `count` arrivals.
FA3C_DEVICE void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

// Make barrier initialisation visible to the async proxy (TMA) and other threads.
FA3C_DEVICE void fence_barrier_init(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrive once and add `bytes` to the transaction count the phase waits for.
FA3C_DEVICE void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// Arrive once (release semantics: earlier smem reads/writes are ordered before).
FA3C_DEVICE void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// 1 when the phase with the given parity has completed. try_wait may
// suspend the thread for a while first; test_wait returns at once.
#define FA3C_MBAR_PARITY_ASM(op)                                   \
    "{\n .reg .pred p;\n"                                          \
    " mbarrier." op ".parity.shared::cta.b64 p, [%1], %2;\n"       \
    " selp.u32 %0, 1, 0, p;\n}"
FA3C_DEVICE uint32_t mbar_try_wait_parity(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    asm volatile(FA3C_MBAR_PARITY_ASM("try_wait") : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    return done;
}
FA3C_DEVICE uint32_t mbar_test_wait_parity(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    asm volatile(FA3C_MBAR_PARITY_ASM("test_wait") : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    return done;
}
#undef FA3C_MBAR_PARITY_ASM

// Spin until `ready` holds. With FA3C_DEBUG_HANGS a wait that spins too
// long prints where it is (printf-style `...`) and traps: a deadlock costs
// seconds, not the whole call.
#ifdef FA3C_DEBUG_HANGS
#define FA3C_SPIN_UNTIL(ready, ...)                  \
    do {                                             \
        long long fa3c_spins_ = 0;                   \
        while (!(ready)) {                           \
            if (++fa3c_spins_ == (1ll << 26)) {      \
                printf(__VA_ARGS__);                 \
                __trap();                            \
            }                                        \
        }                                            \
    } while (0)
#else
#define FA3C_SPIN_UNTIL(ready, ...) \
    do {                            \
        while (!(ready)) {          \
        }                           \
    } while (0)
#endif

// Block until the phase with `parity` completes (FA3C_SPIN_UNTIL's hang trap).
FA3C_DEVICE void mbar_wait_parity(uint64_t *bar, uint32_t parity) {
    FA3C_SPIN_UNTIL(mbar_try_wait_parity(bar, parity),
                    "fa3c: mbarrier wait timed out: block (%d,%d,%d) thread %d bar %p parity %u\n", blockIdx.x,
                    blockIdx.y, blockIdx.z, threadIdx.x, bar, parity);
}

// ---- TMA: bulk tensor copies (PTX ISA 9.7.9.25) -----------------------------

// Hint the tensor map into the cache before the first copy uses it.
FA3C_DEVICE void tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}

// Load a 4-D box at coordinates (c0 innermost) into smem; completes on `bar`.
FA3C_DEVICE void tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar,
                             int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];"
        ::"r"(smem_addr(dst)), "l"((uint64_t)map), "r"(smem_addr(bar)),
          "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

FA3C_DEVICE void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];"
        ::"r"(smem_addr(dst)), "l"((uint64_t)map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
        : "memory");
}

FA3C_DEVICE void tma_load_5d(void *dst, const CUtensorMap *map, uint64_t *bar,
                             int c0, int c1, int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];"
        ::"r"(smem_addr(dst)), "l"((uint64_t)map), "r"(smem_addr(bar)),
          "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

// The same box into the same smem offset of every CTA of the cluster in
// cta_mask (bit r: rank r); each of them counts the bytes landing in its
// smem on its own barrier at bar's offset (PTX ISA 9.7.9.25, .multicast::cluster).
FA3C_DEVICE void tma_load_4d_multicast(void *dst, const CUtensorMap *map, uint64_t *bar, uint16_t cta_mask,
                                       int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5, %6, %7}], [%2], %3;"
        ::"r"(smem_addr(dst)), "l"((uint64_t)map), "r"(smem_addr(bar)), "h"(cta_mask),
          "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Store a 4-D box from smem to global (bulk-group completion).
FA3C_DEVICE void tma_store_4d(const CUtensorMap *map, const void *src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
        ::"l"((uint64_t)map), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

FA3C_DEVICE void tma_store_5d(const CUtensorMap *map, const void *src, int c0, int c1, int c2, int c3, int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];"
        ::"l"((uint64_t)map), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

FA3C_DEVICE void tma_store_commit(void) { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Wait until the smem sources of all committed stores have been read.
FA3C_DEVICE void tma_store_wait_read(void) { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Wait until all committed stores are complete (before the CTA exits).
FA3C_DEVICE void tma_store_wait_all(void) { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Four 8x8 matrices of 16-bit elements from the registers of a warp to smem:
// register i of lane t holds row t / 4, columns 2 (t % 4) and +1 of matrix
// i (the wgmma accumulator layout), and lane t gives the address of row t % 8
// of matrix t / 8.
FA3C_DEVICE void stmatrix_x4(void *row_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(smem_addr(row_addr)), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// The same, each matrix stored transposed: lane t gives the address of
// memory row t % 8 of matrix t / 8, which receives column t % 8 of the
// registers' matrix (x4: four matrices; x2: two, addresses from lanes 0-15).
FA3C_DEVICE void stmatrix_x4_trans(void *row_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(smem_addr(row_addr)), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
FA3C_DEVICE void stmatrix_x2_trans(void *row_addr, uint32_t r0, uint32_t r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};"
                 ::"r"(smem_addr(row_addr)), "r"(r0), "r"(r1)
                 : "memory");
}

// Four 8x8 matrices of 16-bit elements from smem to the registers of a warp:
// lane t gives the address of row t % 8 of matrix t / 8, and register i of
// lane t receives row t / 4, columns 2 (t % 4) and +1 of matrix i.
FA3C_DEVICE void ldmatrix_x4(uint32_t r[4], const void *row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row_addr))
                 : "memory");
}

// Address of 16-byte unit `unit` of row `row` in a 16-bit tile stored as
// column chunks of `chunk_rows` rows x ROW_BYTES with the TMA/wgmma swizzle
// of that row width: 128 B rows (64 columns, 128-byte swizzle: address bits
// 7-9 into 4-6) or 64 B rows (32 columns, 64-byte swizzle: bits 7-8 into
// 4-5). Unit u is columns 8u..8u+7. Tiles are 1024-byte aligned.
template <int ROW_BYTES>
FA3C_DEVICE uint8_t *swizzled_unit(uint8_t *tile, int chunk_rows, int row, int unit) {
    static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "the 128- and 64-byte swizzles");
    enum { UNITS = ROW_BYTES / 16 };
    const int phase = ROW_BYTES == 128 ? row % 8 : (row / 2) % 4;
    return tile + (unit / UNITS) * chunk_rows * ROW_BYTES + row * ROW_BYTES + (((unit % UNITS) ^ phase) * 16);
}

// A warp's A fragment (rows row0..row0+15, columns k0..k0+15) of such a
// tile, for wgmma (register A) or mma.sync m16n8k16: a[0] rows 0-7 /
// columns 0-7, a[1] rows 8-15 / 0-7, a[2] rows 0-7 / 8-15, a[3] rows 8-15 /
// 8-15.
template <int ROW_BYTES>
FA3C_DEVICE void load_a_fragment(uint32_t a[4], const uint8_t *tile, int chunk_rows, int row0, int k0) {
    int lane = threadIdx.x % 32;
    int row = row0 + (lane % 8) + ((lane / 8) % 2) * 8;
    ldmatrix_x4(a, swizzled_unit<ROW_BYTES>((uint8_t *)tile, chunk_rows, row, k0 / 8 + lane / 16));
}

// B fragments of mma.sync m16n8k16 (".col": B stored as rows of N, K
// contiguous, as K is for S = Q·Kᵀ) for two n8 tiles: rows n0..n0+15,
// columns k0..k0+15 of such a tile. b[0], b[1]: rows n0..n0+7 (columns
// k0..+7, k0+8..+15); b[2], b[3]: rows n0+8..n0+15.
template <int ROW_BYTES>
FA3C_DEVICE void load_b_fragments_x2(uint32_t b[4], const uint8_t *tile, int chunk_rows, int n0, int k0) {
    int lane = threadIdx.x % 32;
    int row = n0 + (lane % 8) + (lane / 16) * 8;
    ldmatrix_x4(b, swizzled_unit<ROW_BYTES>((uint8_t *)tile, chunk_rows, row, k0 / 8 + (lane / 8) % 2));
}

// d(16 x 8, f32) += a(16 x 16) · b(16 x 8), 16-bit inputs (warp-level MMA;
// the accumulator layout is that of one n8 slice of a wgmma m64 accumulator
// for the warp's 16 rows).
template <int FP16>
FA3C_DEVICE void mma_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (FP16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Order this thread's generic-proxy smem writes before later async-proxy
// (TMA, wgmma) accesses; pair with a barrier.
FA3C_DEVICE void fence_proxy_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- warpgroup MMA bookkeeping (PTX ISA 9.7.15.6) ---------------------------

// Order register/smem accesses before the next wgmma.mma_async.
FA3C_DEVICE void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// Close the current group of issued wgmma operations.
FA3C_DEVICE void wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// Wait until at most N committed groups are still pending.
template <int N>
FA3C_DEVICE void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// A plain 32-bit shared store, as a volatile asm so it stays where it is.
FA3C_DEVICE void st_shared_f32(float *dst, float x) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_addr(dst)), "f"(x) : "memory");
}
FA3C_DEVICE void st_shared_f32x4(float *dst, float x, float y, float z, float w) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(dst)), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
}

// Loads at a 32-bit shared address (a generic pointer held two registers).
FA3C_DEVICE float2 ld_shared_f32x2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}
FA3C_DEVICE int ld_shared_s32(uint32_t addr) {
    int x;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(x) : "r"(addr) : "memory");
    return x;
}

FA3C_DEVICE uint4 ld_shared_u32x4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
                 : "memory");
    return v;
}

// 16 zero bytes at a 16-byte aligned shared address (PTX ISA 9.7.9.10, st).
FA3C_DEVICE void st_shared_zero16(uint32_t addr) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
}

// Keep the compiler from moving accumulator accesses across fences/waits.
FA3C_DEVICE void reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
FA3C_DEVICE void reg_fence(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

// Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1) for a tile whose rows
// of `row_bytes` (128 or 64) carry the matching TMA swizzle, atoms aligned to
// 8 rows (base offset 0). lbo: leading-dimension byte offset, sbo: stride
// byte offset.
FA3C_DEVICE uint64_t smem_desc_swizzled(uint32_t addr, uint32_t lbo, uint32_t sbo, int row_bytes) {
    uint64_t d = 0;
    d |= (uint64_t)((addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    d |= (uint64_t)(row_bytes == 128 ? 1 : 2) << 62;   // swizzle mode: 1 = 128B, 2 = 64B
    return d;
}

// The descriptor of the same tile `bytes` further on: the start address is
// the low 14 bits (in 16-byte units) and shared memory ends below 2^18 bytes,
// so the add never carries out of the field. One add per wgmma instead of
// rebuilding the descriptor.
FA3C_DEVICE uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + (bytes >> 4));
}

// The 128-byte case, as the step tests use it.
FA3C_DEVICE uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return smem_desc_swizzled(addr, lbo, sbo, 128);
}

// ---- warp specialisation (PTX ISA 9.7.17.1, 9.7.13.1) -----------------------

// Give up registers (producer) / claim them (consumers). Whole warpgroup.
template <int N>
FA3C_DEVICE void reg_dealloc(void) { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
FA3C_DEVICE void reg_alloc(void) { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

// Named barriers: wait until `count` threads have arrived at `id` (this one included).
FA3C_DEVICE void named_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
// Arrive at `id` without waiting.
FA3C_DEVICE void named_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// ---- thread-block clusters (PTX ISA: barrier.cluster, mapa) --------------------

// This CTA's rank in its cluster, and the cluster's index and count along x
// in the grid (special registers: nothing is held).
#define FA3C_SPECIAL_REG(name, reg)                                 \
    FA3C_DEVICE uint32_t name(void) {                               \
        uint32_t v;                                                 \
        asm volatile("mov.u32 %0, %%" reg ";" : "=r"(v));          \
        return v;                                                   \
    }
FA3C_SPECIAL_REG(cluster_cta_rank, "cluster_ctarank")
FA3C_SPECIAL_REG(cluster_id_x, "clusterid.x")
FA3C_SPECIAL_REG(cluster_count_x, "nclusterid.x")
#undef FA3C_SPECIAL_REG

// Every thread of the cluster that has not exited arrives and waits for the
// others; the CTAs' earlier smem writes (barrier inits) are visible after it.
// A CTA whose smem or barriers another CTA may still use must not exit before.
FA3C_DEVICE void cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// Arrive once on the mbarrier at bar's smem offset in the cluster's CTA of
// rank `cta` (this one included). The default .release.cta semantics: the
// consumers only signal that their reads of a slot (wgmma, waited for) are
// done; .release.cluster would put a GPU-wide memory barrier before every
// arrival (MEMBAR.ALL.GPU in the SASS).
FA3C_DEVICE void mbar_arrive_cluster(uint64_t *bar, uint32_t cta) {
    asm volatile(
        "{\n .reg .b32 remote;\n"
        " mapa.shared::cluster.u32 remote, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}"
        ::"r"(smem_addr(bar)), "r"(cta)
        : "memory");
}

// ---- flags between CTAs (the backward's dQ turns and first writes) ------------------

// *counter += value, after this thread's earlier writes are visible on the GPU
// (release at GPU scope: they reach whoever acquires a later value of *counter).
FA3C_DEVICE void red_release_gpu_add(int *counter, int value) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(value) : "memory");
}

FA3C_DEVICE void st_release_gpu(int *p, int value) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(value) : "memory");
}

// *p = desired if *p == expected; returns the old value, acquiring at GPU scope.
FA3C_DEVICE int atom_cas_acquire_gpu(int *p, int expected, int desired) {
    int old;
    asm volatile("atom.acquire.gpu.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(expected), "r"(desired)
                 : "memory");
    return old;
}

FA3C_DEVICE int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Spin until *counter >= target (acquire: the writes released before the
// increments that reached it are visible after), with FA3C_SPIN_UNTIL's hang trap.
FA3C_DEVICE void wait_counter_at_least(const int *counter, int target) {
    FA3C_SPIN_UNTIL(ld_acquire_gpu(counter) >= target,
                    "fa3c: counter wait timed out: block %d thread %d counter %p < %d\n", blockIdx.x, threadIdx.x,
                    counter, target);
}

// ---- atomics in global memory (PTX ISA 9.7.13.6, red) ---------------------------

// addr[0] += a, addr[1] += b as one relaxed GPU-scope reduction (addr
// 8-byte aligned; no value returned, so no round trip).
FA3C_DEVICE void red_add_f32x2(float *addr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(addr), "f"(a), "f"(b) : "memory");
}

// addr[0..3] += x, y, z, w (addr 16-byte aligned), as red_add_f32x2.
FA3C_DEVICE void red_add_f32x4(float *addr, float x, float y, float z, float w) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
}

// dst[0..bytes/4) += src[...] (fp32) by the bulk copy engine: smem to global,
// both 16-byte aligned, bytes a multiple of 16. Completion as for TMA stores
// (tma_store_commit, tma_store_wait_read / _all).
FA3C_DEVICE void bulk_reduce_add_f32(float *dst, const float *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}

// dst[0..bytes) = src[...] by the bulk copy engine, smem to global, as
// bulk_reduce_add_f32 (alignment, completion).
FA3C_DEVICE void bulk_store(void *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
                 "r"(bytes)
                 : "memory");
}

// An L2 policy under which the lines an access touches are evicted after
// normal ones (createpolicy, the whole access), for the cache_hint forms.
FA3C_DEVICE uint64_t l2_policy_evict_last(void) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// bulk_reduce_add_f32 and bulk_store with an L2 policy (l2_policy_evict_last).
FA3C_DEVICE void bulk_reduce_add_f32_hint(float *dst, const float *src, uint32_t bytes, uint64_t policy) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;" ::"l"(
                     dst),
                 "r"(smem_addr(src)), "r"(bytes), "l"(policy)
                 : "memory");
}
FA3C_DEVICE void bulk_store_hint(void *dst, const void *src, uint32_t bytes, uint64_t policy) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes), "l"(policy)
                 : "memory");
}

// Order this thread's async-proxy global accesses (completed bulk copies)
// with its generic-proxy ones, both ways.
FA3C_DEVICE void fence_proxy_async_global(void) { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// ---- arithmetic --------------------------------------------------------------

// 2^x, flushing denormals (MUFU.EX2). ex2(-inf) = 0.
FA3C_DEVICE float ex2f(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 1/x and log2(x) in one MUFU op each (about 1 ulp; the IEEE versions add a
// slow path with branches, which showed in the epilogue's stall samples).
FA3C_DEVICE float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
FA3C_DEVICE float lg2_approx(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

FA3C_DEVICE float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two floats -> one register of two 16-bit values, `lo` in the low half.
FA3C_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FA3C_DEVICE uint32_t pack_f16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// Either, by the kernel's 16-bit type (FP16: 1 = fp16, 0 = bf16).
template <int FP16>
FA3C_DEVICE uint32_t pack2(float lo, float hi) {
    return FP16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}
// pack_f16x2's inverse.
FA3C_DEVICE float2 unpack_f16x2(uint32_t x) {
    float lo, hi;
    asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
        : "=f"(lo), "=f"(hi) : "r"(x));
    return make_float2(lo, hi);
}
