/* SPDX-License-Identifier: MIT */
/*
 * kv_fmt_layout.h — where every byte of a page is, for every format: the one
 * definition of the page layouts (sizes and offsets). The C codecs
 * (kv_fmt_fp16.c, kv_fmt_int.c, kv_fmt_merged.c), the element math
 * (kv_fmt_codec.h), the CPU attention steps (kernels/cpu/) and the CUDA
 * kernels all compute offsets with these functions; nothing else restates a
 * layout. What the bytes MEAN (quantization, merging) is specified in each
 * format's header; this file is only geometry.
 *
 * Everything is `static inline KV_HD` (`__host__ __device__` under nvcc,
 * nothing in C) and depends on nothing but <stdint.h>, <stddef.h> and the
 * format numbers of kvpage/kvpage.h. D = head_dim, pb = page_bytes, all
 * offsets in bytes, all integers little-endian.
 *
 * FP16 (KV_FMT_FP16 = 0), T = floor(pb / 4D) tokens:
 *   +0        K rows  binary16 [T][D]   token-major
 *   +2TD      V rows  binary16 [T][D]
 *   +4TD      unused up to pb
 *   No header: the page table records the format and the rows in use.
 *
 * INT4 / INT2 (KV_FMT_INT4 = 1, KV_FMT_INT2 = 2), b = 4 or 2 bits per code,
 * W = b/2 code words per 16 codes, P = 32/b codes per word; D a multiple of
 * 16 in 16..KV_FMT_MAX_DIM. The page is G = floor(pb / GB) group blocks,
 * group-major: tokens 16g .. 16g+15 live in the block at g * GB,
 * GB = 2D(2b + 4) (16D for INT2, 24D for INT4); T = 16G. Inside a block:
 *   +0          K codes  uint32 [W][D]         word w*D + c: the codes of
 *                                              channel c for tokens
 *                                              16g + P*w .. (word plane w)
 *   +2bD        V codes  uint32 [16][D/16][W]  token t, channel group cg:
 *                                              words (t*(D/16) + cg)*W ..
 *   +4bD        K scale  binary16 [D]          per channel
 *   +4bD + 2D   K min    binary16 [D]          per channel
 *   +4bD + 4D   V scale  binary16 [16][D/16]   per (token, channel group)
 *   +4bD + 6D   V min    binary16 [16][D/16]
 *   +4bD + 8D   end of block (= GB)
 *   Code j of a group's 16 (token j for K, channel 16cg + j for V) sits in
 *   word j / P at bits b(j % P) .. b(j % P) + b - 1 (least significant
 *   first). Codes first, then the four parameter arrays adjacent (one
 *   FP16 -> FP32 conversion per group when K and V are both decoded).
 *   Every word offset is a multiple of 4 (D is a multiple of 16); bytes from
 *   G * GB to pb are unused. No header.
 *
 * MERGED (KV_FMT_MERGED = 3), T slots, R bytes per direction row:
 *   +0             header, 16 bytes: uint32 dir_format (KV_FMT_FP16 or
 *                  KV_FMT_INT4), uint32 head_dim (D), uint32 reserved[2] 0
 *   +16            mag   float32 [T][4]  per slot: K lower, K upper,
 *                                        V lower, V upper
 *   +16 + 16T      K directions [T] rows of R bytes
 *   +16 + 16T + TR V directions [T] rows of R bytes
 *   T = floor((pb - 16) / (16 + 2R)); the rest of the page is unused.
 *   A direction row: FP16 directions: binary16 [D], R = 2D; INT4
 *   directions: uint32 codes [D/8] (channel c in word c/8 at bits
 *   4(c%8)..+3), binary16 scale [D/16], binary16 min [D/16], R = 3D/4.
 */
#ifndef KV_FMT_LAYOUT_H
#define KV_FMT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h" /* the format numbers (kv_format_t) */

#if defined(__CUDACC__)
#define KV_HD __host__ __device__
#else
#define KV_HD
#endif

#ifdef __cplusplus
#define KV_FMT_STATIC_ASSERT(c, msg) static_assert(c, msg)
#else
#define KV_FMT_STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#endif

/* Largest head_dim the INT and MERGED formats take (the store's limit; it
 * bounds the codecs' stack scratch). */
#define KV_FMT_MAX_DIM 1024u

/* ---- FP16 ---------------------------------------------------------------- */

/* Tokens per page (0 when d is 0 or the page holds none). */
static inline KV_HD uint32_t kv_fmt_fp16_tpp(uint32_t d, uint32_t pb)
{
    return d ? (uint32_t)((uint64_t)pb / (4ull * d)) : 0u;
}

/* Bytes of the K and V rows of t tokens: the smallest page holding t. */
static inline KV_HD uint64_t kv_fmt_fp16_bytes(uint32_t d, uint64_t t)
{
    return 4ull * d * t;
}

/* Offset of token t's K row / V row in a page of tpp tokens. */
static inline KV_HD size_t kv_fmt_fp16_k_row(uint32_t d, uint32_t t)
{
    return (size_t)t * d * 2u;
}
static inline KV_HD size_t kv_fmt_fp16_v_row(uint32_t d, uint32_t tpp,
                                             uint32_t t)
{
    return ((size_t)tpp + t) * d * 2u;
}

/* ---- INT4 / INT2 --------------------------------------------------------- */

#define KV_FMT_INT_GROUP 16u /* tokens (K) or channels (V) per group */

/* Bytes of one 16-token group block for head_dim d at b bits (a macro:
 * the static checks below need a constant expression). */
#define KV_FMT_INT_GROUP_BYTES(d, b) (2u * (d) * (2u * (b) + 4u))

KV_FMT_STATIC_ASSERT(KV_FMT_INT_GROUP_BYTES(64u, 2u) == 1024u,
                     "INT2 group block, D=64: 1 KiB per 16 tokens");
KV_FMT_STATIC_ASSERT(KV_FMT_INT_GROUP_BYTES(64u, 4u) == 1536u,
                     "INT4 group block, D=64");
KV_FMT_STATIC_ASSERT(KV_FMT_INT_GROUP_BYTES(128u, 2u) == 2048u,
                     "INT2 group block, D=128");
KV_FMT_STATIC_ASSERT(KV_FMT_INT_GROUP_BYTES(128u, 4u) == 3072u,
                     "INT4 group block, D=128");
/* INT2: 4 groups (64 tokens) == 16 FP16 tokens (64*D bytes). */
KV_FMT_STATIC_ASSERT(4u * KV_FMT_INT_GROUP_BYTES(64u, 2u) == 16u * 4u * 64u,
                     "INT2 holds exactly 4x the tokens of FP16");
/* INT4: 8 groups (128 tokens) == 48 FP16 tokens (192*D bytes). */
KV_FMT_STATIC_ASSERT(8u * KV_FMT_INT_GROUP_BYTES(64u, 4u) == 48u * 4u * 64u,
                     "INT4 holds 8/3x the tokens of FP16");

/* Bits per code of an INT format number (KV_FMT_INT4: 4, else 2). */
static inline KV_HD uint32_t kv_fmt_int_bits(uint32_t fmt)
{
    return fmt == KV_FMT_INT4 ? 4u : 2u;
}

/* Offsets of the members of one group block (add g * group_bytes for
 * block g); see the layout above. */
typedef struct kv_fmt_int_layout {
    uint32_t group_bytes; /* GB: bytes per 16-token group block */
    uint32_t k_codes;     /* uint32 [W][D]                      */
    uint32_t v_codes;     /* uint32 [16][D/16][W]               */
    uint32_t k_scale;     /* binary16 [D]                       */
    uint32_t k_min;       /* binary16 [D]                       */
    uint32_t v_scale;     /* binary16 [16][D/16]                */
    uint32_t v_min;       /* binary16 [16][D/16]                */
} kv_fmt_int_layout_t;

static inline KV_HD kv_fmt_int_layout_t kv_fmt_int_layout(uint32_t d,
                                                          uint32_t bits)
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

/* Tokens per page: 16 * floor(pb / GB); 0 if d is not a multiple of 16 in
 * 16..KV_FMT_MAX_DIM. */
static inline KV_HD uint32_t kv_fmt_int_tpp(uint32_t d, uint32_t pb,
                                            uint32_t bits)
{
    if (d == 0 || d % KV_FMT_INT_GROUP != 0 || d > KV_FMT_MAX_DIM)
        return 0;
    return KV_FMT_INT_GROUP * (pb / KV_FMT_INT_GROUP_BYTES(d, bits));
}

/* ---- MERGED -------------------------------------------------------------- */

#define KV_FMT_MERGED_HEADER 16u /* bytes                       */
#define KV_FMT_MERGED_MAGS   4u  /* float32 magnitudes per slot */

/* Bytes of one direction row (K or V) of head_dim d. */
#define KV_FMT_MERGED_ROW_FP16(d) (2u * (d))
#define KV_FMT_MERGED_ROW_INT4(d) ((d) / 2u + (d) / 4u)
/* Bytes per slot: magnitudes + a K row + a V row. */
#define KV_FMT_MERGED_SLOT(row) (4u * KV_FMT_MERGED_MAGS + 2u * (row))

KV_FMT_STATIC_ASSERT(KV_FMT_MERGED_SLOT(KV_FMT_MERGED_ROW_FP16(64u)) == 272u,
                     "FP16 directions, D=64: 4D + 16 bytes per slot");
KV_FMT_STATIC_ASSERT(KV_FMT_MERGED_SLOT(KV_FMT_MERGED_ROW_INT4(64u)) == 112u,
                     "INT4 directions, D=64: 1.5D + 16 bytes per slot");
KV_FMT_STATIC_ASSERT(KV_FMT_MERGED_ROW_INT4(16u) % 4u == 0,
                     "INT4 rows keep uint32 codes 4-byte aligned");
/* D=64, 4 KiB pages: 15 slots (FP16 dirs) and 36 slots (INT4 dirs). */
KV_FMT_STATIC_ASSERT((4096u - KV_FMT_MERGED_HEADER) /
                             KV_FMT_MERGED_SLOT(KV_FMT_MERGED_ROW_FP16(64u)) ==
                         15u,
                     "FP16-direction capacity at D=64, 4 KiB");
KV_FMT_STATIC_ASSERT((4096u - KV_FMT_MERGED_HEADER) /
                             KV_FMT_MERGED_SLOT(KV_FMT_MERGED_ROW_INT4(64u)) ==
                         36u,
                     "INT4-direction capacity at D=64, 4 KiB");

/* Bytes of a direction row for dir_format (KV_FMT_FP16 or KV_FMT_INT4);
 * 0 for any other format or a d that is not a multiple of 16 in
 * 16..KV_FMT_MAX_DIM. */
static inline KV_HD uint32_t kv_fmt_merged_row(uint32_t d, uint32_t dirf)
{
    if (d < 16u || d > KV_FMT_MAX_DIM || d % 16u != 0)
        return 0;
    if (dirf == KV_FMT_FP16)
        return KV_FMT_MERGED_ROW_FP16(d);
    if (dirf == KV_FMT_INT4)
        return KV_FMT_MERGED_ROW_INT4(d);
    return 0;
}

/* Where things are in a MERGED page (cap 0: the geometry holds no slot). */
typedef struct kv_fmt_merged_layout {
    uint32_t cap;   /* T: slots                           */
    uint32_t row;   /* R: bytes per direction row         */
    size_t mag;     /* float32 [T][4]                     */
    size_t kdir;    /* K direction rows [T][R]            */
    size_t vdir;    /* V direction rows [T][R]            */
} kv_fmt_merged_layout_t;

static inline KV_HD kv_fmt_merged_layout_t
kv_fmt_merged_layout(uint32_t d, uint32_t pb, uint32_t dirf)
{
    kv_fmt_merged_layout_t l;
    l.row = kv_fmt_merged_row(d, dirf);
    l.cap = l.row && pb > KV_FMT_MERGED_HEADER
                ? (pb - KV_FMT_MERGED_HEADER) / KV_FMT_MERGED_SLOT(l.row)
                : 0u;
    l.mag = KV_FMT_MERGED_HEADER;
    l.kdir = l.mag + (size_t)l.cap * KV_FMT_MERGED_MAGS * 4u;
    l.vdir = l.kdir + (size_t)l.cap * l.row;
    return l;
}

/* Offset of magnitude w (0 K lower, 1 K upper, 2 V lower, 3 V upper) of
 * slot t. */
static inline KV_HD size_t kv_fmt_merged_mag(const kv_fmt_merged_layout_t *l,
                                             uint32_t t, uint32_t w)
{
    return l->mag + ((size_t)t * KV_FMT_MERGED_MAGS + w) * 4u;
}

/* Offset of slot t's K (which 0) or V (which 1) direction row. */
static inline KV_HD size_t kv_fmt_merged_dir(const kv_fmt_merged_layout_t *l,
                                             uint32_t which, uint32_t t)
{
    return (which ? l->vdir : l->kdir) + (size_t)t * l->row;
}

/* An INT4 direction row's pieces, from the row's start: codes [D/8]
 * uint32, scale [D/16] and min [D/16] binary16. */
static inline KV_HD uint32_t kv_fmt_merged_int4_scale(uint32_t d)
{
    return d / 2u;
}
static inline KV_HD uint32_t kv_fmt_merged_int4_min(uint32_t d)
{
    return d / 2u + d / 8u;
}

#endif /* KV_FMT_LAYOUT_H */
