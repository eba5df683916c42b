/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_pre.c — the pre-tokenizer: splits a text segment into the pieces
 * that BPE then merges independently, as an iterator (no allocation).
 *
 * KV_TOK_PRE_GPT2 is the GPT-2 regex, matched by hand:
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * KV_TOK_PRE_SMOLLM first cuts every \p{N} code point out as a piece of its
 * own and runs the GPT-2 regex on each stretch between them (HF: Sequence of
 * Digits(individual_digits) and ByteLevel; llama.cpp: "\p{N}" then the GPT-2
 * expression, for SMOLLM, STARCODER, REFACT, ...). Each stretch is matched
 * as a string of its own, so "(?!\S)" sees its end as the end of text.
 *
 * Invariant: pieces are non-empty, in order, and tile the segment exactly;
 * an undecodable byte is one character of class OTHER.
 */
#include <string.h>

#include "kv_tok_int.h"

void kv_tok_pre_init(kv_tok_pre_it_t *it, kv_tok_pre_t pre, const uint8_t *s,
                     size_t len)
{
    it->s = s;
    it->len = len;
    it->pos = 0;
    it->seg_end = 0;
    it->pre = pre;
}

/* Class of the character at s[p] (p < e) and its length in *k. */
static int cat_at(const uint8_t *s, size_t e, size_t p, size_t *k)
{
    uint32_t cp;
    *k = kv_tok_utf8_next(s, e, p, &cp);
    return kv_tok_ucat(cp);
}

static int is_contraction(const uint8_t *s, size_t a, size_t e, size_t *end)
{
    if (s[a] != '\'' || a + 1 >= e)
        return 0;
    uint8_t c1 = s[a + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        *end = a + 2;
        return 1;
    }
    if (a + 2 < e) {
        uint8_t c2 = s[a + 2];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
            (c1 == 'l' && c2 == 'l')) {
            *end = a + 3;
            return 1;
        }
    }
    return 0;
}

/* One GPT-2 regex match at s[a] within s[0..e), a < e: returns its end. */
static size_t gpt2_match(const uint8_t *s, size_t a, size_t e)
{
    size_t end, k0, k;

    if (is_contraction(s, a, e, &end))
        return end;

    int c0 = cat_at(s, e, a, &k0);
    size_t p = a;
    int cat = c0;
    if (s[a] == ' ') { /* " ?X+": the class of what follows the space */
        if (a + 1 >= e)
            return a + 1; /* a lone space ends the segment: \s+ */
        p = a + 1;
        cat = cat_at(s, e, p, &k);
    }
    if (cat != KV_TOK_CAT_WS) { /* ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+` */
        while (p < e && cat_at(s, e, p, &k) == cat)
            p += k;
        return p;
    }

    /* whitespace at a: \s+(?!\S) leaves the last one of a run that is
     * followed by a non-space to the next match; \s+ takes a lone one */
    size_t q = a, last = a, count = 0;
    while (q < e && cat_at(s, e, q, &k) == KV_TOK_CAT_WS) {
        last = q;
        q += k;
        count++;
    }
    if (count == 0) /* unreachable: s[a] is white space here */
        return a + k0;
    if (count > 1 && q < e)
        return last;
    return q;
}

int kv_tok_pre_next(kv_tok_pre_it_t *it, size_t *start, size_t *n)
{
    const uint8_t *s = it->s;
    size_t k;

    if (it->pos >= it->len)
        return 0;
    if (it->pos >= it->seg_end) {
        it->seg_end = it->len;
        if (it->pre == KV_TOK_PRE_SMOLLM) {
            if (cat_at(s, it->len, it->pos, &k) == KV_TOK_CAT_N) {
                *start = it->pos;
                *n = k;
                it->pos += k;
                it->seg_end = it->pos;
                return 1;
            }
            size_t e = it->pos + k;
            while (e < it->len && cat_at(s, it->len, e, &k) != KV_TOK_CAT_N)
                e += k;
            it->seg_end = e;
        }
    }
    size_t end = gpt2_match(s, it->pos, it->seg_end);
    *start = it->pos;
    *n = end - it->pos;
    it->pos = end;
    return 1;
}

int kv_tok_pre_from_name(const char *name, size_t len, kv_tok_pre_t *out)
{
    static const struct {
        const char *name;
        kv_tok_pre_t pre;
    } known[] = {
        {"gpt2", KV_TOK_PRE_GPT2},
        {"smollm", KV_TOK_PRE_SMOLLM},
        {"starcoder", KV_TOK_PRE_SMOLLM},
        {"refact", KV_TOK_PRE_SMOLLM},
    };

    if (!name || !out)
        return KV_EINVAL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strlen(known[i].name) == len && memcmp(known[i].name, name, len) == 0) {
            *out = known[i].pre;
            return 0;
        }
    }
    return KV_ENOTSUP;
}
