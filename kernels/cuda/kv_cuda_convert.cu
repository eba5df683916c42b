/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_convert.cu — the conversion kernel: tokens of pages of any format
 * (and variant) -> FP16, INT4 or INT2 pages, INT plain or rotated (stored
 * variant 1, formats/kv_fmt_rot.h). This is the quantization of the FP16
 * residual (KIVI), and, with FP16 destinations, the compaction gather
 * (kept tokens into fresh pages) and any decode to FP16.
 *
 * One block per 16 tokens (an INT group): the block decodes the tokens' K
 * and V to FP32 in shared memory with kv_fmt_codec_load8, un-rotates the
 * rows of rotated source pages (kv_fmt_rot_inv: with the decode, the
 * values the CPU's kv_format_load gives) and rotates every row for a
 * rotated destination (kv_fmt_rot_fwd, as kv_format_to_variant does; both
 * steps when both are rotated, as on the CPU), a thread per row, then
 * encodes:
 *   FP16: one thread per element, round to nearest even;
 *   INT:  keys one thread per channel (16 tokens), values one thread per
 *         (token, 16-channel group), each through kv_fmt_codec_quantize16,
 *         the function kv_fmt_int.c's store computes with,
 * so destination pages are bit-identical to the CPU reference's. Where each
 * token comes from and goes to is planned on the host (kv_cuda_convert_locs).
 * Only the destination token slots (FP16 rows, INT group blocks) are
 * written.
 */
#include "kv_cuda_int.cuh"
#include "formats/kv_fmt_rot.h"

extern "C" {
#include "formats/kv_format.h"
}

namespace {

constexpr uint32_t T = KV_CUDA_THREADS;
constexpr uint32_t CH = 16; /* tokens per block */

template <uint32_t D>
__global__ void __launch_bounds__(KV_CUDA_THREADS)
    convert_kernel(const kv_cuda_convert_args_t a)
{
    constexpr uint32_t CPT = D / 8, NG = D / 16;
    __shared__ __align__(16) float kx[CH][D];
    __shared__ __align__(16) float vx[CH][D];
    const uint32_t tid = threadIdx.x, pb = a.page_bytes;
    const uint32_t t0 = blockIdx.x * CH;
    const uint32_t n = a.n_tokens - t0 < CH ? a.n_tokens - t0 : CH;

    for (uint32_t x = tid; x < n * CPT; x += T) {
        const uint32_t i = x / CPT, c0 = (x % CPT) * 8;
        const uint32_t *loc = a.src_loc + 2u * (t0 + i);
        const kv_cuda_ent_t e = a.src_ents[loc[0]];
        const uint8_t *page =
            (const uint8_t *)a.src_pages + (size_t)e.page * pb;
        kv_fmt_codec_load8(KV_CUDA_ENT_FMT(e.meta), KV_CUDA_ENT_VAR(e.meta),
                           page, D, pb, loc[1], c0, 0, &kx[i][c0]);
        kv_fmt_codec_load8(KV_CUDA_ENT_FMT(e.meta), KV_CUDA_ENT_VAR(e.meta),
                           page, D, pb, loc[1], c0, 1, &vx[i][c0]);
    }
    __syncthreads();
    if (tid < 2u * n) { /* K rows then V rows, a thread each */
        const uint32_t i = tid % n;
        float *row = tid < n ? kx[i] : vx[i];
        const uint32_t m = a.src_ents[a.src_loc[2u * (t0 + i)]].meta;
        if (kv_fmt_codec_rotated(KV_CUDA_ENT_FMT(m), KV_CUDA_ENT_VAR(m)))
            kv_fmt_rot_inv(row, D);
        if (a.dst_variant == 1u)
            kv_fmt_rot_fwd(row, D);
    }
    __syncthreads();

    uint8_t *dst = (uint8_t *)a.dst_pages;
    if (a.dst_format == KV_FMT_FP16) {
        const uint32_t tpp = kv_fmt_fp16_tpp(D, pb);
        for (uint32_t x = tid; x < n * D; x += T) {
            const uint32_t i = x / D, c = x % D;
            const uint32_t *loc = a.dst_loc + 2u * (t0 + i);
            uint8_t *pg = dst + (size_t)loc[0] * pb;
            uint16_t *hk = (uint16_t *)(void *)(pg + kv_fmt_fp16_k_row(D, loc[1]));
            uint16_t *hv =
                (uint16_t *)(void *)(pg + kv_fmt_fp16_v_row(D, tpp, loc[1]));
            hk[c] = kv_fmt_codec_f2h(kx[i][c]);
            hv[c] = kv_fmt_codec_f2h(vx[i][c]);
        }
        return;
    }
    /* INT: the 16 tokens are one group block (host-checked alignment) */
    const uint32_t bits = kv_fmt_int_bits(a.dst_format), nw = bits / 2u;
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(D, bits);
    const uint32_t *loc = a.dst_loc + 2u * t0;
    uint8_t *blk = dst + (size_t)loc[0] * pb +
                   (size_t)(loc[1] / KV_FMT_INT_GROUP) * l.group_bytes;
    uint32_t *kc = (uint32_t *)(void *)(blk + l.k_codes);
    uint32_t *vc = (uint32_t *)(void *)(blk + l.v_codes);
    uint16_t *ks = (uint16_t *)(void *)(blk + l.k_scale);
    uint16_t *km = (uint16_t *)(void *)(blk + l.k_min);
    uint16_t *vs = (uint16_t *)(void *)(blk + l.v_scale);
    uint16_t *vm = (uint16_t *)(void *)(blk + l.v_min);
    for (uint32_t c = tid; c < D; c += T)
        kv_fmt_codec_quantize16(bits, &kx[0][c], D, kc + c, D, ks + c, km + c);
    for (uint32_t x = tid; x < CH * NG; x += T) {
        const uint32_t i = x / NG, cg = x % NG, gi = i * NG + cg;
        kv_fmt_codec_quantize16(bits, &vx[i][16u * cg], 1, vc + (size_t)gi * nw,
                                1, vs + gi, vm + gi);
    }
}

} // namespace

extern "C" int kv_cuda_convert_launch(const kv_cuda_convert_args_t *a,
                                      void *stream)
{
    if (!a || (a->dst_format != KV_FMT_FP16 && a->dst_format != KV_FMT_INT4 &&
               a->dst_format != KV_FMT_INT2))
        return KV_EINVAL;
    if (a->dst_format != KV_FMT_FP16 && a->n_tokens % CH != 0)
        return KV_EINVAL;
    kv_page_geom_t g = {};
    g.head_dim = a->head_dim;
    g.page_bytes = a->page_bytes;
    if (a->dst_variant >= kv_format_variants(a->dst_format, &g))
        return KV_EINVAL; /* the variants the format stores (rotated INT) */
    int rc = kv_cuda_page_bytes_ok(a->page_bytes, a->head_dim);
    if (rc)
        return rc;
    if (a->n_tokens == 0)
        return 0;
    const uint32_t blocks = (a->n_tokens + CH - 1) / CH;
    (void)cudaGetLastError(); /* no stale error blamed on this launch */
    KV_CUDA_DISPATCH_HEAD_DIM(a->head_dim, D, {
        KV_CUDA_LAUNCH(convert_kernel<D>, blocks, T, 0, (cudaStream_t)stream,
                       *a);
    })
    return kv_cuda_status(cudaGetLastError());
}
