/* SPDX-License-Identifier: MIT */
/*
 * kv_crc32c.c — CRC-32C, hardware (SSE4.2 crc32) and table (slicing-by-8).
 *
 * One loop body (kv_crc32c_body) serves both: it is always inlined into the
 * two entry points with a different pair of step functions (8 bytes at a
 * time, 1 byte at a time), so the hardware and table paths cannot drift
 * apart in how they walk the buffer. The running value inside the body is
 * the CRC register (the usual ~crc in, ~crc out convention).
 *
 * Speed: the crc32 instruction has a latency of 3 cycles and a throughput
 * of 1, so one stream uses a third of it. The body therefore runs three
 * independent streams over three adjacent blocks of KV_CRC_LONG (then
 * KV_CRC_SHORT) bytes and joins them with the "append n zero bytes"
 * operator: reg(s, A||B) = shift_|B|(reg(s, A)) ^ reg(0, B), where shift is
 * linear in the register and tabulated (4 x 256 entries per block size, as
 * in Mark Adler's crc32c.c). Tables are built once (pthread_once).
 *
 * Byte order: the 8-byte step loads words little-endian (memcpy), which is
 * what the reflected CRC wants on x86; the table step assumes it as well.
 */
#include "util/kv_crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define KV_CRC32C_X86 1
#endif

#define KV_CRC32C_POLY 0x82F63B78u
#define KV_CRC_LONG 1024u  /* bytes per stream, long rounds (a power of two)  */
#define KV_CRC_SHORT 128u  /* bytes per stream, short rounds (a power of two) */

static uint32_t kv_crc32c_tab[8][256];   /* slicing-by-8 tables              */
static uint32_t kv_crc32c_long[4][256];  /* shift by KV_CRC_LONG zero bytes  */
static uint32_t kv_crc32c_short[4][256]; /* shift by KV_CRC_SHORT zero bytes */
static pthread_once_t kv_crc32c_tab_once = PTHREAD_ONCE_INIT;

/* GF(2) 32x32 matrices (column n = image of bit n), for the zeros operator. */
static uint32_t kv_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1u)
            sum ^= *mat;
    return sum;
}

static void kv_gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        sq[n] = kv_gf2_times(mat, mat[n]);
}

/* zeros[4][256]: the register after appending len zero bytes (len a power
 * of two), by bytes of the register before. */
static void kv_crc32c_zeros(uint32_t zeros[4][256], uint32_t len)
{
    uint32_t odd[32], even[32], row = 1;
    odd[0] = KV_CRC32C_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++, row <<= 1)
        odd[n] = row;
    kv_gf2_square(even, odd); /* two zero bits */
    kv_gf2_square(odd, even); /* four zero bits */
    const uint32_t *op = even;
    for (;;) {                /* squares until len is rotated out */
        kv_gf2_square(even, odd);
        op = even;
        len >>= 1;
        if (!len)
            break;
        kv_gf2_square(odd, even);
        op = odd;
        len >>= 1;
        if (!len)
            break;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int b = 0; b < 4; b++)
            zeros[b][n] = kv_gf2_times(op, n << (8 * b));
}

static inline __attribute__((always_inline)) uint32_t
kv_crc32c_shift(const uint32_t zeros[4][256], uint32_t c)
{
    return zeros[0][c & 0xFFu] ^ zeros[1][(c >> 8) & 0xFFu] ^ zeros[2][(c >> 16) & 0xFFu] ^
           zeros[3][c >> 24];
}

static void kv_crc32c_tab_init(void)
{
    kv_crc32c_zeros(kv_crc32c_long, KV_CRC_LONG);
    kv_crc32c_zeros(kv_crc32c_short, KV_CRC_SHORT);
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (KV_CRC32C_POLY & (0u - (c & 1u)));
        kv_crc32c_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            kv_crc32c_tab[t][i] = (kv_crc32c_tab[t - 1][i] >> 8) ^
                                  kv_crc32c_tab[0][kv_crc32c_tab[t - 1][i] & 0xFFu];
}

typedef uint32_t (*kv_crc32c_step8_fn)(uint32_t c, uint64_t w);
typedef uint32_t (*kv_crc32c_step1_fn)(uint32_t c, uint8_t b);

/* Three streams over blocks of `blk` bytes each, joined by `zeros`. */
#define KV_CRC_ROUNDS(blk, zeros)                                              \
    while (n >= 3u * (blk)) {                                                  \
        uint32_t c1 = 0, c2 = 0;                                               \
        for (const uint8_t *end = p + (blk); p < end; p += 8) {                \
            uint64_t w0, w1, w2;                                               \
            memcpy(&w0, p, 8);                                                 \
            memcpy(&w1, p + (blk), 8);                                         \
            memcpy(&w2, p + 2u * (blk), 8);                                    \
            c = s8(c, w0);                                                     \
            c1 = s8(c1, w1);                                                   \
            c2 = s8(c2, w2);                                                   \
        }                                                                      \
        c = kv_crc32c_shift(zeros, c) ^ c1;                                    \
        c = kv_crc32c_shift(zeros, c) ^ c2;                                    \
        p += 2u * (blk);                                                       \
        n -= 3u * (blk);                                                       \
    }

/* The shared walk: bytes until p is 8-aligned, three-stream rounds, 8-byte
 * words, then the tail. */
static inline __attribute__((always_inline)) uint32_t
kv_crc32c_body(uint32_t crc, const void *buf, size_t n, kv_crc32c_step8_fn s8,
               kv_crc32c_step1_fn s1)
{
    const uint8_t *p = buf;
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7u)) {
        c = s1(c, *p++);
        n--;
    }
    KV_CRC_ROUNDS(KV_CRC_LONG, kv_crc32c_long)
    KV_CRC_ROUNDS(KV_CRC_SHORT, kv_crc32c_short)
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = s8(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = s1(c, *p++);
    return ~c;
}

/* ---- table steps ---------------------------------------------------------- */

static inline __attribute__((always_inline)) uint32_t kv_crc32c_sw8(uint32_t c, uint64_t w)
{
    uint64_t x = w ^ c;
    return kv_crc32c_tab[7][x & 0xFFu] ^ kv_crc32c_tab[6][(x >> 8) & 0xFFu] ^
           kv_crc32c_tab[5][(x >> 16) & 0xFFu] ^ kv_crc32c_tab[4][(x >> 24) & 0xFFu] ^
           kv_crc32c_tab[3][(x >> 32) & 0xFFu] ^ kv_crc32c_tab[2][(x >> 40) & 0xFFu] ^
           kv_crc32c_tab[1][(x >> 48) & 0xFFu] ^ kv_crc32c_tab[0][x >> 56];
}

static inline __attribute__((always_inline)) uint32_t kv_crc32c_sw1(uint32_t c, uint8_t b)
{
    return (c >> 8) ^ kv_crc32c_tab[0][(c ^ b) & 0xFFu];
}

uint32_t kv_crc32c_sw(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&kv_crc32c_tab_once, kv_crc32c_tab_init);
    return kv_crc32c_body(crc, p, n, kv_crc32c_sw8, kv_crc32c_sw1);
}

/* ---- SSE4.2 steps --------------------------------------------------------- */

#ifdef KV_CRC32C_X86
__attribute__((target("sse4.2"))) static inline uint32_t kv_crc32c_hw8(uint32_t c,
                                                                      uint64_t w)
{
#ifdef __x86_64__
    return (uint32_t)_mm_crc32_u64(c, w);
#else
    c = _mm_crc32_u32(c, (uint32_t)w);
    return _mm_crc32_u32(c, (uint32_t)(w >> 32));
#endif
}

__attribute__((target("sse4.2"))) static inline uint32_t kv_crc32c_hw1(uint32_t c,
                                                                      uint8_t b)
{
    return _mm_crc32_u8(c, b);
}

__attribute__((target("sse4.2"))) uint32_t kv_crc32c_hw(uint32_t crc, const void *p,
                                                        size_t n)
{
    pthread_once(&kv_crc32c_tab_once, kv_crc32c_tab_init); /* shift tables */
    return kv_crc32c_body(crc, p, n, kv_crc32c_hw8, kv_crc32c_hw1);
}

int kv_crc32c_have_hw(void)
{
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}
#else
uint32_t kv_crc32c_hw(uint32_t crc, const void *p, size_t n)
{
    return kv_crc32c_sw(crc, p, n);
}

int kv_crc32c_have_hw(void)
{
    return 0;
}
#endif

/* ---- dispatch ------------------------------------------------------------- */

uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n)
{
    static int have = -1; /* racy init is benign: every thread computes the same */
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) {
        h = kv_crc32c_have_hw();
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h ? kv_crc32c_hw(crc, p, n) : kv_crc32c_sw(crc, p, n);
}
