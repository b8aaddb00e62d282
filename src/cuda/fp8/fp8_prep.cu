// The fp8 forward's V transpose (fwd_fp8_sm90.cuh reads Vᵀ): e4m3 wgmma
// takes B K-major, so O += P·V needs each V column's keys contiguous. Tiles
// of 32 keys x 32 columns go through smem, so that both the reads (a key's
// 32 bytes) and the writes (a column's 32 keys) are whole 32-byte sectors;
// each group of 32 keys is written in the order of P's register fragments
// (fa3c_fp8_key_of_slot), zeros past seqlen_k.
#include <cuda_runtime.h>
#include "fp8_prep.h"
#include "backend.h"

enum { TILE = 32, ROWS_PER_PASS = 8 };   // a 32 x 8 block: each thread moves 4 bytes in and 4 out

// Grid-stride over the tiles of Vᵀ (batch, heads_kv, headdim, keys_pad):
// tile = ((batch · heads_kv + head) · (headdim / 32) + column tile) · (keys_pad / 32) + key tile.
__global__ void __launch_bounds__(TILE * ROWS_PER_PASS) fp8_transpose_v_kernel(const fa3c_fp8_vt_params p) {
    __shared__ uint8_t tile[TILE][TILE + 4];   // [key][column]; the pad spreads a column's bytes over banks
    const int key_tiles = p.keys_pad / TILE, col_tiles = p.headdim / TILE;
    const int64_t tiles = (int64_t)p.batch * p.heads_kv * col_tiles * key_tiles;
    const int x = threadIdx.x % TILE, y = threadIdx.x / TILE;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int key0 = (int)(t % key_tiles) * TILE;
        const int64_t rest = t / key_tiles;
        const int col0 = (int)(rest % col_tiles) * TILE;
        const int64_t bh = rest / col_tiles;   // batch * heads_kv + head
        const int head = (int)(bh % p.heads_kv), batch = (int)(bh / p.heads_kv);
        // In: keys key0.., columns col0 + x (a key's 32 bytes per row of the block).
        for (int r = y; r < TILE; r += ROWS_PER_PASS) {
            const int key = key0 + r;
            tile[r][x] = key < p.seqlen_k ? p.v[batch * p.v_stride[0] + (int64_t)key * p.v_stride[1] +
                                                head * p.v_stride[2] + col0 + x]
                                          : (uint8_t)0;
        }
        __syncthreads();
        // Out: column col0 + r of Vᵀ, slots key0 + x holding their keys in fragment order.
        for (int r = y; r < TILE; r += ROWS_PER_PASS)
            p.vt[(bh * p.headdim + col0 + r) * (int64_t)p.keys_pad + key0 + x] = tile[fa3c_fp8_key_of_slot(x)][r];
        __syncthreads();
    }
}

extern "C" fa3c_status fa3c_fp8_transpose_v(const fa3c_fp8_vt_params *p, void *stream) {
    const int64_t tiles = (int64_t)p->batch * p->heads_kv * (p->headdim / TILE) * (p->keys_pad / TILE);
    const unsigned blocks = (unsigned)(tiles < (1 << 20) ? tiles : (1 << 20));
    fp8_transpose_v_kernel<<<blocks, TILE * ROWS_PER_PASS, 0, (cudaStream_t)stream>>>(*p);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FA3C_STATUS_OK
                            : fa3c_error(FA3C_STATUS_CUDA_ERROR, "fp8 forward: V transpose launch failed: %s",
                                         cudaGetErrorString(e));
}
