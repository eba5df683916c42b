/* SPDX-License-Identifier: MIT */
/*
 * kv_le.h — little-endian integer fields, the byte order of every
 * persistent record (util/kv_rec.h lists them): put and get of unsigned
 * 16-, 32- and 64-bit values at any alignment, the same bytes on any host.
 *
 * Header-only (static inline, no state): the library, the tools and the
 * tests that build or spoil a record all encode through these. put16 takes
 * the low 16 bits of its argument; get16 returns a value below 2^16.
 */
#ifndef KV_LE_H
#define KV_LE_H

#include <stdint.h>

static inline void kv_le_put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void kv_le_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void kv_le_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t kv_le_get16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static inline uint32_t kv_le_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t kv_le_get64(const uint8_t *p)
{
    return (uint64_t)kv_le_get32(p) | (uint64_t)kv_le_get32(p + 4) << 32;
}

#endif /* KV_LE_H */
