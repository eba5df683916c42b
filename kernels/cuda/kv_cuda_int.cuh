/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_int.cuh — private helpers of the CUDA backend's .cu files: the
 * CUDA error -> KV_E* mapping, the head_dim dispatch switch, the attention
 * kernel's row mapping and tile building (host and device functions, so
 * that tests/cuda/test_cuda_tiles.cu checks them on the host), and warp
 * reductions. Included only by .cu files (C++).
 */
#ifndef KV_CUDA_INT_CUH
#define KV_CUDA_INT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kv_cuda.h"
#include "formats/kv_fmt_codec.h"

/* KV_ENOMEM for allocation failures, KV_ENOTSUP when there is no usable
 * device or driver, KV_EIO for every other CUDA error. */
static inline int kv_cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
        return KV_ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
        return KV_ENOTSUP;
    default:
        return KV_EIO;
    }
}

/* The head dims kernels are instantiated for. The switch runs `body` with
 * the compile-time constant D, and makes the enclosing function return
 * KV_ENOTSUP for any other d. Add a case here (and to kv_cuda_head_dim_ok,
 * which uses this switch) to instantiate another. */
#define KV_CUDA_DISPATCH_HEAD_DIM(d, D, ...)                                \
    switch (d) {                                                            \
    case 64: {                                                              \
        constexpr uint32_t D = 64;                                          \
        __VA_ARGS__                                                         \
    } break;                                                                \
    case 128: {                                                             \
        constexpr uint32_t D = 128;                                         \
        __VA_ARGS__                                                         \
    } break;                                                                \
    default:                                                                \
        return KV_ENOTSUP;                                                  \
    }

/* Stage slots (pages per tile) for pages of pb bytes. */
static inline __host__ __device__ uint32_t kv_cuda_slots(uint32_t pb)
{
    uint32_t n = KV_CUDA_STAGE_BYTES / pb;
    return n < 1 ? 1 : n > KV_CUDA_MAX_SLOTS ? KV_CUDA_MAX_SLOTS : n;
}

/* ---- attention: rows, tiles (host and device; tests/cuda/test_cuda_tiles.cu
 * runs them on the host) ------------------------------------------------- */

/* Row r of list `list`: its index in q/out, in rows of head_dim. */
static inline __host__ __device__ size_t
kv_cuda_row_index(const kv_cuda_attn_args_t &a, uint32_t list, uint32_t r)
{
    const uint32_t G = a.n_q_heads / a.n_kv_heads;
    if (a.mode == KV_CUDA_DECODE) {
        const uint32_t b = list / a.n_kv_heads, h = list % a.n_kv_heads;
        return (size_t)b * a.n_q_heads + (size_t)h * G + r;
    }
    return (size_t)(r / G) * a.n_q_heads + (size_t)list * G + r % G;
}

/* Row r of a list of len tokens sees tokens [0, limit). */
static inline __host__ __device__ uint32_t
kv_cuda_row_limit(const kv_cuda_attn_args_t &a, uint32_t r, uint32_t len)
{
    if (a.mode == KV_CUDA_DECODE)
        return len;
    const uint32_t G = a.n_q_heads / a.n_kv_heads;
    return len - a.n_new + r / G + 1;
}

#define KV_CUDA_NO_WIN 0xffffffffu

/* One page's part of a tile. */
typedef struct kv_cuda_slot {
    uint32_t page, fmt, var; /* entry: page index, format, variant       */
    uint32_t t0, k;          /* tokens [t0, t0 + k) of the page          */
    uint32_t start;          /* tile position of token t0                */
} kv_cuda_slot_t;

/* Up to KV_CUDA_TILE tokens over up to KV_CUDA_MAX_SLOTS pages. */
typedef struct kv_cuda_tile {
    kv_cuda_slot_t s[KV_CUDA_MAX_SLOTS];
    uint32_t ns, ntok;              /* slots used, tokens in the tile   */
    uint8_t tok_slot[KV_CUDA_TILE]; /* slot of each tile token          */
} kv_cuda_tile_t;

/* Where the next tile starts, and which entries the window holds. */
typedef struct kv_cuda_cursor {
    uint32_t pe, off; /* entry and token in it                        */
    uint32_t rem;     /* tokens of the range not yet in a tile        */
    uint32_t win0;    /* entry in window slot 0, or KV_CUDA_NO_WIN    */
} kv_cuda_cursor_t;

/* 1 if the window (KV_CUDA_ENT_WIN entries from win0) may not hold every
 * entry the next tile reads (at most ns_max from pe). */
static inline __host__ __device__ int
kv_cuda_window_stale(const kv_cuda_cursor_t *c, uint32_t ns_max)
{
    return c->rem > 0 && (c->win0 == KV_CUDA_NO_WIN || c->pe < c->win0 ||
                          c->pe + ns_max > c->win0 + KV_CUDA_ENT_WIN);
}

/* The next tile into *t from the window win (entries win0 ..), advancing
 * the cursor: consecutive tokens, at most KV_CUDA_TILE of them over at most
 * ns_max pages; t->ntok 0 when the range is done. */
static inline __host__ __device__ void
kv_cuda_build_tile(kv_cuda_cursor_t *cur, const kv_cuda_ent_t *win,
                   uint32_t ns_max, kv_cuda_tile_t *t)
{
    kv_cuda_cursor_t c = *cur;
    uint32_t tok = 0, ns = 0;
    while (ns < ns_max && tok < KV_CUDA_TILE && c.rem > 0) {
        const kv_cuda_ent_t e = win[c.pe - c.win0];
        const uint32_t n = KV_CUDA_ENT_N(e.meta);
        uint32_t k = n - c.off;
        k = k < KV_CUDA_TILE - tok ? k : KV_CUDA_TILE - tok;
        k = k < c.rem ? k : c.rem;
        t->s[ns].page = e.page;
        t->s[ns].fmt = KV_CUDA_ENT_FMT(e.meta);
        t->s[ns].var = KV_CUDA_ENT_VAR(e.meta);
        t->s[ns].t0 = c.off;
        t->s[ns].k = k;
        t->s[ns].start = tok;
        for (uint32_t x = 0; x < k; x++)
            t->tok_slot[tok + x] = (uint8_t)ns;
        tok += k;
        c.rem -= k;
        c.off += k;
        ns++;
        if (c.off == n) {
            c.pe++;
            c.off = 0;
        }
    }
    t->ns = ns;
    t->ntok = tok;
    *cur = c;
}

/* A launch and a dynamic shared memory array: the CUDA forms under nvcc;
 * in the CPU emulation build (kernels/cuda/emu/kv_emu.h, docs/gpu.md) the
 * same kernels compiled as host C++ launch through the emulator and get
 * the block's dynamic shared memory from it. These two macros are the only
 * place the kernel sources differ between the two builds. */
#if defined(__CUDACC__)
#define KV_CUDA_LAUNCH(kern, grid, block, smem, stream, ...)                \
    kern<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define KV_CUDA_DYN_SMEM(type, name) extern __shared__ __align__(16) type name[]
#else
#define KV_CUDA_LAUNCH(kern, grid, block, smem, stream, ...)                \
    (void)kv_emu_launch(kern, dim3(grid), dim3(block), (smem), (stream),   \
                        __VA_ARGS__)
#define KV_CUDA_DYN_SMEM(type, name) type *const name = (type *)kv_emu_dyn_smem()
#endif

static __device__ __forceinline__ float kv_cuda_warp_max(float x)
{
    for (int o = 16; o > 0; o /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

static __device__ __forceinline__ float kv_cuda_warp_sum(float x)
{
    for (int o = 16; o > 0; o /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

#endif /* KV_CUDA_INT_CUH */
