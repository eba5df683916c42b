/* SPDX-License-Identifier: MIT */
/*
 * kv_model_attn.c — one layer's attention for a forward step, two ways:
 *
 *   paged: kv_append the step's post-RoPE K/V into the store, then
 *          kv_attn_prefill (prompt chunk) or one batched kv_attn_decode.
 *   dense: the session keeps K/V of every layer in arrays indexed by
 *          position, values rounded to FP16 exactly as FP16 pages hold
 *          them, and attention is computed here directly: scores with the
 *          fixed-order dot of kv_quant.h, softmax with the max subtracted,
 *          weighted sum of V in position order. One query row per work unit.
 *
 * Both paths run the session's hook (pre: after K/V are stored, post: after
 * attention). Rollback after a failed step: kv_model_snapshot records list
 * lengths, kv_model_restore compacts the store lists back to them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model_int.h"

/* ---- dense cache ------------------------------------------------------ */

/* Make room for `rows` positions in every layer (all or nothing). */
static int dense_reserve(kv_model_session_t *s, uint32_t rows)
{
    if (rows <= s->dcap)
        return 0;
    const kv_model_hparams_t *hp = &s->m->hp;
    const size_t row = (size_t)hp->n_kv_heads * hp->head_dim;
    uint32_t cap = s->dcap ? s->dcap : 64;
    while (cap < rows)
        cap = cap > s->max_ctx / 2 ? s->max_ctx : cap * 2;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        /* Grow layer by layer; a failure leaves a larger but valid buffer. */
        float *k = realloc(s->dk[l], cap * row * sizeof *k);
        if (k)
            s->dk[l] = k;
        float *v = k ? realloc(s->dv[l], cap * row * sizeof *v) : NULL;
        if (v)
            s->dv[l] = v;
        if (!k || !v) {
            /* Buffers of layers < l are larger already: harmless. */
            return KV_ENOMEM;
        }
    }
    s->dcap = cap;
    return 0;
}

/* Score rows (one per worker of the driving session's jobs, `len` floats
 * each) in that session; grown once to max_ctx, not per token. */
static int dense_scores_scratch(kv_model_session_t *s, uint32_t len)
{
    const uint32_t rows = s->n_threads;
    if (s->dscore && s->dscore_len >= len && s->dscore_rows >= rows)
        return 0;
    if (len < s->max_ctx)
        len = s->max_ctx;
    float *p = malloc((size_t)rows * len * sizeof *p);
    if (!p)
        return KV_ENOMEM;
    free(s->dscore);
    s->dscore = p;
    s->dscore_rows = rows;
    s->dscore_len = len;
    return 0;
}

static int fp16_ok(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= 65504.0f))
            return 0;
    return 1;
}

/* Store row r of the step (K and V of all kv heads) at position pos. */
static void dense_put(kv_model_session_t *s, uint32_t layer, uint32_t pos, const float *k,
                      const float *v)
{
    const size_t row = (size_t)s->m->hp.n_kv_heads * s->m->hp.head_dim;
    float *dk = s->dk[layer] + (size_t)pos * row, *dv = s->dv[layer] + (size_t)pos * row;
    for (size_t i = 0; i < row; i++) {
        dk[i] = kv_q_half_to_float(kv_q_float_to_half(k[i]));
        dv[i] = kv_q_half_to_float(kv_q_float_to_half(v[i]));
    }
}

/* out = softmax(q K[0..len)^T * scale) V[0..len) for one head. */
static void dense_head(const float *q, const float *K, const float *V, size_t stride,
                       uint32_t len, uint32_t hd, float scale, float *sc, float *out)
{
    float mx = -INFINITY;
    for (uint32_t j = 0; j < len; j++) {
        sc[j] = kv_q_dot_f32(q, K + j * stride, hd) * scale;
        if (sc[j] > mx)
            mx = sc[j];
    }
    float sum = 0;
    for (uint32_t j = 0; j < len; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    for (uint32_t d = 0; d < hd; d++)
        out[d] = 0;
    for (uint32_t j = 0; j < len; j++) {
        const float *vj = V + j * stride;
        for (uint32_t d = 0; d < hd; d++)
            out[d] += sc[j] * vj[d];
    }
    float inv = 1.0f / sum;
    for (uint32_t d = 0; d < hd; d++)
        out[d] *= inv;
}

typedef struct dense_job {
    const kv_model_step_t *st;
    const kv_model_scratch_t *sc;
    uint32_t layer;
} dense_job_t;

/* One query row: every head; scores in the worker's row of dscore. */
static void dense_unit(void *arg, size_t r, uint32_t worker)
{
    const dense_job_t *j = arg;
    const kv_model_session_t *s0 = j->st->sess[0];
    const kv_model_session_t *s = j->st->sess[j->st->prompt ? 0 : r];
    const kv_model_hparams_t *hp = &s0->m->hp;
    const uint32_t hd = hp->head_dim, nq = hp->n_q_heads, group = nq / hp->n_kv_heads;
    const size_t krow = (size_t)hp->n_kv_heads * hd, qrow = (size_t)nq * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = s0->dscore + (size_t)worker * s0->dscore_len;
    for (uint32_t h = 0; h < nq; h++) {
        uint32_t g = h / group;
        dense_head(j->sc->q + r * qrow + (size_t)h * hd, s->dk[j->layer] + (size_t)g * hd,
                   s->dv[j->layer] + (size_t)g * hd, krow, (uint32_t)j->sc->pos[r] + 1, hd,
                   scale, scores, j->sc->att + r * qrow + (size_t)h * hd);
    }
}

static int dense_attn(const kv_model_step_t *st, kv_model_scratch_t *sc, uint32_t layer)
{
    kv_model_session_t *s0 = st->sess[0];
    const kv_model_hparams_t *hp = &s0->m->hp;
    const size_t krow = (size_t)hp->n_kv_heads * hp->head_dim;
    int rc = 0;
    if (!fp16_ok(sc->k, st->n * krow) || !fp16_ok(sc->v, st->n * krow))
        return KV_ERANGE;
    uint32_t longest = 0;
    for (uint32_t b = 0; b < st->batch && !rc; b++) {
        kv_model_session_t *s = st->sess[b];
        uint32_t need = st->prompt ? s->pos + st->n : s->pos + 1;
        rc = dense_reserve(s, need);
        longest = need > longest ? need : longest;
    }
    if (!rc)
        rc = dense_scores_scratch(s0, longest);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < st->n; r++) {
        kv_model_session_t *s = st->sess[st->prompt ? 0 : r];
        dense_put(s, layer, (uint32_t)sc->pos[r], sc->k + r * krow, sc->v + r * krow);
    }
    dense_job_t j = {.st = st, .sc = sc, .layer = layer};
    kv_workers_run(s0->m->workers, s0->n_threads, st->n, dense_unit, &j);
    return 0;
}

/* ---- paged ------------------------------------------------------------ */

static int paged_append(const kv_model_step_t *st, kv_model_scratch_t *sc, uint32_t layer)
{
    const kv_model_hparams_t *hp = &st->sess[0]->m->hp;
    const size_t krow = (size_t)hp->n_kv_heads * hp->head_dim;
    kv_store_t *store = st->sess[0]->store;
    if (st->prompt)
        return kv_append(store, st->sess[0]->seq, layer, st->n, KV_DTYPE_F32, sc->k, sc->v,
                         sc->pos);
    for (uint32_t b = 0; b < st->batch; b++) {
        int rc = kv_append(store, st->sess[b]->seq, layer, 1, KV_DTYPE_F32, sc->k + b * krow,
                           sc->v + b * krow, sc->pos + b);
        if (rc)
            return rc;
    }
    return 0;
}

static int paged_attn(const kv_model_step_t *st, kv_model_scratch_t *sc, uint32_t layer,
                      const kv_model_layer_io_t *io)
{
    kv_store_t *store = st->sess[0]->store;
    if (st->prompt) {
        kv_prefill_t pf = {.layer = layer, .seq = st->sess[0]->seq, .n_new = st->n,
                           .q = sc->q, .out = sc->att, .stats = io->stats,
                           .stats_stride = io->stats_stride, .stats_row0 = io->stats_row0};
        return kv_attn_prefill(store, &pf);
    }
    for (uint32_t b = 0; b < st->batch; b++)
        sc->seqs[b] = st->sess[b]->seq;
    kv_decode_t d = {.layer = layer, .batch = st->batch, .seqs = sc->seqs, .q = sc->q,
                     .out = sc->att, .stats = io->batch_stats,
                     .stats_stride = io->stats_stride};
    return kv_attn_decode(store, &d);
}

int kv_model_attn(const kv_model_step_t *st, kv_model_scratch_t *sc, uint32_t layer)
{
    kv_model_session_t *s0 = st->sess[0];
    kv_model_layer_io_t io = {.layer = layer, .n = st->n, .batch = st->batch,
                              .sess = st->sess, .pos = sc->pos, .q = sc->q, .k = sc->k,
                              .v = sc->v};
    int rc;
    if (s0->store) {
        if ((rc = paged_append(st, sc, layer)))
            return rc;
        if (s0->has_hook && s0->hook.pre_attn && (rc = s0->hook.pre_attn(s0->hook.user, &io)))
            return rc;
        rc = paged_attn(st, sc, layer, &io);
    } else {
        if (s0->has_hook && s0->hook.pre_attn && (rc = s0->hook.pre_attn(s0->hook.user, &io)))
            return rc;
        rc = dense_attn(st, sc, layer);
    }
    if (!rc && s0->has_hook && s0->hook.post_attn)
        rc = s0->hook.post_attn(s0->hook.user, &io, sc->att);
    return rc;
}

/* ---- rollback --------------------------------------------------------- */

int kv_model_snapshot(const kv_model_session_t *s, uint32_t *lens)
{
    if (!s->store)
        return 0;
    const kv_model_hparams_t *hp = &s->m->hp;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            int rc = kv_seq_len(s->store, s->seq, l, h, &lens[l * hp->n_kv_heads + h]);
            if (rc)
                return rc;
        }
    return 0;
}

int kv_model_restore(kv_model_session_t *s, const uint32_t *lens, uint32_t pos)
{
    s->pos = pos;
    if (!s->store)
        return 0; /* dense: rows past pos are simply ignored */
    const kv_model_hparams_t *hp = &s->m->hp;
    uint32_t *keep = NULL;
    int rc = 0;
    for (uint32_t l = 0; l < hp->n_layers && !rc; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads && !rc; h++) {
            uint32_t now = 0, want = lens[l * hp->n_kv_heads + h];
            if ((rc = kv_seq_len(s->store, s->seq, l, h, &now)) || now <= want)
                continue;
            if (!keep && !(keep = malloc((size_t)(s->max_ctx ? s->max_ctx : 1) * sizeof *keep))) {
                rc = KV_ENOMEM;
                break;
            }
            for (uint32_t i = 0; i < want; i++)
                keep[i] = i;
            rc = kv_compact(s->store, s->seq, l, h, keep, want);
        }
    free(keep);
    if (rc)
        s->broken = rc;
    return rc;
}
