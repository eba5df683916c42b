/*
 * kv_fmt_int.c — the INT4 and INT2 page formats (layout spec in kv_fmt_int.h).
 *
 * One implementation for both formats, parameterized by the bits per code
 * (4 or 2), a constant in each inlined instance of the code. Quantization
 * is kv_fmt_codec_quantize16 (kv_fmt_codec.h: the one definition the CUDA
 * kernels share).
 *
 * Loads are what read-back, compaction and conversions use (attention reads
 * INT pages through the attention steps below instead). A group's FP16
 * scale/min are converted with one bulk call; its codes
 * are decoded with shifts, masks and FP32 math on 8-lane GNU C vectors (half
 * a group): K channel blocks keep their scale, min and code words in
 * registers across the group's tokens; a V group broadcasts its code word
 * and shifts each lane by its own amount. On x86 the load body is compiled
 * twice, portable (SSE2) and AVX2 (per-lane shifts in one instruction), and
 * the AVX2 one is chosen once at run time when the CPU has it. Both decode
 * bit-identically: x^ = q * scale + min rounded once, computed as
 * kv_fmt_codec_dequant computes it (FP64 multiply and add), on vectors.
 *
 * The attention steps (attn_score, attn_accum; method in kv_fmt_int.h) work on
 * 16-lane GNU C vectors (one group) and are compiled three times: portable,
 * AVX2+FMA, AVX-512F (one vector per group; codes become FP32 through a
 * vpermps table lookup there); the best the CPU runs is chosen once. Every
 * build gives the same bits: the same FP32 operations per lane in the same
 * order, multiply-adds written as fmaf (fused everywhere).
 *
 * Stores quantize whole groups: t0 and n must be multiples of 16 (asserted;
 * in NDEBUG builds a misaligned store writes nothing). Callers validate
 * ranges and values (finite, |x| <= 65504) as for every format. Stack use:
 * at most 16 KiB (load), 8 KiB (attention steps) / 4 KiB (store) of FP32
 * scratch, no allocation. No state besides the one-time CPU feature probes.
 */
#include "kv_fmt_int.h"

#include <assert.h>
#include <stdatomic.h>
#include <string.h>

#include "kv_fmt_codec.h"

#if defined(__x86_64__) || defined(__i386__)
#define KV_INT_X86 1
#include <immintrin.h>
#endif

/* The attention steps' bit-identity across builds needs every multiply-add
 * to be the explicit fmaf it is written as (GCC contracts nothing under
 * -std=c11; clang would, per statement). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* GNU C (GCC >= 9 or Clang): vector extensions, always_inline, target. */
#define KV_INT_INLINE static inline __attribute__((always_inline))

/* Largest head_dim (kv_fmt_layout.h): bounds the stack buffer of one
 * group's scale/min decoded to FP32 (4 x 1024 floats). */
#define KV_INT_MAX_DIM KV_FMT_MAX_DIM
/* Channels quantized per pass of a store (stack buffer [16][CHUNK]). */
#define KV_INT_CHUNK 64u

static uint32_t int_tokens_per_page(const kv_page_geom_t *g, uint32_t bits)
{
    return g ? kv_fmt_int_tpp(g->head_dim, g->page_bytes, bits) : 0;
}

/* ---- load ---------------------------------------------------------------- */

/* 8 lanes = half a quantization group. GNU C vector types: the compiler maps
 * them to what the target has (2 x SSE2, 1 x AVX2). The _m variants are for
 * memory operands that are only 4-byte aligned (a vector type aliases its
 * element type, so they access float / uint32_t arrays legally). */
typedef float kv_int_f32x8 __attribute__((vector_size(32)));
typedef int32_t kv_int_i32x8 __attribute__((vector_size(32)));
typedef uint32_t kv_int_u32x8 __attribute__((vector_size(32)));
typedef float kv_int_f32x8_m __attribute__((vector_size(32), aligned(4)));
typedef uint32_t kv_int_u32x8_m __attribute__((vector_size(32), aligned(4)));

typedef double kv_int_f64x8 __attribute__((vector_size(64)));

/* Store x^ = q * scale + min (8 lanes) to p, rounded once: the value of
 * kv_fmt_codec_dequant, computed the same way (FP64 multiply and add, one
 * rounding to FP32; see kv_fmt_codec.h). A macro, not a function: vectors
 * passed by value change the ABI between targets (-Wpsabi), and passed by
 * address they would be pinned to the stack on SSE2. */
#define KV_INT_DEQUANT(p, q, s, m)                                          \
    do {                                                                    \
        kv_int_f64x8 x_ =                                                   \
            __builtin_convertvector((kv_int_i32x8)(q), kv_int_f64x8);       \
        x_ = x_ * __builtin_convertvector((s), kv_int_f64x8);               \
        x_ = x_ + __builtin_convertvector((m), kv_int_f64x8);               \
        *(kv_int_f32x8_m *)(p) =                                            \
            __builtin_convertvector(x_, kv_int_f32x8);                      \
    } while (0)

/* K rows lo..hi-1 of one group block, out row i = token lo + i, from the
 * group's K scale/min ps/pm [D] (FP32). Channel blocks of 16 outer, tokens
 * inner: a block's scale, min and code words stay in registers while its
 * tokens are decoded (shift, mask, convert, multiply, add). */
KV_INT_INLINE void decode_k(const uint32_t *codes, const float *ps,
                            const float *pm, uint32_t d, uint32_t bits,
                            uint32_t lo, uint32_t hi, float *out)
{
    const uint32_t per = 32u / bits, mask = (1u << bits) - 1u;
    for (uint32_t c = 0; c < d; c += 16) { /* two vectors per pass */
        const kv_int_f32x8 s0 = *(const kv_int_f32x8_m *)(ps + c);
        const kv_int_f32x8 s1 = *(const kv_int_f32x8_m *)(ps + c + 8);
        const kv_int_f32x8 m0 = *(const kv_int_f32x8_m *)(pm + c);
        const kv_int_f32x8 m1 = *(const kv_int_f32x8_m *)(pm + c + 8);
        const uint32_t *wp = codes + (lo / per) * d + c;
        kv_int_u32x8 w0 = *(const kv_int_u32x8_m *)wp;
        kv_int_u32x8 w1 = *(const kv_int_u32x8_m *)(wp + 8);
        for (uint32_t t = lo; t < hi; t++) {
            const uint32_t sh = bits * (t % per);
            float *o = out + (size_t)(t - lo) * d + c;
            if (t % per == 0) { /* next word plane (INT4: token 8) */
                wp = codes + (t / per) * d + c;
                w0 = *(const kv_int_u32x8_m *)wp;
                w1 = *(const kv_int_u32x8_m *)(wp + 8);
            }
            KV_INT_DEQUANT(o, (w0 >> sh) & mask, s0, m0);
            KV_INT_DEQUANT(o + 8, (w1 >> sh) & mask, s1, m1);
        }
    }
}

/* V rows lo..hi-1 of one group block, out row i = token lo + i, from the
 * group's V scale/min ps/pm [16][D/16] (FP32). Each half (8 channels) of a
 * 16-channel group is one vector: its code word broadcast to the lanes, lane
 * j shifted right by bits * ((8h + j) % per). */
KV_INT_INLINE void decode_v(const uint32_t *codes, const float *ps,
                            const float *pm, uint32_t d, uint32_t bits,
                            uint32_t lo, uint32_t hi, float *out)
{
    const uint32_t per = 32u / bits, mask = (1u << bits) - 1u;
    const uint32_t nw = bits / 2u, ng = d / 16u; /* words/group, groups */
    const kv_int_u32x8 zero = {0};
    const kv_int_f32x8 one = (kv_int_f32x8){0} + 1.0f;
    kv_int_u32x8 sh0, sh1; /* constants once unrolled */
    for (uint32_t j = 0; j < 8; j++) {
        sh0[j] = bits * (j % per);
        sh1[j] = bits * ((8u + j) % per);
    }
    for (uint32_t t = lo; t < hi; t++) {
        float *o = out + (size_t)(t - lo) * d;
        for (uint32_t cg = 0; cg < ng; cg++) {
            const uint32_t *w = codes + ((size_t)t * ng + cg) * nw;
            /* one * x broadcasts x exactly (also -0) */
            const kv_int_f32x8 sv = one * ps[t * ng + cg];
            const kv_int_f32x8 mv = one * pm[t * ng + cg];
            KV_INT_DEQUANT(o + (size_t)cg * 16, ((zero + w[0]) >> sh0) & mask,
                           sv, mv);
            KV_INT_DEQUANT(o + (size_t)cg * 16 + 8,
                           ((zero + w[8u / per]) >> sh1) & mask, sv, mv);
        }
    }
}

/* Tokens [t0, t0+n) of a page, group by group. The FP16 scale/min of a
 * group (K then V, adjacent in the block) are converted to FP32 with one
 * call, then its codes are decoded. */
KV_INT_INLINE void int_load_body(uint32_t bits, const void *page,
                                 const kv_page_geom_t *g, uint32_t t0,
                                 uint32_t n, float *k, float *v)
{
    const uint32_t d = g->head_dim;
    assert((uint64_t)t0 + n <= int_tokens_per_page(g, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    /* [4][d]: K scale, K min, V scale, V min of the current group */
    float par[4 * KV_INT_MAX_DIM];
    const uint32_t p0 = k ? 0 : 2, p1 = v ? 4 : 2; /* rows of par needed */
    const uint32_t par_off = k ? l.k_scale : l.v_scale;
    uint32_t t = t0, end = t0 + n;
    while (t < end) {
        uint32_t grp = t / KV_FMT_INT_GROUP, lo = t % KV_FMT_INT_GROUP;
        uint32_t hi = KV_FMT_INT_GROUP;
        if (end - grp * KV_FMT_INT_GROUP < hi)
            hi = end - grp * KV_FMT_INT_GROUP;
        const uint8_t *blk = (const uint8_t *)page + (size_t)grp * l.group_bytes;
        size_t row = (size_t)(t - t0) * d;
        kv_half_to_float_n((const kv_half_t *)(const void *)(blk + par_off),
                           par + (size_t)p0 * d, (size_t)(p1 - p0) * d);
        if (k)
            decode_k((const uint32_t *)(const void *)(blk + l.k_codes), par,
                     par + d, d, bits, lo, hi, k + row);
        if (v)
            decode_v((const uint32_t *)(const void *)(blk + l.v_codes),
                     par + 2 * (size_t)d, par + 3 * (size_t)d, d, bits, lo, hi,
                     v + row);
        t += hi - lo;
    }
}

/* The body instantiated per format (b: its bits, a constant), portable
 * and, on x86, AVX2. */
#define KV_INT_LOADERS(fmt, b)                                               \
    static void load_##fmt##_base(const void *page, const kv_page_geom_t *g, \
                                  uint32_t t0, uint32_t n, float *k,         \
                                  float *v)                                  \
    {                                                                        \
        int_load_body(b##u, page, g, t0, n, k, v);                           \
    }                                                                        \
    KV_INT_AVX2_LOADER(fmt, b)

#ifdef KV_INT_X86
#define KV_INT_AVX2_LOADER(fmt, b)                                           \
    __attribute__((target("avx2"))) static void load_##fmt##_avx2(           \
        const void *page, const kv_page_geom_t *g, uint32_t t0, uint32_t n,  \
        float *k, float *v)                                                  \
    {                                                                        \
        int_load_body(b##u, page, g, t0, n, k, v);                           \
    }

/* 1 if the CPU has AVX2. Probed once; a race only repeats the probe. */
static int have_avx2(void)
{
    static _Atomic int cached = -1;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx2") ? 1 : 0;
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c;
}
#define KV_INT_PICK(fmt) (have_avx2() ? load_##fmt##_avx2 : load_##fmt##_base)
#else
#define KV_INT_AVX2_LOADER(fmt, b)
#define KV_INT_PICK(fmt) load_##fmt##_base
#endif

KV_INT_LOADERS(int4, 4)
KV_INT_LOADERS(int2, 2)

/* ---- store --------------------------------------------------------------- */

/* dst[0..cnt) = source row r, channels c0..c0+cnt-1, as FP32. */
static void src_row(kv_dtype_t dtype, const void *src, size_t stride,
                    uint32_t r, uint32_t c0, uint32_t cnt, float *dst)
{
    size_t at = (size_t)r * stride + c0;
    if (dtype == KV_DTYPE_F32) {
        memcpy(dst, (const float *)src + at, cnt * sizeof *dst);
    } else {
        assert(dtype == KV_DTYPE_F16);
        kv_half_to_float_n((const kv_half_t *)src + at, dst, cnt);
    }
}

/* One group block from source rows r0..r0+15. */
KV_INT_INLINE void encode_group(uint32_t bits, uint8_t *blk,
                                const kv_fmt_int_layout_t *l, uint32_t d,
                                kv_dtype_t dtype, const void *k,
                                const void *v, size_t stride, uint32_t r0)
{
    const uint32_t nw = bits / 2u, ng = d / 16u;
    float buf[16][KV_INT_CHUNK];
    if (k) {
        uint32_t *codes = (uint32_t *)(void *)(blk + l->k_codes);
        kv_half_t *ks = (kv_half_t *)(void *)(blk + l->k_scale);
        kv_half_t *km = (kv_half_t *)(void *)(blk + l->k_min);
        for (uint32_t c0 = 0; c0 < d; c0 += KV_INT_CHUNK) {
            uint32_t cw = d - c0 < KV_INT_CHUNK ? d - c0 : KV_INT_CHUNK;
            for (uint32_t j = 0; j < 16; j++)
                src_row(dtype, k, stride, r0 + j, c0, cw, buf[j]);
            for (uint32_t c = 0; c < cw; c++)
                kv_fmt_codec_quantize16(bits, &buf[0][c], KV_INT_CHUNK,
                                        codes + c0 + c, d, ks + c0 + c,
                                        km + c0 + c);
        }
    }
    if (v) {
        uint32_t *codes = (uint32_t *)(void *)(blk + l->v_codes);
        kv_half_t *vs = (kv_half_t *)(void *)(blk + l->v_scale);
        kv_half_t *vm = (kv_half_t *)(void *)(blk + l->v_min);
        for (uint32_t j = 0; j < 16; j++)
            for (uint32_t c0 = 0; c0 < d; c0 += KV_INT_CHUNK) {
                uint32_t cw = d - c0 < KV_INT_CHUNK ? d - c0 : KV_INT_CHUNK;
                src_row(dtype, v, stride, r0 + j, c0, cw, buf[0]);
                for (uint32_t c = 0; c < cw; c += 16) {
                    size_t gi = (size_t)j * ng + (c0 + c) / 16u;
                    kv_fmt_codec_quantize16(bits, &buf[0][c], 1,
                                            codes + gi * nw, 1, vs + gi,
                                            vm + gi);
                }
            }
    }
}

/* Whole groups [t0, t0+n); inlined into each entry (bits a constant). */
KV_INT_INLINE void int_store(uint32_t bits, void *page,
                             const kv_page_geom_t *g, uint32_t t0, uint32_t n,
                             kv_dtype_t dtype, const void *k, const void *v,
                             size_t src_stride)
{
    const uint32_t d = g->head_dim;
    if (t0 % KV_FMT_INT_GROUP != 0 || n % KV_FMT_INT_GROUP != 0 ||
        (uint64_t)t0 + n > int_tokens_per_page(g, bits) || src_stride < d) {
        assert(0 && "INT store: t0, n must be whole groups within the page");
        return; /* NDEBUG: write nothing */
    }
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    for (uint32_t r = 0; r < n; r += KV_FMT_INT_GROUP) {
        uint8_t *blk = (uint8_t *)page +
                       (size_t)((t0 + r) / KV_FMT_INT_GROUP) * l.group_bytes;
        encode_group(bits, blk, &l, d, dtype, k, v, src_stride, r);
    }
}

/* ---- attention straight from the codes --------------------------------- */

/* 16 lanes = one quantization group (one AVX-512 register, two AVX2 ones,
 * four SSE2 ones). */
typedef float kv_int_f32x16 __attribute__((vector_size(64)));
typedef int32_t kv_int_i32x16 __attribute__((vector_size(64)));
typedef uint32_t kv_int_u32x16 __attribute__((vector_size(64)));
typedef float kv_int_f32x16_m __attribute__((vector_size(64), aligned(4)));

/* Most query rows that share one unpacking of the codes (two partial sums
 * per row in registers; kv_int_isa_t.rows is the build's own limit). Loops
 * over them are unrolled (R is a constant in each instance), so that the
 * partial sums live in registers. */
#define KV_INT_ROWS 4u
#define KV_INT_CGS  4u /* most V channel groups per pass (see accum_block) */
#define KV_INT_UNROLL_ROWS _Pragma("GCC unroll 4")

/* What differs between the builds of the attention steps (a constant in
 * each): how codes become FP32 lanes, how FP16 scale/min become FP32, how
 * many rows share the unpacked codes (what the registers hold). None of it
 * changes a row's operations: every build gives the same bits. */
typedef struct kv_int_isa {
    uint32_t rows; /* 1..KV_INT_ROWS                                     */
    uint32_t cgs;  /* 1..KV_INT_CGS: V channel groups accumulated at once */
    /* 1: a code is a table lookup (the shifted word's low 4 bits index 16
     * FP32 lanes: one permute, vpermps); 0: mask and convert. Same values.
     * GCC only (a variable __builtin_shuffle). */
    int lut;
    void (*to_float)(const kv_half_t *src, float *dst, size_t n);
} kv_int_isa_t;

/* How one op call unpacks codes (built once per call). */
typedef struct kv_int_codes {
    uint32_t bits;     /* 2 or 4                                       */
    int lut;           /* kv_int_isa_t.lut                             */
    kv_int_u32x16 sh;  /* lane j: bits * (j % (32 / bits))             */
    kv_int_f32x16 tbl; /* lane i: i & (2^bits - 1), as FP32 (lut)      */
} kv_int_codes_t;

KV_INT_INLINE void codes_init(kv_int_codes_t *u, uint32_t bits, int lut)
{
    u->bits = bits;
    u->lut = lut;
    for (uint32_t j = 0; j < 16; j++) {
        u->sh[j] = bits * (j % (32u / bits));
        u->tbl[j] = (float)(j & ((1u << bits) - 1u));
    }
}

/* x = the 16 codes of one group member, dequantized: lane j = code j *
 * scale + min, one fused multiply-add. The member's words: w[0] (INT4 also
 * w[stride] for codes 8..15): K, one channel (word planes D apart); V, one
 * token's 16-channel group (adjacent words). */
KV_INT_INLINE void dequant16(kv_int_f32x16 *x, const uint32_t *w,
                             size_t stride, const kv_int_codes_t *u,
                             float scale, float min)
{
    const kv_int_u32x16 zero = {0};
    kv_int_u32x16 wv = zero + w[0];
    if (u->bits == 4u) { /* lanes 8..15 from the second word (a blend) */
        const kv_int_u32x16 hi = {0, 0, 0, 0, 0, 0, 0, 0, ~0u, ~0u, ~0u,
                                  ~0u, ~0u, ~0u, ~0u, ~0u};
        wv = (wv & ~hi) | ((zero + w[stride]) & hi);
    }
    wv >>= u->sh;
    kv_int_f32x16 c;
#if defined(__GNUC__) && !defined(__clang__)
    if (u->lut) /* index taken mod 16: the low 4 bits */
        c = __builtin_shuffle(u->tbl, (kv_int_i32x16)wv);
    else
#endif
        c = __builtin_convertvector(
            (kv_int_i32x16)(wv & ((1u << u->bits) - 1u)), kv_int_f32x16);
    for (int i = 0; i < 16; i++)
        (*x)[i] = __builtin_fmaf(c[i], scale, min);
}

/* *acc += a * x lane-wise, fused (one rounding). */
KV_INT_INLINE void fma16_in(kv_int_f32x16 *acc, float a,
                            const kv_int_f32x16 *x)
{
    for (int i = 0; i < 16; i++)
        (*acc)[i] = __builtin_fmaf(a, (*x)[i], (*acc)[i]);
}

/* Logits of R query rows (q row r at q + r * qs) for the 16 tokens of one
 * group block: out[r] lane j = q_r . k^_j. ks/km: the group's K scale/min
 * (FP32, [D]). Addresses advance by increments (no per-row index math in
 * the loop: scalar ops would take the vector ports). */
KV_INT_INLINE void score_group(const uint32_t *codes, const float *ks,
                               const float *km, uint32_t d,
                               const kv_int_codes_t *u, const float *q,
                               size_t qs, uint32_t R, kv_int_f32x16 *out)
{
    kv_int_f32x16 a[KV_INT_ROWS], b[KV_INT_ROWS]; /* even, odd channels */
    const float *qr[KV_INT_ROWS];
    KV_INT_UNROLL_ROWS
    for (uint32_t r = 0; r < R; r++) {
        a[r] = (kv_int_f32x16){0};
        b[r] = a[r];
        qr[r] = q + r * qs;
    }
    for (uint32_t c = 0; c < d; c += 2) {
        kv_int_f32x16 x, y;
        dequant16(&x, codes + c, d, u, ks[c], km[c]);
        dequant16(&y, codes + c + 1, d, u, ks[c + 1], km[c + 1]);
        KV_INT_UNROLL_ROWS
        for (uint32_t r = 0; r < R; r++) {
            fma16_in(&a[r], qr[r][c], &x);
            fma16_in(&b[r], qr[r][c + 1], &y);
        }
    }
    KV_INT_UNROLL_ROWS
    for (uint32_t r = 0; r < R; r++)
        out[r] = a[r] + b[r];
}

/* acc row r (at acc + r * as) += sum over tokens lo..hi-1 of one group block
 * of p_r[t] * v^_t on channel groups cg0 .. cg0+C-1, for R rows (R, C
 * constants: R * C partial sums in registers, each a chain over the tokens
 * in order); p row r at pr[r], its element 0 = token lo. vs/vm: the group's
 * V scale/min (FP32, [16][ng]). */
KV_INT_INLINE void accum_block(const uint32_t *codes, const float *vs,
                               const float *vm, uint32_t ng,
                               const kv_int_codes_t *u, uint32_t lo,
                               uint32_t hi, const float *const *pr,
                               uint32_t R, uint32_t C, uint32_t cg0,
                               float *acc, size_t as)
{
    const uint32_t nw = u->bits / 2u;
    kv_int_f32x16 a[KV_INT_ROWS][KV_INT_CGS];
    KV_INT_UNROLL_ROWS
    for (uint32_t r = 0; r < R; r++)
        KV_INT_UNROLL_ROWS
        for (uint32_t k = 0; k < C; k++)
            a[r][k] = (kv_int_f32x16){0};
    const uint32_t *w = codes + ((size_t)lo * ng + cg0) * nw;
    const float *sv = vs + (size_t)lo * ng + cg0;
    const float *mv = vm + (size_t)lo * ng + cg0;
    for (uint32_t i = 0; i < hi - lo; i++, w += (size_t)ng * nw, sv += ng,
                  mv += ng) {
        kv_int_f32x16 x[KV_INT_CGS];
        KV_INT_UNROLL_ROWS
        for (uint32_t k = 0; k < C; k++)
            dequant16(&x[k], w + (size_t)k * nw, 1, u, sv[k], mv[k]);
        KV_INT_UNROLL_ROWS
        for (uint32_t r = 0; r < R; r++) {
            const float pv = pr[r][i];
            KV_INT_UNROLL_ROWS
            for (uint32_t k = 0; k < C; k++)
                fma16_in(&a[r][k], pv, &x[k]);
        }
    }
    KV_INT_UNROLL_ROWS
    for (uint32_t r = 0; r < R; r++)
        KV_INT_UNROLL_ROWS
        for (uint32_t k = 0; k < C; k++) {
            kv_int_f32x16_m *o =
                (kv_int_f32x16_m *)(acc + r * as + 16u * (cg0 + k));
            *o = *o + a[r][k];
        }
}

/* accum_block over all channel groups of a group block: blocks of the
 * build's `cgs`, then single ones. */
KV_INT_INLINE void accum_group(const uint32_t *codes, const float *vs,
                               const float *vm, uint32_t d,
                               const kv_int_codes_t *u, uint32_t cgs,
                               uint32_t lo, uint32_t hi, const float *p,
                               size_t ps, uint32_t R, float *acc, size_t as)
{
    const uint32_t ng = d / 16u;
    const float *pr[KV_INT_ROWS];
    KV_INT_UNROLL_ROWS
    for (uint32_t r = 0; r < R; r++)
        pr[r] = p + r * ps;
    uint32_t cg = 0;
    for (; cgs > 1 && cg + cgs <= ng; cg += cgs)
        accum_block(codes, vs, vm, ng, u, lo, hi, pr, R, cgs, cg, acc, as);
    for (; cg < ng; cg++)
        accum_block(codes, vs, vm, ng, u, lo, hi, pr, R, 1, cg, acc, as);
}

/* Rows r0 .. r0+nr-1 (nr <= kv_int_isa_t.rows) of one group: R a constant in each
 * case, so the partial sums stay in registers. */
#define KV_INT_ROW_CASES(call)                                               \
    switch (nr) {                                                            \
    case 4: call(4u); break;                                                 \
    case 3: call(3u); break;                                                 \
    case 2: call(2u); break;                                                 \
    default: call(1u); break;                                                \
    }

/* The group of token t of a range ending at `end`: its block, and the
 * range's tokens in it, lo..hi-1 (group-relative). */
KV_INT_INLINE const uint8_t *range_group(const void *page,
                                         const kv_fmt_int_layout_t *l,
                                         uint32_t t, uint32_t end,
                                         uint32_t *lo, uint32_t *hi)
{
    const uint32_t grp = t / KV_FMT_INT_GROUP, g0 = grp * KV_FMT_INT_GROUP;
    *lo = t - g0;
    *hi = end - g0 < KV_FMT_INT_GROUP ? end - g0 : KV_FMT_INT_GROUP;
    return (const uint8_t *)page + (size_t)grp * l->group_bytes;
}

KV_INT_INLINE void int_score_body(uint32_t bits, const kv_int_isa_t *isa,
                                  const void *page, const kv_page_geom_t *g,
                                  uint32_t t0, uint32_t n, const float *q,
                                  size_t q_stride, uint32_t n_rows, float *s,
                                  size_t s_stride)
{
    const uint32_t d = g->head_dim;
    assert((uint64_t)t0 + n <= int_tokens_per_page(g, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    float par[2 * KV_INT_MAX_DIM]; /* K scale, K min of the current group */
    kv_int_codes_t u;
    codes_init(&u, bits, isa->lut);
    for (uint32_t t = t0, lo, hi; t < t0 + n; t += hi - lo) {
        const uint8_t *blk = range_group(page, &l, t, t0 + n, &lo, &hi);
        const uint32_t *codes =
            (const uint32_t *)(const void *)(blk + l.k_codes);
        isa->to_float((const kv_half_t *)(const void *)(blk + l.k_scale), par,
                      2 * (size_t)d);
        for (uint32_t r0 = 0; r0 < n_rows; r0 += isa->rows) {
            const uint32_t nr =
                n_rows - r0 < isa->rows ? n_rows - r0 : isa->rows;
            kv_int_f32x16 lg[KV_INT_ROWS];
#define KV_INT_SCORE(R)                                                      \
    score_group(codes, par, par + d, d, &u, q + r0 * q_stride, q_stride, R,  \
                lg)
            KV_INT_ROW_CASES(KV_INT_SCORE)
#undef KV_INT_SCORE
            for (uint32_t r = 0; r < nr; r++) {
                float *o = s + (r0 + r) * s_stride + (t - t0);
                if (hi - lo == KV_FMT_INT_GROUP) {
                    *(kv_int_f32x16_m *)o = lg[r];
                } else {
                    float tmp[16];
                    memcpy(tmp, &lg[r], sizeof tmp);
                    memcpy(o, tmp + lo, (hi - lo) * sizeof *tmp);
                }
            }
        }
    }
}

KV_INT_INLINE void int_accum_body(uint32_t bits, const kv_int_isa_t *isa,
                                  const void *page, const kv_page_geom_t *g,
                                  uint32_t t0, uint32_t n, const float *p,
                                  size_t p_stride, uint32_t n_rows,
                                  float *acc, size_t acc_stride)
{
    const uint32_t d = g->head_dim;
    assert((uint64_t)t0 + n <= int_tokens_per_page(g, bits));
    const kv_fmt_int_layout_t l = kv_fmt_int_layout(d, bits);
    float par[2 * KV_INT_MAX_DIM]; /* V scale, V min of the current group */
    kv_int_codes_t u;
    codes_init(&u, bits, isa->lut);
    for (uint32_t t = t0, lo, hi; t < t0 + n; t += hi - lo) {
        const uint8_t *blk = range_group(page, &l, t, t0 + n, &lo, &hi);
        const uint32_t *codes =
            (const uint32_t *)(const void *)(blk + l.v_codes);
        isa->to_float((const kv_half_t *)(const void *)(blk + l.v_scale), par,
                      2 * (size_t)d);
        for (uint32_t r0 = 0; r0 < n_rows; r0 += isa->rows) {
            const uint32_t nr =
                n_rows - r0 < isa->rows ? n_rows - r0 : isa->rows;
#define KV_INT_ACCUM(R)                                                      \
    accum_group(codes, par, par + d, d, &u, isa->cgs, lo, hi,                \
                p + r0 * p_stride + (t - t0), p_stride, R,                   \
                acc + r0 * acc_stride, acc_stride)
            KV_INT_ROW_CASES(KV_INT_ACCUM)
#undef KV_INT_ACCUM
        }
    }
}

/* One build of the two steps of one format (bits), with the build's target
 * attribute and kv_int_isa_t; KV_INT_ATTN_BUILD makes both formats'. */
#define KV_INT_ATTN_STEPS(sfx, attr, isa, b)                                 \
    attr static void score##b##_##sfx(                                       \
        const void *page, const kv_page_geom_t *g, uint32_t t0, uint32_t n,  \
        const float *q, size_t qs, uint32_t nr, float *s, size_t ss)         \
    {                                                                        \
        int_score_body(b##u, &isa, page, g, t0, n, q, qs, nr, s, ss);        \
    }                                                                        \
    attr static void accum##b##_##sfx(                                       \
        const void *page, const kv_page_geom_t *g, uint32_t t0, uint32_t n,  \
        const float *p, size_t ps, uint32_t nr, float *acc, size_t as)       \
    {                                                                        \
        int_accum_body(b##u, &isa, page, g, t0, n, p, ps, nr, acc, as);      \
    }
#define KV_INT_ATTN_BUILD(sfx, attr, isa)                                    \
    KV_INT_ATTN_STEPS(sfx, attr, isa, 4)                                     \
    KV_INT_ATTN_STEPS(sfx, attr, isa, 2)

#define KV_INT_ATTN_ENTRY(sfx, name)                                         \
    {                                                                        \
        .isa = name, .score = {score4_##sfx, score2_##sfx},                  \
        .accum = {accum4_##sfx, accum2_##sfx},                               \
    }

static const kv_int_isa_t isa_portable = {
    .rows = 1, .cgs = 1, .lut = 0, .to_float = kv_half_to_float_n};
KV_INT_ATTN_BUILD(portable, , isa_portable)

#ifdef KV_INT_X86
/* FP16 -> FP32, n a multiple of 16: vcvtph2ps on 16 lanes (exact, like
 * kv_half_to_float_n). */
__attribute__((target("avx512f"))) static void
half_to_float_avx512(const kv_half_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(dst + i,
                         _mm512_cvtph_ps(_mm256_loadu_si256(
                             (const __m256i *)(const void *)(src + i))));
}

static const kv_int_isa_t isa_avx2 = {
    .rows = 4, .cgs = 2, .lut = 0, .to_float = kv_half_to_float_n};
static const kv_int_isa_t isa_avx512 = {
    .rows = 4, .cgs = 4, .lut = 1, .to_float = half_to_float_avx512};
KV_INT_ATTN_BUILD(avx2, __attribute__((target("avx2,fma"))), isa_avx2)
KV_INT_ATTN_BUILD(avx512, __attribute__((target("avx512f,fma"))), isa_avx512)

static const kv_fmt_int_attn_impl_t attn_impls[] = {
    KV_INT_ATTN_ENTRY(portable, "portable"),
    KV_INT_ATTN_ENTRY(avx2, "avx2"),
    KV_INT_ATTN_ENTRY(avx512, "avx512"),
};

/* Builds the CPU runs: portable, + AVX2 with FMA, + AVX-512F. Probed once;
 * a race only repeats the probe. */
static uint32_t attn_usable(void)
{
    static _Atomic int cached = -1;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c < 0) {
        __builtin_cpu_init();
        c = 1;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            c = 2;
            if (__builtin_cpu_supports("avx512f"))
                c = 3;
        }
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return (uint32_t)c;
}
#else
static const kv_fmt_int_attn_impl_t attn_impls[] = {
    KV_INT_ATTN_ENTRY(portable, "portable"),
};
static uint32_t attn_usable(void)
{
    return 1;
}
#endif

const kv_fmt_int_attn_impl_t *kv_fmt_int_attn_impls(uint32_t *n)
{
    *n = attn_usable();
    return attn_impls;
}

static const kv_fmt_int_attn_impl_t *attn_best(void)
{
    return &attn_impls[attn_usable() - 1];
}

/* ---- the entries ----------------------------------------------------------- */

uint32_t kv_fmt_int4_tokens_per_page(const kv_page_geom_t *g)
{
    return int_tokens_per_page(g, 4u);
}
uint32_t kv_fmt_int2_tokens_per_page(const kv_page_geom_t *g)
{
    return int_tokens_per_page(g, 2u);
}

void kv_fmt_int4_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v)
{
    KV_INT_PICK(int4)(page, g, t0, n, k, v);
}
void kv_fmt_int2_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v)
{
    KV_INT_PICK(int2)(page, g, t0, n, k, v);
}

void kv_fmt_int4_attn_score(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *q,
                            size_t q_stride, uint32_t n_rows, float *s,
                            size_t s_stride)
{
    attn_best()->score[0](page, g, t0, n, q, q_stride, n_rows, s, s_stride);
}
void kv_fmt_int2_attn_score(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *q,
                            size_t q_stride, uint32_t n_rows, float *s,
                            size_t s_stride)
{
    attn_best()->score[1](page, g, t0, n, q, q_stride, n_rows, s, s_stride);
}
void kv_fmt_int4_attn_accum(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *p,
                            size_t p_stride, uint32_t n_rows, float *acc,
                            size_t acc_stride)
{
    attn_best()->accum[0](page, g, t0, n, p, p_stride, n_rows, acc,
                          acc_stride);
}
void kv_fmt_int2_attn_accum(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *p,
                            size_t p_stride, uint32_t n_rows, float *acc,
                            size_t acc_stride)
{
    attn_best()->accum[1](page, g, t0, n, p, p_stride, n_rows, acc,
                          acc_stride);
}

void kv_fmt_int4_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride)
{
    int_store(4u, page, g, t0, n, dtype, k, v, src_stride);
}
void kv_fmt_int2_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride)
{
    int_store(2u, page, g, t0, n, dtype, k, v, src_stride);
}

const kv_format_traits_t kv_fmt_int4 = KV_FMT_INT4_TRAITS;
const kv_format_traits_t kv_fmt_int2 = KV_FMT_INT2_TRAITS;
