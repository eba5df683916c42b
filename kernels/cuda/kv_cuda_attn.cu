/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_attn.cu — paged attention on the GPU: decode and causal prefill
 * over pages of any format (FP16, INT4, INT2 plain or rotated, MERGED mixed
 * in one list), split-K partials with a reduce kernel, exact statistics in
 * a second pass.
 *
 * One kernel serves decode and prefill (kv_cuda.h, kv_cuda_attn_args_t):
 * a block is (work item w, row group rg) and runs up to 4 or 8 (R) query
 * rows of one kv head over the work item's token range, so each K/V byte
 * of the range is read once for the whole group (decode: the GQA group's
 * heads; prefill: (position, head) rows, each with its causal limit).
 *
 * Per block (128 threads):
 *   - the rows' queries, times scale, in shared memory (as the CPU does);
 *   - page entries of the range come into shared memory KV_CUDA_ENT_WIN at
 *     a time; thread 0 cuts the range into tiles of <= KV_CUDA_TILE tokens
 *     over <= kv_cuda_slots(page_bytes) pages (a tile descriptor in shared
 *     memory: per page slot its page, format, variant, token range);
 *   - two stages: while tile i is computed, the page bytes of tile i+1 are
 *     copied into the other stage with 16-byte cp.async (each page to the
 *     same offsets in its slot: the slot is an image of the page, so the
 *     decoders of formats/kv_fmt_codec.h read it as they would the page);
 *   - per tile: logits (a token's D channels split over D/8 lanes, 8
 *     channels each decoded by kv_fmt_codec_load8 and dotted with every row,
 *     summed across the lanes with shuffles), an online-softmax step per
 *     row (a warp per row: max, exp, sum; running m, l and the rescale
 *     factor in shared memory), then acc += p * v with V decoded the same
 *     way; each thread keeps acc[row][8 channels] for its token lane;
 *   - at the end the token lanes' accumulators are summed through shared
 *     memory and the block writes either the final rows (single pass: out,
 *     log-sum-exp) or partials (m, l, acc) that reduce_kernel combines in
 *     work-item order with the (max, sum-exp) rule, as the CPU backend does.
 * Statistics: stats_kernel decodes the keys of 64 tokens to shared memory
 * and, for every counted row, adds exp(q . k - lse) (exact: the rows' true
 * log-sum-exp from the first pass).
 *
 * Rotated INT pages (variant 1 of INT4/INT2, formats/kv_fmt_rot.h: codes of
 * R k and R v) are read as stored and never un-rotated token by token in
 * the attention kernel. Its ROT build (chosen per call: a.rotated) keeps
 * R q of each row in shared memory (kv_fmt_rot_fwd once per block) and
 * scores a rotated page's tokens with it ((R q) . (R k) = q . k); their
 * p * (R v) go to a second accumulator under the same running max and sum
 * (one softmax over all the list's tokens), and at the end R^T of its
 * token-lane sum (kv_fmt_rot_inv once per row) is added to the plain sum
 * before the output or a partial is written, so partials and their merge
 * are those of plain pages. The statistics kernel instead un-rotates the
 * decoded keys of rotated tokens (kv_fmt_rot_inv per token, 64 per block):
 * a block serves every counted row, and rotating their queries would cost
 * one transform per row and block. Exact in exact arithmetic; in FP32 both
 * agree with the CPU reference (which scores with R q) to rounding.
 *
 * Arithmetic is FP32 (expf, fmaf); results agree with the CPU reference to
 * FP32 rounding, not bit for bit (sum orders differ). Decoded K/V values
 * are bit-identical to the CPU's (kv_fmt_codec.h).
 */
#include <cuda_pipeline.h>
#include <math.h>

#include "kv_cuda_int.cuh"
#include "formats/kv_fmt_rot.h"

namespace {

constexpr uint32_t T = KV_CUDA_THREADS;
constexpr uint32_t TILE = KV_CUDA_TILE;
constexpr uint32_t WIN = KV_CUDA_ENT_WIN;
using tile_t = kv_cuda_tile_t;
using cursor_t = kv_cuda_cursor_t;

template <uint32_t D, uint32_t R, bool ROT> struct __align__(16) attn_smem
{
    float q[R][D];    /* rows' queries times scale                   */
    float rq[ROT ? R : 1][D]; /* ROT: R q[r]; at the end, the rows'  */
                      /* rotated sums, then R^T of them              */
    float s[R][TILE]; /* logits, then probabilities, of a tile      */
    float red[T * 8]; /* [token lanes][D] accumulator sums           */
    float m[R], l[R], alpha[R];
    uint32_t lim[R]; /* causal limit of each row (list tokens)      */
    kv_cuda_ent_t ent[WIN];
    tile_t tile[2];
    cursor_t cur;
};

/* Make sure the entries the next tile may use are in sm.ent (all threads;
 * ends with a barrier, after which thread 0 may move the cursor). */
template <typename S>
__device__ void ensure_window(S &sm, const kv_cuda_attn_args_t &a,
                              uint32_t ent_end, uint32_t ns_max)
{
    const cursor_t c = sm.cur;
    const bool need = kv_cuda_window_stale(&c, ns_max);
    __syncthreads(); /* everyone has read sm.cur */
    if (need) {
        for (uint32_t j = threadIdx.x; j < WIN && c.pe + j < ent_end; j += T)
            sm.ent[j] = a.ents[c.pe + j];
        if (threadIdx.x == 0)
            sm.cur.win0 = c.pe;
        __syncthreads();
    }
}

/* All threads: start the copies of a tile's page bytes into stage st, and
 * commit them as one group (possibly empty). */
template <uint32_t D>
__device__ void issue_tile(const tile_t &t, uint8_t *st,
                           const kv_cuda_attn_args_t &a)
{
    const uint32_t pb = a.page_bytes;
    for (uint32_t j = 0; j < t.ns; j++) {
        const kv_cuda_slot_t s = t.s[j];
        uint32_t lo[2], hi[2];
        const uint32_t nr =
            kv_fmt_codec_ranges(s.fmt, D, pb, s.t0, s.k, lo, hi);
        const uint8_t *src = (const uint8_t *)a.pages + (size_t)s.page * pb;
        uint8_t *dst = st + (size_t)j * pb;
        for (uint32_t x = 0; x < nr; x++)
            for (uint32_t o = lo[x] + threadIdx.x * 16u; o < hi[x];
                 o += T * 16u)
                __pipeline_memcpy_async(dst + o, src + o, 16);
    }
    __pipeline_commit();
}

/* acc[r][j] += p_r * v8[j] for the rows r < nr, p_r = s[r][i] (a tile
 * token's probabilities). */
template <uint32_t R>
__device__ __forceinline__ void add_pv(float (&acc)[R][8],
                                       const float (*s)[TILE], uint32_t i,
                                       uint32_t nr, const float (&v8)[8])
{
#pragma unroll
    for (uint32_t r = 0; r < R; r++)
        if (r < nr) {
            const float p = s[r][i];
#pragma unroll
            for (uint32_t j = 0; j < 8; j++)
                acc[r][j] = fmaf(p, v8[j], acc[r][j]);
        }
}

/* All threads: the sum over the token lanes of v (channels c0..c0+7 of
 * token lane tl) for channel threadIdx.x (valid for threadIdx.x < D),
 * through red; starts and ends with a barrier's worth of ordering. */
template <uint32_t D>
__device__ __forceinline__ float lanes_sum(float *red, const float (&v)[8],
                                           uint32_t tl, uint32_t c0)
{
    constexpr uint32_t TL = T * 8 / D;
#pragma unroll
    for (uint32_t j = 0; j < 8; j++)
        red[tl * D + c0 + j] = v[j];
    __syncthreads();
    float sum = 0.0f;
    if (threadIdx.x < D)
        for (uint32_t x = 0; x < TL; x++)
            sum += red[x * D + threadIdx.x];
    __syncthreads(); /* red may be written again */
    return sum;
}

/* R: rows per block (4 or 8, a.rows_blk); registers: R * 8 accumulators
 * per thread (twice that in the ROT build), so small GQA groups get the
 * 4-row build. ROT: the call has rotated INT pages (a.rotated; see the
 * file comment): R q rows and the second accumulator racc. */
template <uint32_t D, uint32_t R, bool ROT>
__global__ void __launch_bounds__(KV_CUDA_THREADS,
                                  R == 4 ? (ROT ? 3 : 4) : (ROT ? 2 : 3))
    attn_kernel(const kv_cuda_attn_args_t a)
{
    constexpr uint32_t CPT = D / 8, TL = T / CPT;
    static_assert(CPT <= 32 && 32 % CPT == 0, "a token's lanes in one warp");
    static_assert(TL * D == T * 8, "red holds one row of every token lane");
    static_assert(D <= T, "a thread per channel in the final sums");
    __shared__ attn_smem<D, R, ROT> sm;
    KV_CUDA_DYN_SMEM(uint8_t, stage);

    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t chunk = tid % CPT, tl = tid / CPT, c0 = chunk * 8;
    const uint32_t w = blockIdx.x / a.n_rg, rg = blockIdx.x % a.n_rg;
    const kv_cuda_work_t wk = a.work[w];
    const uint32_t r0 = rg * R;
    const uint32_t nr = a.n_rows - r0 < R ? a.n_rows - r0 : R;
    const uint32_t pb = a.page_bytes, ns_max = kv_cuda_slots(pb);
    const uint32_t len = a.seq_len[wk.list];

    if (tid < R) {
        sm.lim[tid] = tid < nr ? kv_cuda_row_limit(a, r0 + tid, len) : 0;
        sm.m[tid] = -INFINITY;
        sm.l[tid] = 0.0f;
        sm.alpha[tid] = 1.0f;
    }
    for (uint32_t x = tid; x < R * D; x += T) {
        const uint32_t r = x / D, c = x % D;
        sm.q[r][c] =
            r < nr
                ? a.q[kv_cuda_row_index(a, wk.list, r0 + r) * D + c] * a.scale
                : 0.0f;
    }
    /* rows see a growing prefix: the last row sees the most */
    const uint32_t lim_max = kv_cuda_row_limit(a, r0 + nr - 1, len);
    const uint32_t t_end = wk.t_begin + wk.n_tok;
    const uint32_t t_stop = t_end < lim_max ? t_end : lim_max;
    if (tid == 0)
        sm.cur = cursor_t{wk.ent0, wk.off0,
                          t_stop > wk.t_begin ? t_stop - wk.t_begin : 0u,
                          KV_CUDA_NO_WIN};
    __syncthreads();
    if (ROT) { /* R q of each row (rows past nr: 0), a thread per row */
        if (tid < R) {
            for (uint32_t c = 0; c < D; c++)
                sm.rq[tid][c] = sm.q[tid][c];
            kv_fmt_rot_fwd(sm.rq[tid], D);
        }
        __syncthreads();
    }

    /* acc: plain pages' p * v; racc (ROT): rotated pages' p * (R v) */
    float acc[R][8], racc[R][8];
#pragma unroll
    for (uint32_t r = 0; r < R; r++)
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            acc[r][j] = 0.0f;
            racc[r][j] = 0.0f;
        }

    if (sm.cur.rem > 0) { /* uniform: read after the barrier */
        for (uint32_t b = 0; b < 2; b++) {
            ensure_window(sm, a, wk.ent_end, ns_max);
            if (tid == 0)
                kv_cuda_build_tile(&sm.cur, sm.ent, ns_max, &sm.tile[b]);
            __syncthreads();
            issue_tile<D>(sm.tile[b], stage + (size_t)b * ns_max * pb, a);
        }
        uint32_t t_tile = wk.t_begin; /* list token of the tile's first */
        for (uint32_t it = 0;; it++) {
            const uint32_t b = it & 1u;
            const tile_t &tt = sm.tile[b];
            const uint32_t ntok = tt.ntok;
            if (ntok == 0)
                break;
            const uint8_t *img = stage + (size_t)b * ns_max * pb;
            __pipeline_wait_prior(1); /* this thread's copies of tile it */
            __syncthreads();          /* everyone's                      */

            /* logits: rows x tile tokens */
            for (uint32_t i0 = 0; i0 < ntok; i0 += TL) {
                const uint32_t i = i0 + tl;
                float part[R];
#pragma unroll
                for (uint32_t r = 0; r < R; r++)
                    part[r] = 0.0f;
                if (i < ntok) {
                    const uint32_t sl = tt.tok_slot[i];
                    const kv_cuda_slot_t s = tt.s[sl];
                    /* a rotated page's keys are R k: score with R q */
                    const float(*q)[D] =
                        ROT && kv_fmt_codec_rotated(s.fmt, s.var) ? sm.rq
                                                                  : sm.q;
                    float k8[8];
                    kv_fmt_codec_load8(s.fmt, s.var, img + (size_t)sl * pb, D,
                                       pb, s.t0 + (i - s.start), c0, 0, k8);
#pragma unroll
                    for (uint32_t r = 0; r < R; r++)
#pragma unroll
                        for (uint32_t j = 0; j < 8; j++)
                            part[r] = fmaf(q[r][c0 + j], k8[j], part[r]);
                }
#pragma unroll
                for (uint32_t o = CPT / 2; o > 0; o /= 2)
#pragma unroll
                    for (uint32_t r = 0; r < R; r++)
                        part[r] += __shfl_xor_sync(0xffffffffu, part[r], o);
                if (i < ntok && chunk == 0)
#pragma unroll
                    for (uint32_t r = 0; r < R; r++)
                        sm.s[r][i] =
                            t_tile + i < sm.lim[r] ? part[r] : -INFINITY;
            }
            __syncthreads();

            /* online softmax: a warp per row */
            for (uint32_t r = warp; r < nr; r += T / 32) {
                float mx = -INFINITY;
                for (uint32_t i = lane; i < ntok; i += 32)
                    mx = fmaxf(mx, sm.s[r][i]);
                mx = kv_cuda_warp_max(mx);
                const float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
                float sum = 0.0f;
                for (uint32_t i = lane; i < ntok; i += 32) {
                    const float p =
                        m_new == -INFINITY ? 0.0f : expf(sm.s[r][i] - m_new);
                    sm.s[r][i] = p;
                    sum += p;
                }
                sum = kv_cuda_warp_sum(sum);
                __syncwarp(); /* every lane has read sm.m[r] */
                if (lane == 0) {
                    const float al =
                        m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                    sm.l[r] = sm.l[r] * al + sum;
                    sm.m[r] = m_new;
                    sm.alpha[r] = al;
                }
            }
            __syncthreads();

            /* acc = acc * alpha + p . v (racc: the same, rotated v) */
#pragma unroll
            for (uint32_t r = 0; r < R; r++)
                if (r < nr) {
                    const float al = sm.alpha[r];
#pragma unroll
                    for (uint32_t j = 0; j < 8; j++) {
                        acc[r][j] *= al;
                        if (ROT)
                            racc[r][j] *= al;
                    }
                }
            for (uint32_t i = tl; i < ntok; i += TL) {
                const uint32_t sl = tt.tok_slot[i];
                const kv_cuda_slot_t s = tt.s[sl];
                float v8[8];
                kv_fmt_codec_load8(s.fmt, s.var, img + (size_t)sl * pb, D, pb,
                                   s.t0 + (i - s.start), c0, 1, v8);
                if (ROT && kv_fmt_codec_rotated(s.fmt, s.var))
                    add_pv<R>(racc, sm.s, i, nr, v8);
                else
                    add_pv<R>(acc, sm.s, i, nr, v8);
            }
            t_tile += ntok;
            /* tile it+2 into this stage (ensure_window's barrier also
             * ends every read of this stage, tile and sm.s) */
            ensure_window(sm, a, wk.ent_end, ns_max);
            if (tid == 0)
                kv_cuda_build_tile(&sm.cur, sm.ent, ns_max, &sm.tile[b]);
            __syncthreads();
            issue_tile<D>(sm.tile[b], stage + (size_t)b * ns_max * pb, a);
        }
    }
    __pipeline_wait_prior(0);

    /* ROT: the rotated sums of the rows into sm.rq (R q is no longer
     * read), then back to the rows' space: R^T once per row */
    if (ROT) {
#pragma unroll
        for (uint32_t r = 0; r < R; r++) {
            if (r >= nr) /* uniform */
                break;
            const float sum = lanes_sum<D>(sm.red, racc[r], tl, c0);
            if (tid < D)
                sm.rq[r][tid] = sum;
        }
        __syncthreads();
        if (tid < nr)
            kv_fmt_rot_inv(sm.rq[tid], D);
        __syncthreads();
    }
    /* sum the token lanes' accumulators; write rows or partials (a thread
     * per channel: tid < D) */
    const size_t prow = ((size_t)w * a.n_rg + rg) * R; /* partial row 0 */
    const size_t n_prow = (size_t)a.n_work * a.n_rg * R;
#pragma unroll
    for (uint32_t r = 0; r < R; r++) {
        if (r >= nr) /* uniform */
            break;
        float sum = lanes_sum<D>(sm.red, acc[r], tl, c0);
        const float m = sm.m[r], l = sm.l[r];
        if (tid < D) {
            if (ROT)
                sum += sm.rq[r][tid];
            if (a.part)
                a.part[(prow + r) * D + tid] = sum;
            else
                a.out[kv_cuda_row_index(a, wk.list, r0 + r) * D + tid] =
                    sum / l;
        }
        if (tid == 0) {
            if (a.part) {
                a.part[n_prow * D + (prow + r) * 2] = m;
                a.part[n_prow * D + (prow + r) * 2 + 1] = l;
            } else if (a.lse) {
                a.lse[(size_t)wk.list * a.n_rows + r0 + r] = m + logf(l);
            }
        }
    }
}

/* One block per (list, row): combine the list's partials in work order. */
__global__ void __launch_bounds__(KV_CUDA_THREADS)
    reduce_kernel(const kv_cuda_attn_args_t a)
{
    const uint32_t D = a.head_dim;
    const uint32_t list = blockIdx.x / a.n_rows, r = blockIdx.x % a.n_rows;
    const uint32_t R = a.rows_blk, rg = r / R, rr = r % R;
    const uint32_t w0 = a.list_work[list], w1 = a.list_work[list + 1];
    const size_t n_prow = (size_t)a.n_work * a.n_rg * R;
    const float *ml = a.part + n_prow * D;
    float mx = -INFINITY;
    for (uint32_t w = w0; w < w1; w++)
        mx = fmaxf(mx, ml[(((size_t)w * a.n_rg + rg) * R + rr) * 2]);
    float sum = 0.0f, o = 0.0f;
    const uint32_t c = threadIdx.x;
    for (uint32_t w = w0; w < w1; w++) {
        const size_t pr = ((size_t)w * a.n_rg + rg) * R + rr;
        const float m = ml[pr * 2], l = ml[pr * 2 + 1];
        const float wt = m == -INFINITY ? 0.0f : expf(m - mx);
        sum += l * wt;
        if (c < D)
            o += a.part[pr * D + c] * wt;
    }
    if (c < D)
        a.out[kv_cuda_row_index(a, list, r) * D + c] = o / sum;
    if (c == 0 && a.lse)
        a.lse[(size_t)list * a.n_rows + r] = mx + logf(sum);
}

constexpr uint32_t ST = KV_CUDA_STATS_TILE;
constexpr uint32_t QROWS = 16; /* rows' queries staged at once */

/* One block per statistics item (<= 64 tokens of one list). */
template <uint32_t D>
__global__ void __launch_bounds__(KV_CUDA_THREADS)
    stats_kernel(const kv_cuda_attn_args_t a)
{
    constexpr uint32_t CPT = D / 8;
    static_assert(T == 2 * ST, "two row parities per token");
    __shared__ float k_s[ST][D + 1]; /* +1: conflict-free column reads */
    __shared__ float q_s[QROWS][D];
    __shared__ float lse_s[QROWS], red[2][ST];
    __shared__ uint32_t lim_s[QROWS], ent_s[ST], tin_s[ST];

    const uint32_t tid = threadIdx.x;
    const kv_cuda_work_t wk = a.stile[blockIdx.x];
    const uint32_t len = a.seq_len[wk.list], pb = a.page_bytes;
    if (tid == 0) { /* token -> (entry, token in page) */
        uint32_t e = wk.ent0, off = wk.off0;
        for (uint32_t i = 0; i < wk.n_tok; i++) {
            ent_s[i] = e;
            tin_s[i] = off;
            if (++off == KV_CUDA_ENT_N(a.ents[e].meta)) {
                e++;
                off = 0;
            }
        }
    }
    __syncthreads();
    for (uint32_t x = tid; x < wk.n_tok * CPT; x += T) {
        const uint32_t i = x / CPT, c0 = (x % CPT) * 8;
        const kv_cuda_ent_t e = a.ents[ent_s[i]];
        float k8[8];
        kv_fmt_codec_load8(KV_CUDA_ENT_FMT(e.meta), KV_CUDA_ENT_VAR(e.meta),
                           (const uint8_t *)a.pages + (size_t)e.page * pb, D,
                           pb, tin_s[i], c0, 0, k8);
        for (uint32_t j = 0; j < 8; j++)
            k_s[i][c0 + j] = k8[j];
    }
    if (a.rotated) { /* rotated pages' keys R k back to k: a thread a token */
        __syncthreads();
        if (tid < wk.n_tok) {
            const uint32_t m = a.ents[ent_s[tid]].meta;
            if (kv_fmt_codec_rotated(KV_CUDA_ENT_FMT(m), KV_CUDA_ENT_VAR(m)))
                kv_fmt_rot_inv(k_s[tid], D);
        }
    }
    const uint32_t j = tid % ST, par = tid / ST, t = wk.t_begin + j;
    float acc = 0.0f;
    for (uint32_t rc = a.stats_row0; rc < a.n_rows; rc += QROWS) {
        const uint32_t nrc = a.n_rows - rc < QROWS ? a.n_rows - rc : QROWS;
        __syncthreads(); /* k_s written; previous rows' reads done */
        for (uint32_t x = tid; x < nrc * D; x += T) {
            const uint32_t r = x / D, c = x % D;
            q_s[r][c] =
                a.q[kv_cuda_row_index(a, wk.list, rc + r) * D + c] * a.scale;
        }
        if (tid < nrc) {
            lse_s[tid] = a.lse[(size_t)wk.list * a.n_rows + rc + tid];
            lim_s[tid] = kv_cuda_row_limit(a, rc + tid, len);
        }
        __syncthreads();
        if (j < wk.n_tok)
            for (uint32_t r = par; r < nrc; r += 2) {
                if (t >= lim_s[r])
                    continue;
                float dot = 0.0f;
                for (uint32_t c = 0; c < D; c++)
                    dot = fmaf(q_s[r][c], k_s[j][c], dot);
                acc += expf(dot - lse_s[r]);
            }
    }
    red[par][j] = acc;
    __syncthreads();
    if (par == 0 && j < wk.n_tok)
        a.stats[a.stats_off[wk.list] + t] = red[0][j] + red[1][j];
}

} // namespace

/* 0 if the dispatch switch has a case for d, else KV_ENOTSUP. */
static int head_dim_case(uint32_t d)
{
    KV_CUDA_DISPATCH_HEAD_DIM(d, D, { return D == d ? 0 : KV_ENOTSUP; })
    return KV_ENOTSUP;
}

extern "C" int kv_cuda_head_dim_ok(uint32_t d)
{
    return head_dim_case(d) == 0;
}

extern "C" size_t kv_cuda_part_floats(uint32_t n_work, uint32_t n_rg,
                                      uint32_t rows_blk, uint32_t d)
{
    return (size_t)n_work * n_rg * rows_blk * (d + 2u);
}

extern "C" size_t kv_cuda_attn_smem(uint32_t head_dim, uint32_t page_bytes)
{
    (void)head_dim;
    return 2u * (size_t)kv_cuda_slots(page_bytes) * page_bytes;
}

extern "C" int kv_cuda_attn_launch(const kv_cuda_attn_args_t *a, void *stream)
{
    if (!a || a->n_work == 0 || a->n_rows == 0 || a->n_lists == 0 ||
        a->n_kv_heads == 0 || a->n_q_heads % a->n_kv_heads != 0 ||
        a->rows_blk != kv_cuda_rows_per_block(a->n_rows) ||
        a->n_rg != (a->n_rows + a->rows_blk - 1) / a->rows_blk ||
        (a->stats && (!a->lse || !a->stile || !a->stats_off)))
        return KV_EINVAL;
    int rc = kv_cuda_page_bytes_ok(a->page_bytes, a->head_dim);
    if (rc)
        return rc;
    const uint64_t blocks = (uint64_t)a->n_work * a->n_rg;
    const uint64_t rblocks = (uint64_t)a->n_lists * a->n_rows;
    if (blocks > 0x7fffffffu || rblocks > 0x7fffffffu)
        return KV_EINVAL;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t smem = kv_cuda_attn_smem(a->head_dim, a->page_bytes);
    KV_CUDA_DISPATCH_HEAD_DIM(a->head_dim, D, {
        auto kern = a->rows_blk == 4
                        ? (a->rotated ? attn_kernel<D, 4, true>
                                      : attn_kernel<D, 4, false>)
                        : (a->rotated ? attn_kernel<D, 8, true>
                                      : attn_kernel<D, 8, false>);
        /* Static shared memory (the kernel's own arrays) counts toward the
         * same 48 KiB default limit as the dynamic part: opt in to more
         * whenever the two together exceed it (pages of ~19-24 KiB stage
         * under 48 KiB dynamically but not with the static part). */
        cudaFuncAttributes fa;
        if ((rc = kv_cuda_status(cudaFuncGetAttributes(&fa, kern))))
            return rc;
        if (fa.sharedSizeBytes + smem > 48u * 1024u &&
            (rc = kv_cuda_status(cudaFuncSetAttribute(
                 kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                 (int)smem))))
            return rc;
        /* An error left by an earlier, already handled failure (a failed
         * cudaMalloc, say) must not be read as this launch's below. */
        (void)cudaGetLastError();
        KV_CUDA_LAUNCH(kern, (unsigned)blocks, T, smem, s, *a);
        if (a->part)
            KV_CUDA_LAUNCH(reduce_kernel, (unsigned)rblocks, T, 0, s, *a);
        if (a->stats && a->n_stile)
            KV_CUDA_LAUNCH(stats_kernel<D>, a->n_stile, T, 0, s, *a);
    })
    return kv_cuda_status(cudaGetLastError());
}
