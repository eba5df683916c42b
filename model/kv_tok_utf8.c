/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_utf8.c — characters for the tokenizer: strict UTF-8 decoding that
 * never fails (an undecodable byte is a character of its own), the three
 * character classes the GPT-2 regex needs (\p{L}, \p{N}, \s), and the GPT-2
 * byte <-> unicode map in which byte-level vocabularies are written.
 *
 * Classes: \s is the Unicode White_Space property (what Oniguruma's and
 * llama.cpp's \s match); L and N come from the generated kv_tok_ucd.c.
 * Everything here is pure and stateless.
 */
#include "kv_tok_int.h"

static int cont(uint8_t c)
{
    return (c & 0xC0u) == 0x80u;
}

size_t kv_tok_utf8_next(const uint8_t *s, size_t len, size_t pos, uint32_t *cp)
{
    uint8_t c = s[pos];
    size_t left = len - pos;

    *cp = KV_TOK_CP_INVALID;
    if (c < 0x80u) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2u && c <= 0xDFu) {
        if (left >= 2 && cont(s[pos + 1])) {
            *cp = ((uint32_t)(c & 0x1Fu) << 6) | (s[pos + 1] & 0x3Fu);
            return 2;
        }
        return 1;
    }
    if (c >= 0xE0u && c <= 0xEFu) {
        /* E0 needs A0..BF next (no overlong), ED needs 80..9F (no surrogate) */
        uint8_t lo = c == 0xE0u ? 0xA0u : 0x80u;
        uint8_t hi = c == 0xEDu ? 0x9Fu : 0xBFu;
        if (left >= 3 && s[pos + 1] >= lo && s[pos + 1] <= hi && cont(s[pos + 2])) {
            *cp = ((uint32_t)(c & 0x0Fu) << 12) | ((uint32_t)(s[pos + 1] & 0x3Fu) << 6) |
                  (s[pos + 2] & 0x3Fu);
            return 3;
        }
        return 1;
    }
    if (c >= 0xF0u && c <= 0xF4u) {
        /* F0 needs 90..BF (no overlong), F4 needs 80..8F (<= U+10FFFF) */
        uint8_t lo = c == 0xF0u ? 0x90u : 0x80u;
        uint8_t hi = c == 0xF4u ? 0x8Fu : 0xBFu;
        if (left >= 4 && s[pos + 1] >= lo && s[pos + 1] <= hi && cont(s[pos + 2]) &&
            cont(s[pos + 3])) {
            *cp = ((uint32_t)(c & 0x07u) << 18) | ((uint32_t)(s[pos + 1] & 0x3Fu) << 12) |
                  ((uint32_t)(s[pos + 2] & 0x3Fu) << 6) | (s[pos + 3] & 0x3Fu);
            return 4;
        }
        return 1;
    }
    return 1; /* continuation byte, C0, C1, F5..FF */
}

static int is_white_space(uint32_t cp)
{
    if (cp <= 0x20u)
        return cp == 0x20u || (cp >= 0x09u && cp <= 0x0Du);
    if (cp < 0x85u)
        return 0;
    switch (cp) {
    case 0x85u: case 0xA0u: case 0x1680u: case 0x2028u: case 0x2029u:
    case 0x202Fu: case 0x205Fu: case 0x3000u:
        return 1;
    default:
        return cp >= 0x2000u && cp <= 0x200Au;
    }
}

int kv_tok_ucat(uint32_t cp)
{
    if (cp < 0x80u) {
        if ((cp | 0x20u) >= 'a' && (cp | 0x20u) <= 'z')
            return KV_TOK_CAT_L;
        if (cp >= '0' && cp <= '9')
            return KV_TOK_CAT_N;
        return is_white_space(cp) ? KV_TOK_CAT_WS : KV_TOK_CAT_OTHER;
    }
    if (cp == KV_TOK_CP_INVALID)
        return KV_TOK_CAT_OTHER;
    if (is_white_space(cp))
        return KV_TOK_CAT_WS;
    /* the last range whose first <= cp */
    uint32_t lo = 0, hi = kv_tok_ucd_n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kv_tok_ucd_ranges[mid].first <= cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && cp <= kv_tok_ucd_ranges[lo - 1].last)
        return (int)kv_tok_ucd_ranges[lo - 1].cat;
    return KV_TOK_CAT_OTHER;
}

/* GPT-2: bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for themselves;
 * the other 68 (0x00..0x20, 0x7F..0xA0, 0xAD), in byte order, get 256..323. */
static int self_mapped(uint32_t b)
{
    return (b >= 0x21u && b <= 0x7Eu) || (b >= 0xA1u && b <= 0xACu) ||
           (b >= 0xAEu && b <= 0xFFu);
}

uint32_t kv_tok_byte_cp(uint8_t b)
{
    if (self_mapped(b))
        return b;
    if (b <= 0x20u)
        return 256u + b;
    if (b <= 0xA0u)
        return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int kv_tok_cp_byte(uint32_t cp)
{
    if (cp < 256u)
        return self_mapped(cp) ? (int)cp : -1;
    if (cp < 256u + 33u)
        return (int)(cp - 256u);
    if (cp < 256u + 67u)
        return (int)(0x7Fu + (cp - 256u - 33u));
    if (cp == 256u + 67u)
        return 0xAD;
    return -1;
}

int kv_tok_unmap(const char *s, size_t n, uint8_t *out, size_t *out_n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t pos = 0, k = 0;

    while (pos < n) {
        uint32_t cp;
        pos += kv_tok_utf8_next(u, n, pos, &cp);
        int b = kv_tok_cp_byte(cp);
        if (b < 0)
            return KV_EINVAL;
        out[k++] = (uint8_t)b;
    }
    *out_n = k;
    return 0;
}
