/* SPDX-License-Identifier: MIT */
/*
 * eval_run.c — a policy's run over one input, with the reference's prompt
 * pass recorded and replayed for the policies that share it (eval_run.h).
 */
#include "eval_run.h"

#include <stdlib.h>
#include <string.h>

#define EVAL_CHUNK 256u /* prompt rows per forward chunk, recorded or not */

void eval_prompt_free(eval_prompt_t *rec)
{
    if (!rec)
        return;
    free(rec->q);
    free(rec->k);
    free(rec->v);
    free(rec->pos);
    free(rec->logits);
    *rec = (eval_prompt_t){0};
}

uint32_t eval_prompt_q0(const eval_policy_t *pols, uint32_t n, uint32_t n_tokens)
{
    const uint32_t chunk = EVAL_CHUNK;
    uint32_t rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!pols[i].share.shares)
            continue;
        if (pols[i].share.all_rows)
            return 0;
        rows = pols[i].share.rows > rows ? pols[i].share.rows : rows;
    }
    if (!n_tokens)
        return 0;
    uint32_t last = n_tokens - (n_tokens - 1) / chunk * chunk; /* rows of the last chunk */
    return n_tokens - (rows < last ? rows : last);
}

/* p grown to hold n elements of size sz (contents not kept), or NULL
 * when that fails (p freed, *cap 0). */
static void *grow(void *p, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap)
        return p;
    free(p);
    void *q = malloc(n * sz);
    *cap = q ? n : 0;
    return q;
}

#define GROW(field, cap, n) ((rec->field = grow(rec->field, &rec->cap, n, sizeof *rec->field)) != NULL)

static int prompt_reserve(eval_prompt_t *rec, const kv_model_t *m, uint32_t n, uint32_t q0)
{
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    rec->L = hp->n_layers;
    rec->QD = hp->n_q_heads * hp->head_dim;
    rec->KD = hp->n_kv_heads * hp->head_dim;
    rec->vocab = hp->vocab;
    rec->q0 = q0 < n ? q0 : n;
    rec->chunk = EVAL_CHUNK;
    rec->n = 0;
    const size_t kv = (size_t)rec->L * n * rec->KD;
    if (!GROW(q, cap_q, (size_t)rec->L * (n - rec->q0) * rec->QD + 1) || !GROW(k, cap_k, kv) ||
        !GROW(v, cap_v, kv) || !GROW(pos, cap_pos, n) || !GROW(logits, cap_logits, rec->vocab)) {
        eval_prompt_free(rec);
        return KV_ENOMEM;
    }
    rec->n = n;
    return 0;
}

/* pre_attn hook of the recorded forward pass: every call is a prompt chunk
 * of this (fresh) session, so its first position is its first row. */
static int record_pre(void *user, kv_model_layer_io_t *io)
{
    eval_prompt_t *rec = user;
    const uint32_t t0 = (uint32_t)io->pos[0], n = io->n, l = io->layer;
    if (io->batch != 1 || t0 + n > rec->n || l >= rec->L)
        return KV_EINVAL;
    memcpy(rec->k + ((size_t)l * rec->n + t0) * rec->KD, io->k, (size_t)n * rec->KD * 4);
    memcpy(rec->v + ((size_t)l * rec->n + t0) * rec->KD, io->v, (size_t)n * rec->KD * 4);
    if (l == 0)
        memcpy(rec->pos + t0, io->pos, (size_t)n * sizeof *io->pos);
    uint32_t a = t0 > rec->q0 ? t0 : rec->q0;
    if (a < t0 + n)
        memcpy(rec->q + ((size_t)l * (rec->n - rec->q0) + a - rec->q0) * rec->QD,
               io->q + (size_t)(a - t0) * rec->QD, (size_t)(t0 + n - a) * rec->QD * 4);
    return 0;
}

/* The recorded prompt into seq (policy attached, empty), as the forward
 * pass would have made the calls (eval_run.h). out: [chunk][QD] scratch. */
static int replay_into(kv_store_t *st, kv_seq_id_t seq, const eval_share_t *sh,
                       const eval_prompt_t *rec, float *out)
{
    const uint32_t n = rec->n;
    for (uint32_t c0 = 0; c0 < n; c0 += rec->chunk) {
        const uint32_t nc = n - c0 < rec->chunk ? n - c0 : rec->chunk;
        const int last = c0 + nc == n;
        uint32_t rows = sh->all_rows ? nc : last ? (sh->rows < nc ? sh->rows : nc) : 0;
        if (rows && c0 + nc - rows < rec->q0)
            return KV_EINVAL; /* the recording did not keep these queries */
        for (uint32_t l = 0; l < rec->L; l++) {
            const size_t kv = ((size_t)l * n + c0) * rec->KD;
            int rc = kv_append(st, seq, l, nc, KV_DTYPE_F32, rec->k + kv, rec->v + kv,
                               rec->pos + c0);
            if (rc)
                return rc;
            if (!rows)
                continue;
            const uint32_t r0 = c0 + nc - rows;
            kv_prefill_t pf = {
                .layer = l, .seq = seq, .n_new = rows, .out = out,
                .q = rec->q + ((size_t)l * (n - rec->q0) + r0 - rec->q0) * rec->QD};
            if ((rc = kv_attn_prefill(st, &pf)))
                return rc;
        }
    }
    return 0;
}

/* KV_ESTATE unless every page of the store is FP16. */
static int check_fp16(const kv_store_t *st)
{
    kv_stats_t s = {.struct_size = sizeof s};
    int rc = kv_store_stats(st, &s);
    for (unsigned f = 0; !rc && f < KV_FMT_COUNT; f++)
        if (f != KV_FMT_FP16 && s.pages_by_format[f])
            rc = KV_ESTATE;
    return rc;
}

static int start_replay(const eval_env_t *e, const eval_policy_t *p, const eval_prompt_t *rec,
                        const kv_model_session_opts_t *so, float *logits, eval_run_t *r)
{
    kv_seq_id_t seq;
    int rc = kv_seq_create(r->st, &seq);
    if (rc)
        return rc;
    float *out = malloc((size_t)rec->chunk * rec->QD * sizeof *out);
    if (!out)
        rc = KV_ENOMEM;
    if (!rc && !(rc = eval_policy_attach(p, r->st, seq)) &&
        !(rc = replay_into(r->st, seq, &p->share, rec, out)) && !(rc = check_fp16(r->st)))
        rc = kv_model_session_adopt(e->m, so, seq, rec->n, &r->s);
    free(out);
    if (rc) {
        kv_seq_free(r->st, seq);
        return rc;
    }
    r->seq = seq;
    memcpy(logits, rec->logits, (size_t)rec->vocab * sizeof *logits);
    return 0;
}

static int start_forward(const eval_env_t *e, const eval_policy_t *p, const int32_t *ids,
                         uint32_t n, const kv_model_session_opts_t *so, eval_prompt_t *rec,
                         uint32_t rec_q0, float *logits, eval_run_t *r)
{
    int rc = kv_model_session_create(e->m, so, &r->s);
    if (rc || (rc = kv_model_session_seq(r->s, &r->seq)) ||
        (rc = eval_policy_attach(p, r->st, r->seq)) ||
        (rec && (rc = prompt_reserve(rec, e->m, n, rec_q0))))
        return rc;
    if (rec) {
        kv_model_hook_t hook = {.pre_attn = record_pre, .user = rec};
        kv_model_session_set_hook(r->s, &hook);
    }
    rc = kv_model_forward(r->s, ids, n, logits, 1);
    if (rec) {
        kv_model_session_set_hook(r->s, NULL);
        if (rc)
            rec->n = 0; /* nothing to replay */
        else
            memcpy(rec->logits, logits, (size_t)rec->vocab * sizeof *logits);
    }
    return rc;
}

int eval_run_start(const eval_env_t *e, const eval_policy_t *p, const int32_t *ids,
                   uint32_t n, uint32_t max_tokens, const eval_prompt_t *replay,
                   eval_prompt_t *record, uint32_t record_q0, float *logits, eval_run_t *r)
{
    if (!e || !p || !ids || !n || !logits || !r)
        return KV_EINVAL;
    *r = (eval_run_t){.m = e->m, .tok = e->tok, .ids = ids, .n = n};
    if (replay && p->share.shares && replay->n != n)
        return KV_EINVAL;
    if (p->kvzip && !e->tok)
        return KV_EINVAL;
    kv_config_t cfg;
    /* KVzip: a reconstruction pass beside the sequence, one chunk long */
    const uint32_t zip =
        p->kvzip ? kv_model_kvzip_room(n < KV_MODEL_KVZIP_CHUNK ? n : KV_MODEL_KVZIP_CHUNK) : 0;
    int rc = kv_model_store_config(e->m, max_tokens + zip, 1 + e->forks + (zip > 0), e->threads,
                                   &cfg);
    if (rc)
        return rc;
    cfg.host_pages += cfg.host_pages / 4 + 64; /* conversions, merges in flight */
    cfg.flags |= p->store_flags;
    if ((rc = kv_store_create(&cfg, &r->st)))
        return rc;
    kv_model_session_opts_t so = {.store = r->st, .max_ctx = max_tokens, .chunk = EVAL_CHUNK,
                                  .n_threads = (int)e->threads};
    rc = replay && p->share.shares
             ? start_replay(e, p, replay, &so, logits, r)
             : start_forward(e, p, ids, n, &so, record, record_q0, logits, r);
    if (rc)
        eval_run_close(r);
    return rc;
}

void eval_run_close(eval_run_t *r)
{
    if (!r)
        return;
    kv_model_session_free(r->s);
    kv_store_destroy(r->st);
    *r = (eval_run_t){0};
}

int eval_run_fork(const eval_run_t *r, eval_run_t *child)
{
    *child = (eval_run_t){.m = r->m, .st = r->st};
    int rc = kv_model_session_fork(r->s, &child->s);
    if (!rc && (rc = kv_model_session_seq(child->s, &child->seq)))
        eval_run_close_fork(child);
    return rc;
}

void eval_run_close_fork(eval_run_t *child)
{
    kv_model_session_free(child->s);
    *child = (eval_run_t){0};
}

int eval_run_prefill_end(eval_run_t *r, const eval_policy_t *p)
{
    int rc = 0;
    if (p->kvzip && r->n)
        rc = kv_model_kvzip_score(r->s, r->tok, r->ids, r->n, 0, KV_MODEL_KVZIP_CHUNK);
    return rc ? rc : eval_policy_prefill_end(p, r->st, r->seq);
}

int eval_run_steps(eval_run_t *r, const eval_policy_t *p, eval_steps_t *s)
{
    const uint32_t vocab = kv_model_hparams(r->m)->vocab;
    s->nll = 0;
    s->n_out = 0;
    int rc = 0;
    for (uint32_t i = 0; i < s->n && !rc; i++) {
        if (s->before && (rc = s->before(s->user, i, s->logits)))
            break;
        int32_t next;
        if (s->force) {
            next = s->force[i];
        } else {
            next = kv_model_argmax(s->logits, vocab);
            if (kv_tok_type(s->tok, next) == KV_TOK_CONTROL)
                break;
            s->out[s->n_out++] = next;
            if (s->n_out == s->n || s->n_out == EVAL_STEPS_OUT)
                break;
        }
        if (!(rc = kv_model_decode(r->s, next, s->logits)) &&
            !(rc = eval_policy_step_end(p, r->st, r->seq)) && s->force)
            s->nll += kv_model_nll(s->logits, vocab, s->force[i + 1]);
    }
    return rc;
}

int eval_run_ask(eval_run_t *r, const eval_policy_t *p, const int32_t *ids, uint32_t n,
                 eval_steps_t *s)
{
    int rc = kv_model_forward(r->s, ids, n, s->logits, 1);
    if (!rc && !(rc = eval_policy_step_end(p, r->st, r->seq)))
        rc = eval_run_steps(r, p, s);
    return rc;
}
