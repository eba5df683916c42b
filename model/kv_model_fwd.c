/* SPDX-License-Identifier: MIT */
/*
 * kv_model_fwd.c — the llama forward pass over a step of rows:
 *
 *   x = embed(tokens)
 *   per layer: h = rmsnorm(x); q,k,v = h W{q,k,v}^T; RoPE(q, k);
 *              att = attention (kv_model_attn.c); x += att Wo^T;
 *              h = rmsnorm(x); x += (silu(h Wg^T) * h Wu^T) Wd^T
 *   logits = rmsnorm(x) Wout^T (token_embd when tied), for the rows asked.
 *
 * A prompt is split into chunks of `chunk` rows; a decode step has one row
 * per session. A call either completes or restores every session it touched
 * to its state before the call (kv_model_snapshot / kv_model_restore).
 */
#include <stdlib.h>
#include <string.h>

#include "kv_model_int.h"

/* Rows [out0, n) of the step also produce logits into logits[row - out0]. */
static int step_run(const kv_model_step_t *st, uint32_t out0, float *logits)
{
    kv_model_session_t *s0 = st->sess[0];
    const kv_model_t *m = s0->m;
    const kv_model_hparams_t *hp = &m->hp;
    kv_model_scratch_t *sc = &s0->sc;
    const uint32_t n = st->n, D = hp->d_model, hd = hp->head_dim;
    kv_workers_t *workers = m->workers;
    const uint32_t nt = s0->n_threads;
    for (uint32_t r = 0; r < n; r++) {
        sc->pos[r] = (int32_t)(st->prompt ? s0->pos + r : st->sess[r]->pos);
        kv_q_dequant_row(m->embd.type,
                         (const uint8_t *)m->embd.data + (size_t)st->tokens[r] * m->embd.row_bytes,
                         sc->x + (size_t)r * D, D);
    }
    kv_model_rope_table(sc->pos, n, hd, m->inv_freq, sc->rope);
    int rc = 0;
    for (uint32_t l = 0; l < hp->n_layers && !rc; l++) {
        const kv_model_layer_w_t *w = &m->layers[l];
        kv_model_rmsnorm(sc->x, w->attn_norm, sc->h, n, D, hp->rms_eps, workers, nt);
        const kv_q_mat_t *qkv[3] = {&w->wq, &w->wk, &w->wv};
        float *const qkv_out[3] = {sc->q, sc->k, sc->v};
        const size_t qkv_ld[3] = {w->wq.rows, w->wk.rows, w->wv.rows};
        if ((rc = kv_q_matmul_many(qkv, qkv_out, qkv_ld, 3, sc->h, n, workers, nt)))
            break;
        kv_model_rope(sc->q, n, hp->n_q_heads, hd, sc->rope, workers, nt);
        kv_model_rope(sc->k, n, hp->n_kv_heads, hd, sc->rope, workers, nt);
        if ((rc = kv_model_attn(st, sc, l)) ||
            (rc = kv_q_matmul(&w->wo, sc->att, n, sc->h, D, workers, nt)))
            break;
        kv_model_add(sc->x, sc->h, (size_t)n * D);
        kv_model_rmsnorm(sc->x, w->ffn_norm, sc->h, n, D, hp->rms_eps, workers, nt);
        const kv_q_mat_t *gu[2] = {&w->gate, &w->up};
        float *const gu_out[2] = {sc->f1, sc->f2};
        const size_t gu_ld[2] = {hp->d_ff, hp->d_ff};
        if ((rc = kv_q_matmul_many(gu, gu_out, gu_ld, 2, sc->h, n, workers, nt)))
            break;
        kv_model_swiglu(sc->f1, sc->f2, n, hp->d_ff, workers, nt);
        if ((rc = kv_q_matmul(&w->down, sc->f1, n, sc->h, D, workers, nt)))
            break;
        kv_model_add(sc->x, sc->h, (size_t)n * D);
    }
    if (rc || !logits || out0 >= n)
        return rc;
    kv_model_rmsnorm(sc->x + (size_t)out0 * D, m->out_norm, sc->h, n - out0, D, hp->rms_eps,
                     workers, nt);
    return kv_q_matmul(&m->out, sc->h, n - out0, logits, hp->vocab, workers, nt);
}

static int check_tokens(const kv_model_t *m, const int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= m->hp.vocab)
            return KV_ERANGE;
    return 0;
}

/* Snapshot buffer for `count` sessions. */
static uint32_t *snap_alloc(const kv_model_t *m, uint32_t count)
{
    return malloc((size_t)count * m->hp.n_layers * m->hp.n_kv_heads * sizeof(uint32_t) + 1);
}

int kv_model_forward(kv_model_session_t *s, const int32_t *tokens, uint32_t n, float *logits,
                     uint32_t n_out)
{
    if (!s || (!tokens && n) || n_out > n || (n_out && !logits))
        return KV_EINVAL;
    if (s->broken)
        return KV_ESTATE;
    if (!n)
        return 0;
    int rc = check_tokens(s->m, tokens, n);
    if (rc)
        return rc;
    if (n > s->max_ctx - s->pos)
        return KV_ELIMIT;
    uint32_t *snap = snap_alloc(s->m, 1);
    if (!snap)
        return KV_ENOMEM;
    const uint32_t pos0 = s->pos, first_out = n - n_out;
    const size_t V = s->m->hp.vocab;
    if (!(rc = kv_model_snapshot(s, snap))) {
        for (uint32_t c0 = 0; c0 < n && !rc; c0 += s->chunk) {
            uint32_t c1 = n - c0 < s->chunk ? n : c0 + s->chunk;
            kv_model_step_t st = {.sess = &s, .batch = 1, .n = c1 - c0, .prompt = 1,
                                  .tokens = tokens + c0};
            uint32_t out0 = first_out > c0 ? first_out - c0 : 0;
            float *lg = n_out && c1 > first_out
                            ? logits + (size_t)(c0 + out0 - first_out) * V : NULL;
            rc = step_run(&st, out0, lg);
            if (!rc)
                s->pos += c1 - c0;
        }
        if (rc)
            kv_model_restore(s, snap, pos0);
    }
    free(snap);
    return rc;
}

int kv_model_decode_batch(kv_model_session_t *const *sess, uint32_t batch, const int32_t *tokens,
                          float *logits)
{
    if (!sess || !tokens || !batch || !sess[0])
        return KV_EINVAL;
    const kv_model_session_t *s0 = sess[0];
    if (batch > s0->chunk)
        return KV_ERANGE;
    for (uint32_t b = 0; b < batch; b++) {
        const kv_model_session_t *s = sess[b];
        if (!s || s->m != s0->m || s->store != s0->store)
            return KV_EINVAL;
        if (s->broken)
            return KV_ESTATE;
        if (s->pos >= s->max_ctx)
            return KV_ELIMIT;
        for (uint32_t c = 0; c < b; c++)
            if (sess[c] == s)
                return KV_EINVAL;
    }
    int rc = check_tokens(s0->m, tokens, batch);
    if (rc)
        return rc;
    uint32_t *snap = snap_alloc(s0->m, batch);
    if (!snap)
        return KV_ENOMEM;
    const size_t per = (size_t)s0->m->hp.n_layers * s0->m->hp.n_kv_heads;
    for (uint32_t b = 0; b < batch && !rc; b++)
        rc = kv_model_snapshot(sess[b], snap + b * per);
    if (!rc) {
        kv_model_step_t st = {.sess = sess, .batch = batch, .n = batch, .prompt = 0,
                              .tokens = tokens};
        rc = step_run(&st, 0, logits);
        for (uint32_t b = 0; b < batch; b++) {
            if (rc)
                kv_model_restore(sess[b], snap + b * per, sess[b]->pos);
            else
                sess[b]->pos++;
        }
    }
    free(snap);
    return rc;
}

int kv_model_decode(kv_model_session_t *s, int32_t token, float *logits)
{
    return kv_model_decode_batch(&s, 1, &token, logits);
}
