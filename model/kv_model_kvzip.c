/* SPDX-License-Identifier: MIT */
/*
 * kv_model_kvzip.c — the engine's half of KVzip (kv_model.h,
 * kv_model_kvzip_score): the reconstruction passes whose attention the
 * store turns into scores (store/kv_policy_kvzip.c).
 *
 * Per chunk of the prompt: fork the session's sequence, mark the fork as a
 * scoring pass (kv_seq_score_begin), adopt it in a session that may grow by
 * the reconstruction prompt, run that prompt through the model without
 * logits, free the fork. The reconstruction prompt follows KVzip's: an
 * instruction to repeat (later chunks: to repeat from the previous chunk's
 * last 8 tokens, which it quotes), the ChatML end of the user turn and the
 * assistant header, then the chunk's own tokens as the answer.
 *
 * Ownership: everything allocated here is freed before return; the
 * session and its sequence are not changed.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_model_int.h"
#include "kv_tok.h"

#define KVZIP_QUOTE 8u /* tokens of the previous chunk a later pass quotes */
#define KVZIP_PROMPT 56u /* instruction + turn change: under 40 ids */

uint32_t kv_model_kvzip_room(uint32_t chunk)
{
    return chunk + KVZIP_QUOTE + KVZIP_PROMPT;
}

static const char kvzip_first[] = "\n\nRepeat the previous context exactly.";
static const char kvzip_next[] = "\n\nRepeat the part of the previous context exactly, "
                                 "starting with";

/* The ids of text appended to b[*n..cap); *n advanced. */
static int put_text(const kv_tok_t *tok, const char *text, int32_t *b, size_t cap, size_t *n)
{
    size_t k = 0;
    int rc = kv_tok_encode(tok, text, strlen(text), 0, b + *n, cap - *n, &k);
    *n += k;
    return rc;
}

/* The chat template's turn change (kv_tok_chat_reply) appended. */
static int put_turn(const kv_tok_t *tok, int32_t *b, size_t cap, size_t *n)
{
    size_t k = 0;
    int rc = kv_tok_chat_reply(tok, b + *n, cap - *n, &k);
    *n += k;
    return rc;
}

/* One pass over [c0, c1) with the reconstruction prompt rep[0..n_rep). */
static int score_chunk(kv_model_session_t *s, uint32_t c0, uint32_t c1, const int32_t *rep,
                       uint32_t n_rep)
{
    kv_seq_id_t pass;
    int rc = kv_seq_fork(s->store, s->seq, &pass);
    if (rc)
        return rc;
    kv_model_session_t *ps = NULL;
    kv_model_session_opts_t o = {.store = s->store, .max_ctx = s->pos + n_rep,
                                 .chunk = s->chunk, .n_threads = (int)s->n_threads};
    if ((rc = kv_seq_score_begin(s->store, pass, s->seq, c0, c1)) ||
        (rc = kv_model_session_adopt(s->m, &o, pass, s->pos, &ps))) {
        kv_seq_free(s->store, pass); /* not adopted: still ours */
        return rc;
    }
    rc = kv_model_forward(ps, rep, n_rep, NULL, 0);
    kv_model_session_free(ps); /* frees the pass */
    return rc;
}

int kv_model_kvzip_score(kv_model_session_t *s, const kv_tok_t *tok, const int32_t *ids,
                         uint32_t n, uint32_t from, uint32_t chunk)
{
    if (!s || !tok || !ids || s->pos != n || from >= n || chunk == 0)
        return KV_EINVAL;
    if (!s->store)
        return KV_ENOTSUP;
    if (s->broken)
        return KV_ESTATE;
    uint32_t c = chunk < n - from ? chunk : n - from;
    const size_t cap = kv_model_kvzip_room(c);
    int32_t *rep = malloc(cap * sizeof *rep);
    if (!rep)
        return KV_ENOMEM;
    int rc = 0;
    for (uint32_t c0 = from; c0 < n && !rc; c0 += c) {
        const uint32_t c1 = n - c0 < c ? n : c0 + c;
        size_t k = 0;
        rc = put_text(tok, c0 == from ? kvzip_first : kvzip_next, rep, cap, &k);
        if (!rc && c0 > from) {
            const uint32_t q = c0 - from < KVZIP_QUOTE ? c0 - from : KVZIP_QUOTE;
            memcpy(rep + k, ids + c0 - q, q * sizeof *rep);
            k += q;
        }
        if (!rc)
            rc = put_turn(tok, rep, cap, &k);
        if (!rc && k + (c1 - c0) > cap)
            rc = KV_ERANGE; /* never: cap holds the longest instruction */
        if (rc)
            break;
        memcpy(rep + k, ids + c0, (size_t)(c1 - c0) * sizeof *rep);
        rc = score_chunk(s, c0, c1, rep, (uint32_t)(k + (c1 - c0)));
    }
    free(rep);
    return rc;
}
