/* SPDX-License-Identifier: MIT */
/*
 * kv_model_session.c — creating, forking and freeing model sessions (see
 * kv_model.h). A paged session owns one store sequence; a dense one owns its
 * K/V arrays. Scratch activations for `chunk` rows are one allocation.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_model_int.h"

static int alloc_scratch(kv_model_session_t *s)
{
    const kv_model_hparams_t *hp = &s->m->hp;
    const size_t c = s->chunk, D = hp->d_model, QD = (size_t)hp->n_q_heads * hp->head_dim;
    const size_t KD = (size_t)hp->n_kv_heads * hp->head_dim, F = hp->d_ff;
    const size_t floats = c * (2 * D + 2 * QD + 2 * KD + 2 * F + hp->head_dim);
    const size_t bytes = floats * sizeof(float) + c * (sizeof(int32_t) + sizeof(kv_seq_id_t));
    float *p = malloc(bytes);
    if (!p)
        return KV_ENOMEM;
    s->sc_mem = p;
    s->sc.x = p;
    s->sc.h = s->sc.x + c * D;
    s->sc.q = s->sc.h + c * D;
    s->sc.att = s->sc.q + c * QD;
    s->sc.k = s->sc.att + c * QD;
    s->sc.v = s->sc.k + c * KD;
    s->sc.f1 = s->sc.v + c * KD;
    s->sc.f2 = s->sc.f1 + c * F;
    s->sc.rope = s->sc.f2 + c * F;
    s->sc.pos = (int32_t *)(s->sc.rope + c * hp->head_dim);
    s->sc.seqs = (kv_seq_id_t *)(s->sc.pos + c);
    return 0;
}

/* A session with everything but its cache. */
static int session_new(const kv_model_t *m, kv_store_t *store, uint32_t max_ctx, uint32_t chunk,
                       int n_threads, kv_model_session_t **out)
{
    kv_model_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return KV_ENOMEM;
    s->m = m;
    s->store = store;
    s->max_ctx = max_ctx;
    s->chunk = chunk;
    uint32_t have = kv_workers_size(m->workers);
    s->n_threads = n_threads > 0 && (uint32_t)n_threads < have ? (uint32_t)n_threads : have;
    int rc = alloc_scratch(s);
    if (!rc && !store) {
        s->dk = calloc(m->hp.n_layers, sizeof *s->dk);
        s->dv = calloc(m->hp.n_layers, sizeof *s->dv);
        if (!s->dk || !s->dv)
            rc = KV_ENOMEM;
    }
    if (rc) {
        free(s->dk);
        free(s->dv);
        free(s->sc_mem);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

static void session_release(kv_model_session_t *s)
{
    if (s->dk)
        for (uint32_t l = 0; l < s->m->hp.n_layers; l++) {
            free(s->dk[l]);
            free(s->dv[l]);
        }
    free(s->dk);
    free(s->dv);
    free(s->dscore);
    free(s->sc_mem);
    free(s);
}

/* A session for opts without its sequence (checks opts). */
static int session_open(const kv_model_t *m, const kv_model_session_opts_t *opts,
                        kv_model_session_t **out)
{
    if (!m || !opts || !out || opts->n_threads < 0 || opts->chunk > 4096)
        return KV_EINVAL;
    uint32_t max_ctx = opts->max_ctx ? opts->max_ctx : m->hp.n_ctx;
    uint32_t chunk = opts->chunk ? opts->chunk : 256;
    if (max_ctx > (1u << 24))
        return KV_ERANGE;
    if (opts->store) {
        kv_config_t cfg;
        int rc = kv_store_config(opts->store, &cfg);
        if (rc)
            return rc;
        if (cfg.n_layers != m->hp.n_layers || cfg.n_q_heads != m->hp.n_q_heads ||
            cfg.n_kv_heads != m->hp.n_kv_heads || cfg.head_dim != m->hp.head_dim)
            return KV_EINVAL; /* the store was made for another shape */
    }
    return session_new(m, opts->store, max_ctx, chunk, opts->n_threads, out);
}

int kv_model_session_create(const kv_model_t *m, const kv_model_session_opts_t *opts,
                            kv_model_session_t **out)
{
    kv_model_session_t *s;
    int rc = session_open(m, opts, &s);
    if (rc)
        return rc;
    if (s->store && (rc = kv_seq_create(s->store, &s->seq))) {
        session_release(s);
        return rc;
    }
    *out = s;
    return 0;
}

int kv_model_session_adopt(const kv_model_t *m, const kv_model_session_opts_t *opts,
                           kv_seq_id_t seq, uint32_t pos, kv_model_session_t **out)
{
    if (!opts || !opts->store)
        return KV_EINVAL;
    uint32_t len;
    int rc = kv_seq_len(opts->store, seq, 0, 0, &len);
    kv_model_session_t *s;
    if (rc || (rc = session_open(m, opts, &s)))
        return rc;
    if (pos > s->max_ctx) {
        session_release(s);
        return KV_ERANGE;
    }
    s->seq = seq;
    s->pos = pos;
    *out = s;
    return 0;
}

void kv_model_session_free(kv_model_session_t *s)
{
    if (!s)
        return;
    if (s->store)
        kv_seq_free(s->store, s->seq);
    session_release(s);
}

int kv_model_session_fork(const kv_model_session_t *s, kv_model_session_t **out)
{
    if (!s || !out)
        return KV_EINVAL;
    if (s->broken)
        return KV_ESTATE;
    kv_model_session_t *c;
    int rc = session_new(s->m, s->store, s->max_ctx, s->chunk, (int)s->n_threads, &c);
    if (rc)
        return rc;
    c->pos = s->pos;
    c->hook = s->hook;
    c->has_hook = s->has_hook;
    if (s->store) {
        rc = kv_seq_fork(s->store, s->seq, &c->seq);
    } else if (s->dcap) {
        const size_t bytes = (size_t)s->dcap * s->m->hp.n_kv_heads * s->m->hp.head_dim * 4;
        for (uint32_t l = 0; l < s->m->hp.n_layers && !rc; l++) {
            c->dk[l] = malloc(bytes);
            c->dv[l] = malloc(bytes);
            if (!c->dk[l] || !c->dv[l]) {
                rc = KV_ENOMEM;
                break;
            }
            memcpy(c->dk[l], s->dk[l], bytes);
            memcpy(c->dv[l], s->dv[l], bytes);
        }
        c->dcap = s->dcap;
    }
    if (rc) {
        session_release(c);
        return rc;
    }
    *out = c;
    return 0;
}

uint32_t kv_model_session_pos(const kv_model_session_t *s) { return s ? s->pos : 0; }

int kv_model_session_seq(const kv_model_session_t *s, kv_seq_id_t *seq)
{
    if (!s || !seq)
        return KV_EINVAL;
    if (!s->store)
        return KV_ENOTSUP;
    *seq = s->seq;
    return 0;
}

void kv_model_session_set_hook(kv_model_session_t *s, const kv_model_hook_t *hook)
{
    if (!s)
        return;
    s->has_hook = hook != NULL;
    if (hook)
        s->hook = *hook;
}

/* kv_model_session_prefix and _context: a match into an empty session. */
static int session_match(kv_model_session_t *s, const int32_t *tokens, uint32_t n,
                         const void *salt, size_t salt_len, uint32_t *matched, int ctx)
{
    if (!s || !matched)
        return KV_EINVAL;
    if (!s->store)
        return KV_ENOTSUP;
    if (s->pos || s->broken)
        return KV_ESTATE;
    if (n > s->max_ctx)
        return KV_ELIMIT;
    for (uint32_t i = 0; i < n && tokens; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= s->m->hp.vocab)
            return KV_ERANGE;
    int rc = ctx ? kv_seq_prefix_match_compressed(s->store, s->seq, tokens, n, salt, salt_len,
                                                  matched)
                 : kv_seq_prefix_match(s->store, s->seq, tokens, n, salt, salt_len, matched);
    if (rc == 0)
        s->pos = *matched;
    return rc;
}

int kv_model_session_prefix(kv_model_session_t *s, const int32_t *tokens, uint32_t n,
                            const void *salt, size_t salt_len, uint32_t *matched)
{
    return session_match(s, tokens, n, salt, salt_len, matched, 0);
}

int kv_model_session_context(kv_model_session_t *s, const int32_t *tokens, uint32_t n,
                             const void *salt, size_t salt_len, uint32_t *matched)
{
    return session_match(s, tokens, n, salt, salt_len, matched, 1);
}
