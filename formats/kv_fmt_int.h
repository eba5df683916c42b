/*
 * kv_fmt_int.h — the INT4 and INT2 page formats (KV_FMT_INT4 = 1,
 * KV_FMT_INT2 = 2): KIVI/MiniKV asymmetric quantization in groups of 16.
 *
 * Quantization (b = bits, 2 or 4; L = 2^b - 1 levels above zero):
 *   KEYS   per channel, over a group of 16 consecutive tokens;
 *   VALUES per token,   over a group of 16 consecutive channels.
 *   scale = (max - min) / L, q = round(clamp((x - min) / scale, 0, L)),
 *   x^ = q * scale + min (FP32: one multiply, one add, never fused).
 *   scale and min are stored as IEEE binary16. min is rounded toward -inf
 *   and scale toward +inf, and codes are computed with the STORED values,
 *   so |x - x^| <= stored scale / 2 (up to FP32 rounding) for every element
 *   of a group whose values differ. A constant group (max == min) stores
 *   min = fp16(x) (round to nearest), scale = +-0 with the sign of min, and
 *   codes 0: it decodes bit-exactly to fp16(x), also -0 (x itself when x is
 *   an FP16 value, as appended data is).
 *
 * Code packing: codes are little-endian uint32 words; a group's 16 codes
 * take W = b/2 words and code j sits in word j / P at bits b*(j % P) ..
 * b*(j % P) + b - 1, P = 32 / b codes per word (least significant first):
 * INT2: 16 codes in one word, code j at bits 2j..2j+1;
 * INT4: codes 0..7 in the first word, 8..15 in the second, code j at bits
 * 4(j%8)..4(j%8)+3.
 *
 * Byte layout of one page (T = tokens per page, D = head_dim, a multiple of
 * 16; G = T / 16 groups; W = b / 2; all offsets in bytes):
 *
 *   The page is G group blocks, group-major: tokens 16g .. 16g+15 live in
 *   the block at g * GB, GB = 2*D*(2b + 4) (= 16*D for INT2, 24*D for INT4).
 *   Inside a block:
 *
 *   +0           K codes  uint32 [W][D]        word w*D + c: the codes of
 *                                              channel c for tokens
 *                                              16g + P*w .. (word plane w)
 *   +2bD         V codes  uint32 [16][D/16][W] token t, channel group cg:
 *                                              words (t*(D/16) + cg)*W ..,
 *                                              code j = channel 16cg + j
 *   +4bD         K scale  binary16 [D]         per channel
 *   +4bD + 2D    K min    binary16 [D]         per channel
 *   +4bD + 4D    V scale  binary16 [16][D/16]  per (token, channel group)
 *   +4bD + 6D    V min    binary16 [16][D/16]
 *   +4bD + 8D    end of block (= GB)
 *
 *   Codes first, then the four parameter arrays adjacent (one FP16->FP32
 *   conversion per group when K and V are both decoded).
 *
 *   Absolute offset of a block member: g * GB + (the offset above), for
 *   g < G. Bytes from G * GB to page_bytes are unused. No header: the page
 *   table records the format and the tokens in use. Every word offset is a
 *   multiple of 4 because D is a multiple of 16.
 *
 *   T = 16 * floor(page_bytes / GB); 0 if D is not a multiple of 16 in
 *   16..1024 (the store's head_dim range; it bounds the decoder's scratch).
 *   The page must be at least 4-byte aligned (pool pages are).
 *   Per 16 tokens: INT2 16*D bytes, INT4 24*D, FP16 64*D, so an INT2 page
 *   holds exactly 4x the tokens of an FP16 page of the same page_bytes and
 *   INT4 8/3x when page_bytes is a multiple of 192*D (otherwise floor).
 *   Cost per element: b bits of code + 32 bits of scale/min per 16 elements
 *   = b + 2 bits: INT2 g16 = 4 bits/element (4x smaller than FP16, not 8x),
 *   INT4 g16 = 6 bits/element.
 *
 * Reading (load): any token range [t0, t0+n) within the page (not only
 * whole groups), decoded to FP32 rows. Writing (store): PRECONDITION t0 and n multiples of 16 (whole
 * groups are quantized at once); a misaligned call asserts in debug builds
 * and writes nothing in NDEBUG builds. Inputs must be finite and within FP16
 * range (callers validate, as for every format); src_stride >= D. A list
 * tail that is not a whole group stays FP16 (KIVI), or the caller pads it.
 * copy is NULL: compaction decodes and re-encodes.
 *
 * Attention (attn_score / attn_accum, see kv_format.h) works on the codes of
 * a group in registers, 16 lanes at a time, and writes no FP32 rows:
 *   score: lanes = the group's 16 tokens; per channel c, the codes are
 *          unpacked (a shift per lane, then mask and convert or one table
 *          permute), k^ = code * scale_c + min_c
 *          (one fused multiply-add) and each query row adds q[c] * k^ (two
 *          partial sums, even and odd channels, added at the end);
 *   accum: lanes = one 16-channel group of a token; v^ = code * scale + min
 *          likewise, and each row's partial sum for the group adds p[t] * v^
 *          (tokens in order; up to four channel groups at a time), then is
 *          added to acc.
 * The unpacked codes are shared by up to four query rows at a time (a GQA
 * group). Every lane runs the same FP32 operation sequence whatever the
 * vector width, so the portable, AVX2 and AVX-512 builds of these steps give
 * identical bits (kv_fmt_int_attn_impls lists them, for tests).
 */
#ifndef KV_FMT_INT_H
#define KV_FMT_INT_H

#include <stdint.h>

#include "kv_format.h"
#include "kv_half.h"

#define KV_FMT_INT_GROUP 16u /* tokens (K) or channels (V) per group */

/* Bytes of one 16-token group block for head_dim d at b bits. */
#define KV_FMT_INT_GROUP_BYTES(d, b) (2u * (d) * (2u * (b) + 4u))

_Static_assert(sizeof(kv_half_t) == 2, "scale/min are 2-byte binary16");
_Static_assert(KV_FMT_INT_GROUP_BYTES(64u, 2u) == 1024u,
               "INT2 group block, D=64: 4 KiB of codes+params per 64 tokens");
_Static_assert(KV_FMT_INT_GROUP_BYTES(64u, 4u) == 1536u,
               "INT4 group block, D=64");
_Static_assert(KV_FMT_INT_GROUP_BYTES(128u, 2u) == 2048u,
               "INT2 group block, D=128");
_Static_assert(KV_FMT_INT_GROUP_BYTES(128u, 4u) == 3072u,
               "INT4 group block, D=128");
/* INT2: 4 groups (64 tokens) == one 16-token FP16 page (64*D bytes). */
_Static_assert(4u * KV_FMT_INT_GROUP_BYTES(64u, 2u) == 16u * 4u * 64u,
               "INT2 holds exactly 4x the tokens of FP16");
/* INT4: 8 groups (128 tokens) == 48 FP16 tokens (192*D bytes). */
_Static_assert(8u * KV_FMT_INT_GROUP_BYTES(64u, 4u) == 48u * 4u * 64u,
               "INT4 holds 8/3x the tokens of FP16");

/* Offsets (bytes) of the members of one group block; see the layout above. */
typedef struct kv_fmt_int_layout {
    uint32_t group_bytes; /* GB: bytes per 16-token group block         */
    uint32_t k_codes;     /* uint32 [W][D]                              */
    uint32_t v_codes;     /* uint32 [16][D/16][W]                       */
    uint32_t k_scale;     /* binary16 [D]                               */
    uint32_t k_min;       /* binary16 [D]                               */
    uint32_t v_scale;     /* binary16 [16][D/16]                        */
    uint32_t v_min;       /* binary16 [16][D/16]                        */
} kv_fmt_int_layout_t;

static inline kv_fmt_int_layout_t kv_fmt_int_layout(uint32_t d, uint32_t bits)
{
    kv_fmt_int_layout_t l;
    l.group_bytes = KV_FMT_INT_GROUP_BYTES(d, bits);
    l.k_codes = 0;
    l.v_codes = 2u * bits * d;
    l.k_scale = 4u * bits * d;
    l.k_min = l.k_scale + 2u * d;
    l.v_scale = l.k_min + 2u * d;
    l.v_min = l.v_scale + 2u * d;
    return l;
}

/* The traits entries (also kv_format_table[KV_FMT_INT4 / KV_FMT_INT2]). */
extern const kv_format_traits_t kv_fmt_int4;
extern const kv_format_traits_t kv_fmt_int2;

/* The per-format functions behind the entries (kv_fmt_int.c). */
uint32_t kv_fmt_int4_tokens_per_page(const kv_page_geom_t *g);
uint32_t kv_fmt_int2_tokens_per_page(const kv_page_geom_t *g);
void kv_fmt_int4_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_int2_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_int4_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
void kv_fmt_int2_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
void kv_fmt_int4_attn_score(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *q,
                            size_t q_stride, uint32_t n_rows, float *s,
                            size_t s_stride);
void kv_fmt_int2_attn_score(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *q,
                            size_t q_stride, uint32_t n_rows, float *s,
                            size_t s_stride);
void kv_fmt_int4_attn_accum(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *p,
                            size_t p_stride, uint32_t n_rows, float *acc,
                            size_t acc_stride);
void kv_fmt_int2_attn_accum(const void *page, const kv_page_geom_t *g,
                            uint32_t t0, uint32_t n, const float *p,
                            size_t p_stride, uint32_t n_rows, float *acc,
                            size_t acc_stride);

/* One build of the attention steps (the entries call the best one the CPU
 * runs). For tests: every build must give the same bits. */
typedef struct kv_fmt_int_attn_impl {
    const char *isa; /* "portable", "avx2", "avx512" */
    void (*score[2])(const void *page, const kv_page_geom_t *g, uint32_t t0,
                     uint32_t n, const float *q, size_t q_stride,
                     uint32_t n_rows, float *s, size_t s_stride);
    void (*accum[2])(const void *page, const kv_page_geom_t *g, uint32_t t0,
                     uint32_t n, const float *p, size_t p_stride,
                     uint32_t n_rows, float *acc, size_t acc_stride);
} kv_fmt_int_attn_impl_t; /* [0]: INT4, [1]: INT2 */

/* The builds this CPU can run, best last; *n gets their number (>= 1). */
const kv_fmt_int_attn_impl_t *kv_fmt_int_attn_impls(uint32_t *n);

/* Initialisers of the two entries, for kv_format_table (kv_format.c) and
 * for kv_fmt_int4 / kv_fmt_int2 themselves: one definition of each entry.
 * KV_FMT_INT_TRAITS(b, note): the entry of INT<b> (b: 4 or 2). */
#define KV_FMT_INT_TRAITS(b, note)                                          \
    {                                                                       \
        .name = "int" #b, .bits_note = note,                                \
        .tokens_per_page = kv_fmt_int##b##_tokens_per_page,                 \
        .load = kv_fmt_int##b##_load, .store = kv_fmt_int##b##_store,       \
        .copy = NULL, .attn_score = kv_fmt_int##b##_attn_score,             \
        .attn_accum = kv_fmt_int##b##_attn_accum,                           \
    }
#define KV_FMT_INT4_TRAITS KV_FMT_INT_TRAITS(4, "INT4 g16 = 6 bits/element")
#define KV_FMT_INT2_TRAITS KV_FMT_INT_TRAITS(2, "INT2 g16 = 4 bits/element")

#endif /* KV_FMT_INT_H */
