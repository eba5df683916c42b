/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_encode.c — text to ids and back.
 *
 * Encode: cut special-token texts out of the text (leftmost match, longest
 * at a position; CONTROL only with parse_special, USER_DEFINED always),
 * pre-tokenize each stretch between them (kv_tok_pre.c) and BPE-merge each
 * piece (kv_tok_bpe.c). Ids go to a sink that counts past the caller's
 * capacity so a short buffer learns the size it needs.
 * Decode: concatenates token pieces (raw bytes); validates every id first.
 * Both only read the tokenizer; scratch is per call.
 */
#include <stdint.h>
#include <string.h>

#include "kv_tok_int.h"

static int encode_plain(const kv_tok_t *t, const uint8_t *s, size_t len,
                        kv_tok_scratch_t *sc, kv_tok_sink_t *out)
{
    kv_tok_pre_it_t it;
    size_t start, n;

    kv_tok_pre_init(&it, t->pre, s, len);
    while (kv_tok_pre_next(&it, &start, &n)) {
        int rc = kv_tok_bpe_word(t, s + start, n, sc, out);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The longest special token whose text starts at s[pos]: its id and length,
 * or 0. */
static int special_at(const kv_tok_t *t, const uint8_t *s, size_t len, size_t pos,
                      int parse_special, int32_t *id, size_t *mlen)
{
    unsigned want = parse_special ? 3u : 2u;
    if (!(t->special_first[s[pos]] & want))
        return 0;
    size_t best = 0;
    for (uint32_t i = 0; i < t->n_special; i++) {
        uint32_t sid = (uint32_t)t->special[i];
        int type = t->types[sid];
        size_t n = kv_tok_piece_len(t, sid);
        if (!(type == KV_TOK_USER_DEFINED || (parse_special && type == KV_TOK_CONTROL)))
            continue;
        if (n > best && n <= len - pos && memcmp(kv_tok_piece_ptr(t, sid), s + pos, n) == 0) {
            best = n;
            *id = (int32_t)sid;
        }
    }
    *mlen = best;
    return best > 0;
}

int kv_tok_encode_sink(const kv_tok_t *t, const uint8_t *s, size_t len,
                       int parse_special, kv_tok_scratch_t *sc, kv_tok_sink_t *out)
{
    size_t seg = 0, pos = 0, mlen;
    int32_t id;
    int rc;

    while (pos < len) {
        if (!special_at(t, s, len, pos, parse_special, &id, &mlen)) {
            pos++;
            continue;
        }
        if ((rc = encode_plain(t, s + seg, pos - seg, sc, out)) != 0)
            return rc;
        kv_tok_emit(out, id);
        pos += mlen;
        seg = pos;
    }
    return encode_plain(t, s + seg, len - seg, sc, out);
}

int kv_tok_encode(const kv_tok_t *t, const char *text, size_t len, int parse_special,
                  int32_t *ids, size_t cap, size_t *n)
{
    if (!t || !n || (!text && len) || (!ids && cap))
        return KV_EINVAL;

    kv_tok_scratch_t sc;
    kv_tok_sink_t out = {.ids = ids, .cap = cap, .n = 0};
    kv_tok_scratch_init(&sc);
    int rc = kv_tok_encode_sink(t, (const uint8_t *)text, len, parse_special, &sc, &out);
    kv_tok_scratch_fini(t, &sc);
    if (rc != 0)
        return rc;
    *n = out.n;
    if (!ids)
        return 0; /* a size query */
    return out.n > cap ? KV_ERANGE : 0;
}

int kv_tok_decode(const kv_tok_t *t, const int32_t *ids, size_t n, char *out,
                  size_t cap, size_t *len)
{
    if (!t || !len || (!ids && n) || (!out && cap))
        return KV_EINVAL;

    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab)
            return KV_ERANGE;
        size_t m = kv_tok_piece_len(t, (uint32_t)ids[i]);
        if (m > SIZE_MAX - total)
            return KV_ERANGE;
        total += m;
    }
    *len = total;
    if (!out)
        return 0; /* a size query */

    size_t k = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        size_t m = kv_tok_piece_len(t, (uint32_t)ids[i]);
        if (m > cap - k)
            m = cap - k;
        memcpy(out + k, kv_tok_piece_ptr(t, (uint32_t)ids[i]), m);
        k += m;
    }
    return total > cap ? KV_ERANGE : 0;
}
