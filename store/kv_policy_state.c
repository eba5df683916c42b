/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_state.c — the per-sequence policy state the store keeps, and
 * the statistics attention collects for it.
 *
 * The store's table (struct kv_store.pol, created at the first
 * kv_seq_set_policy) maps a sequence id to its kv_pol_seq_t: a copy of the
 * policy and its scores (kv_policy_int.h). Statistics are collected only for
 * sequences whose policy asks for them now (kv_pol_wants), into scratch the
 * store owns for the call; a caller's own stats buffers are filled as well.
 * Score vectors are resized before attention runs, so a failed resize
 * changes nothing the caller sees and a successful attention call cannot
 * fail afterwards.
 *
 * Ownership: the table and every state are kv_mem blocks counted in
 * table->bytes (kv_store_stats adds them to meta_bytes).
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

/* ---- memory --------------------------------------------------------------- */

static void *pol_alloc(kv_store_t *s, size_t n)
{
    void *p = kv_mem_calloc(1, n);
    if (p)
        s->pol->bytes += n;
    return p;
}

static void pol_free(kv_store_t *s, void *p, size_t n)
{
    if (!p)
        return;
    kv_mem_free(p, n);
    s->pol->bytes -= n;
}

int kv_pol_vec_resize(kv_store_t *s, kv_pol_vec_t *v, uint32_t n)
{
    if (n > v->cap) {
        uint32_t cap = v->cap ? v->cap : 64;
        while (cap < n)
            cap = cap > UINT32_MAX / 2 ? n : cap * 2;
        float *p = kv_mem_realloc(v->v, (size_t)v->cap * sizeof *p, (size_t)cap * sizeof *p);
        if (!p)
            return KV_ENOMEM;
        s->pol->bytes += (size_t)(cap - v->cap) * sizeof *p;
        v->v = p;
        v->cap = cap;
    }
    if (n > v->n)
        memset(v->v + v->n, 0, (size_t)(n - v->n) * sizeof *v->v);
    v->n = n;
    return 0;
}

static void vecs_free(kv_store_t *s, kv_pol_vec_t *vs, uint32_t n)
{
    if (!vs)
        return;
    for (uint32_t i = 0; i < n; i++)
        pol_free(s, vs[i].v, (size_t)vs[i].cap * sizeof(float));
    pol_free(s, vs, (size_t)n * sizeof *vs);
}

static void state_free(kv_store_t *s, kv_pol_seq_t *ps)
{
    if (!ps)
        return;
    vecs_free(s, ps->acc, ps->n_lists);
    vecs_free(s, ps->win, ps->n_lists);
    kv_pol_qmom_free(s, ps);
    pol_free(s, ps->sim_mass, ps->n_layers * sizeof *ps->sim_mass);
    pol_free(s, ps->lazy, ps->n_layers);
    pol_free(s, ps->hh_layer, ps->n_layers * sizeof *ps->hh_layer);
    pol_free(s, ps->k_list, ps->n_lists * sizeof *ps->k_list);
    pol_free(s, ps->target0, ps->n_layers);
    pol_free(s, ps, sizeof *ps);
}

void kv_pol_qmom_free(kv_store_t *s, kv_pol_seq_t *ps)
{
    pol_free(s, ps->qmom, ps->n_layers * kv_pol_eattn_mom_len(s) * sizeof *ps->qmom);
    ps->qmom = NULL;
}

/* Empty state for policy p (vectors per its needs). */
static kv_pol_seq_t *state_new(kv_store_t *s, const kv_policy_t *p)
{
    kv_pol_seq_t *ps = pol_alloc(s, sizeof *ps);
    if (!ps)
        return NULL;
    ps->pol = *p;
    ps->n_layers = s->cfg.n_layers;
    ps->n_lists = s->cfg.n_layers * s->cfg.n_kv_heads;
    ps->rng = p->cam_seed ? p->cam_seed : 0x9e3779b97f4a7c15ull;
    int need_acc = p->sel == KV_POL_SEL_H2O || p->sel == KV_POL_SEL_MINIKV || p->cam;
    int ok = (ps->hh_layer = pol_alloc(s, ps->n_layers * sizeof *ps->hh_layer)) &&
             (ps->target0 = pol_alloc(s, ps->n_layers));
    if (ok && need_acc)
        ok = (ps->acc = pol_alloc(s, ps->n_lists * sizeof *ps->acc)) != NULL;
    if (ok && p->ada == 2)
        ok = (ps->k_list = pol_alloc(s, ps->n_lists * sizeof *ps->k_list)) != NULL;
    if (ok && kv_pol_sel_scored(p->sel))
        ok = (ps->win = pol_alloc(s, ps->n_lists * sizeof *ps->win)) != NULL;
    if (ok && p->sel == KV_POL_SEL_EATTN)
        ok = (ps->qmom = pol_alloc(s, ps->n_layers * kv_pol_eattn_mom_len(s) *
                                          sizeof *ps->qmom)) != NULL;
    if (ok && p->sim) {
        ok = (ps->sim_mass = pol_alloc(s, ps->n_layers * sizeof *ps->sim_mass)) &&
             (ps->lazy = pol_alloc(s, ps->n_layers));
        for (uint32_t l = 0; ok && l < ps->n_layers; l++)
            ps->sim_mass[l] = -1.0f;
    }
    if (!ok) {
        state_free(s, ps);
        return NULL;
    }
    return ps;
}

static int vecs_copy(kv_store_t *s, const kv_pol_vec_t *src, kv_pol_vec_t *dst,
                     uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (kv_pol_vec_resize(s, &dst[i], src[i].n))
            return KV_ENOMEM;
        if (src[i].n)
            memcpy(dst[i].v, src[i].v, src[i].n * sizeof(float));
    }
    return 0;
}

/* ---- the table ------------------------------------------------------------ */

kv_pol_seq_t *kv_pol_get(const kv_store_t *s, kv_seq_id_t seq)
{
    if (!s->pol || seq >= s->pol->max_seqs)
        return NULL;
    return s->pol->seqs[seq];
}

static int table_ensure(kv_store_t *s)
{
    if (s->pol)
        return 0;
    kv_pol_table_t *t = kv_mem_calloc(1, sizeof *t);
    if (!t)
        return KV_ENOMEM;
    t->max_seqs = s->cfg.max_seqs;
    t->seqs = kv_mem_calloc(t->max_seqs, sizeof *t->seqs);
    if (!t->seqs) {
        kv_mem_free(t, sizeof *t);
        return KV_ENOMEM;
    }
    t->bytes = sizeof *t + (uint64_t)t->max_seqs * sizeof *t->seqs;
    s->pol = t;
    return 0;
}

void kv_pol_seq_drop(kv_store_t *s, kv_seq_id_t seq)
{
    kv_pol_seq_t *ps = kv_pol_get(s, seq);
    if (!ps)
        return;
    state_free(s, ps);
    s->pol->seqs[seq] = NULL;
}

kv_pol_seq_t *kv_pol_state_dup(kv_store_t *s, const kv_pol_seq_t *src)
{
    kv_pol_seq_t *ps = state_new(s, &src->pol);
    if (!ps)
        return NULL;
    int rc = 0;
    if (src->acc)
        rc = vecs_copy(s, src->acc, ps->acc, ps->n_lists);
    if (!rc && src->win)
        rc = vecs_copy(s, src->win, ps->win, ps->n_lists);
    if (!src->qmom) /* scored: the copy needs no moments */
        kv_pol_qmom_free(s, ps);
    else
        memcpy(ps->qmom, src->qmom, ps->n_layers * kv_pol_eattn_mom_len(s) * sizeof *ps->qmom);
    if (rc) {
        state_free(s, ps);
        return NULL;
    }
    ps->decoding = src->decoding;
    ps->prompt_len = src->prompt_len;
    ps->steps = src->steps;
    ps->sim_decided = src->sim_decided;
    ps->recent = src->recent;
    ps->rng = src->rng;
    ps->ea_scored = src->ea_scored;
    ps->zip_scored = src->zip_scored; /* a copy of a pass is not a pass */
    ps->ea_scale = src->ea_scale;
    memcpy(ps->hh_layer, src->hh_layer, ps->n_layers * sizeof *ps->hh_layer);
    memcpy(ps->target0, src->target0, ps->n_layers);
    if (src->k_list) {
        memcpy(ps->k_list, src->k_list, ps->n_lists * sizeof *ps->k_list);
        ps->k_set = src->k_set;
    }
    if (src->sim_mass) {
        memcpy(ps->sim_mass, src->sim_mass, ps->n_layers * sizeof *ps->sim_mass);
        memcpy(ps->lazy, src->lazy, ps->n_layers);
    }
    return ps;
}

void kv_pol_state_free(kv_store_t *s, kv_pol_seq_t *ps)
{
    state_free(s, ps);
}

void kv_pol_state_put(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    kv_pol_seq_drop(s, seq);
    s->pol->seqs[seq] = ps;
}

int kv_pol_seq_fork(kv_store_t *s, kv_seq_id_t parent, kv_seq_id_t child)
{
    const kv_pol_seq_t *src = kv_pol_get(s, parent);
    if (!src)
        return 0;
    kv_pol_seq_t *ps = kv_pol_state_dup(s, src);
    if (!ps)
        return KV_ENOMEM;
    kv_pol_state_put(s, child, ps);
    return 0;
}

void kv_pol_table_destroy(kv_store_t *s)
{
    if (!s->pol)
        return;
    for (uint32_t i = 0; i < s->pol->max_seqs; i++)
        kv_pol_seq_drop(s, i);
    kv_mem_free(s->pol->seqs, (size_t)s->pol->max_seqs * sizeof *s->pol->seqs);
    kv_mem_free(s->pol, sizeof *s->pol);
    s->pol = NULL;
}

uint64_t kv_pol_meta_bytes(const kv_store_t *s)
{
    return s->pol ? s->pol->bytes : 0;
}

uint32_t kv_pol_wants(const kv_pol_seq_t *ps)
{
    const kv_policy_t *p = &ps->pol;
    uint32_t w = 0;
    if (p->sel == KV_POL_SEL_H2O || p->cam)
        w |= KV_POL_WANT_ACC;
    if (p->sel == KV_POL_SEL_MINIKV && !ps->decoding)
        w |= KV_POL_WANT_ACC;
    if (p->sel == KV_POL_SEL_SNAPKV && !ps->decoding)
        w |= KV_POL_WANT_WIN;
    if (p->sel == KV_POL_SEL_EATTN && !ps->decoding)
        w |= KV_POL_WANT_Q;
    if (ps->zip_pass)
        w |= KV_POL_WANT_ZIP;
    if (p->sim && !ps->sim_decided) {
        if (p->sim_mode == KV_POL_SIM_PREFILL && !ps->decoding)
            w |= KV_POL_WANT_SIM;
        if (p->sim_mode == KV_POL_SIM_DECODE && ps->decoding && ps->steps == 0)
            w |= KV_POL_WANT_SIM;
    }
    return w;
}

/* ---- kv_seq_set_policy ---------------------------------------------------- */

/* Layers [0, n_layers) and the format each must start with; UINT32_MAX:
 * leave as it is. Formats of selections are applied at prefill end. */
static uint32_t start_format(const kv_store_t *s, const kv_policy_t *p, uint32_t l)
{
    if (p->mc) {
        uint32_t S = kv_pol_merge_first(p, s->cfg.n_layers);
        int paired = l >= S && (l - S) / 2 * 2 + S + 1 < s->cfg.n_layers;
        if (paired)
            return KV_FMT_FP16;
        return p->fmt_given ? kv_pol_target(p) : UINT32_MAX;
    }
    if (p->fmt_given && !p->sel)
        return kv_pol_target(p);
    if (p->sel)
        return KV_FMT_FP16; /* prompt stays exact until selection */
    return UINT32_MAX;
}

int kv_seq_set_policy(kv_store_t *s, kv_seq_id_t seq, const kv_policy_t *policy)
{
    if (!s)
        return KV_EINVAL;
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    if (!policy) {
        kv_pol_seq_drop(s, seq);
        return 0;
    }
    for (uint32_t l = 0; l < s->cfg.n_layers; l++)
        for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++)
            if (kv_page_list_get(s->pt, seq, l, h)->n_tokens)
                return KV_ESTATE;
    if (policy->fmt_given && policy->residual != s->cfg.residual)
        return KV_ENOTSUP; /* r is the store's residual (kv_config_t.residual) */
    int rc = table_ensure(s);
    if (rc)
        return rc;
    kv_pol_seq_t *ps = state_new(s, policy);
    if (!ps)
        return KV_ENOMEM;
    /* Formats: set_format allocates nothing; on KV_ENOTSUP restore. */
    uint32_t L = s->cfg.n_layers, l;
    uint32_t *old = kv_mem_alloc(L * sizeof *old);
    if (!old) {
        state_free(s, ps);
        return KV_ENOMEM;
    }
    for (l = 0; l < L; l++)
        old[l] = kv_page_list_get(s->pt, seq, l, 0)->target;
    for (l = 0; l < L && rc == 0; l++) {
        uint32_t f = start_format(s, policy, l);
        if (f != UINT32_MAX)
            rc = kv_page_set_format(s->pt, seq, l, f);
        const int check = policy->sel && (policy->fmt_given || policy->rot);
        if (!rc && check) { /* checked now, set later */
            rc = kv_page_set_format(s->pt, seq, l, kv_pol_target(policy));
            rc = rc && rc != KV_EINVAL ? KV_ENOTSUP : rc; /* EINVAL: rot=1 */
        }
        if (!rc && check)
            rc = kv_page_set_format(s->pt, seq, l, KV_FMT_FP16);
    }
    if (rc) {
        for (l = 0; l < L; l++)
            kv_page_set_format(s->pt, seq, l, old[l]);
        kv_mem_free(old, L * sizeof *old);
        state_free(s, ps);
        return rc;
    }
    kv_mem_free(old, L * sizeof *old);
    kv_pol_seq_drop(s, seq);
    s->pol->seqs[seq] = ps;
    return 0;
}

/* ---- statistics during attention ------------------------------------------ */

/* Longest list of (seq, layer) and resize the acc vectors to each list. */
static uint32_t layer_max_len(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer)
{
    uint32_t m = 0;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        uint32_t n = kv_page_list_get(s->pt, seq, layer, h)->n_tokens;
        m = n > m ? n : m;
    }
    return m;
}

static int acc_reserve(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer)
{
    const uint32_t H = s->cfg.n_kv_heads;
    for (uint32_t h = 0; h < H; h++) {
        uint32_t n = kv_page_list_get(s->pt, seq, layer, h)->n_tokens;
        if (kv_pol_vec_resize(s, &ps->acc[layer * H + h], n))
            return KV_ENOMEM;
    }
    return 0;
}

static void acc_add(kv_store_t *s, kv_pol_seq_t *ps, uint32_t layer,
                    const float *st, uint32_t stride)
{
    const uint32_t H = s->cfg.n_kv_heads;
    for (uint32_t h = 0; h < H; h++) {
        kv_pol_vec_t *v = &ps->acc[layer * H + h];
        for (uint32_t t = 0; t < v->n; t++)
            v->v[t] += st[(size_t)h * stride + t];
    }
}

/* SimLayerKV mass of one layer from stats of `rows` query rows. */
static float sim_mass(const kv_store_t *s, kv_seq_id_t seq, const kv_policy_t *p,
                      uint32_t layer, const float *st, uint32_t stride, uint32_t rows)
{
    double m = 0;
    for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++) {
        uint32_t n = kv_page_list_get(s->pt, seq, layer, h)->n_tokens;
        for (uint32_t t = 0; t < n; t++)
            if (t < p->sim_sink || t + p->sim_w >= n)
                m += st[(size_t)h * stride + t];
    }
    return (float)(m / ((double)s->cfg.n_q_heads * rows));
}

int kv_pol_attn_prefill(kv_store_t *s, const kv_prefill_t *a, kv_pol_seq_t *ps)
{
    if (!a->q || !a->out || a->n_new == 0 || a->layer >= s->cfg.n_layers ||
        !kv_page_seq_live(s->pt, a->seq))
        return kv_store_prefill_raw(s, a); /* reports the error */
    uint32_t want = kv_pol_wants(ps);
    const uint32_t H = s->cfg.n_kv_heads, Hq = s->cfg.n_q_heads, D = s->cfg.head_dim;
    int rc;
    /* KVzip first: it reads only keys and queries, and a max is idempotent,
     * so a call that fails later leaves scores a retry reproduces */
    if ((want & KV_POL_WANT_ZIP) && (rc = kv_pol_kvzip_observe(s, a, ps)))
        return rc;
    uint32_t stride = layer_max_len(s, a->seq, a->layer);
    if (a->n_new > stride)
        return kv_store_prefill_raw(s, a);
    if ((want & KV_POL_WANT_ACC) && (rc = acc_reserve(s, a->seq, ps, a->layer)))
        return rc;
    uint32_t rows_max = 0;
    if (want & KV_POL_WANT_WIN)
        rows_max = ps->pol.window;
    if ((want & KV_POL_WANT_SIM) && ps->pol.sim_rows > rows_max)
        rows_max = ps->pol.sim_rows;
    rows_max = rows_max < a->n_new ? rows_max : a->n_new;
    size_t st_n = (size_t)H * stride, out_n = (size_t)rows_max * Hq * D;
    size_t bytes = (st_n + out_n) * sizeof(float);
    float *buf = kv_mem_alloc(bytes);
    if (!buf)
        return KV_ENOMEM;
    float *scr_out = buf + st_n;
    kv_prefill_t b = *a;
    if ((want & KV_POL_WANT_ACC) && !a->stats) {
        b.stats = buf, b.stats_stride = stride, b.stats_row0 = 0;
        if (!(rc = kv_store_prefill_raw(s, &b)))
            acc_add(s, ps, a->layer, buf, stride);
    } else if ((rc = kv_store_prefill_raw(s, a)) == 0 && (want & KV_POL_WANT_ACC)) {
        if (a->stats_row0 == 0) {
            acc_add(s, ps, a->layer, a->stats, a->stats_stride);
        } else { /* the caller counted other rows: one more pass, all rows */
            float *o2 = kv_mem_alloc((size_t)a->n_new * Hq * D * sizeof(float));
            if (!o2) {
                rc = KV_ENOMEM;
            } else {
                b.out = o2, b.stats = buf, b.stats_stride = stride, b.stats_row0 = 0;
                if (!(rc = kv_store_prefill_raw(s, &b)))
                    acc_add(s, ps, a->layer, buf, stride);
                kv_mem_free(o2, (size_t)a->n_new * Hq * D * sizeof(float));
            }
        }
    }
    /* Window passes: the last r rows again, as a prefill of r new tokens
     * (same keys, same causal mask), into scratch. */
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        uint32_t bit = pass ? KV_POL_WANT_SIM : KV_POL_WANT_WIN;
        if (!(want & bit))
            continue;
        uint32_t r = pass ? ps->pol.sim_rows : ps->pol.window;
        r = r < a->n_new ? r : a->n_new;
        kv_prefill_t w = *a;
        w.n_new = r;
        w.q = a->q + (size_t)(a->n_new - r) * Hq * D;
        w.out = scr_out, w.stats = buf, w.stats_stride = stride, w.stats_row0 = 0;
        if ((rc = kv_store_prefill_raw(s, &w)))
            break;
        if (pass) {
            ps->sim_mass[a->layer] = sim_mass(s, a->seq, &ps->pol, a->layer, buf, stride, r);
            continue;
        }
        for (uint32_t h = 0; h < H && rc == 0; h++) {
            kv_pol_vec_t *v = &ps->win[a->layer * H + h];
            uint32_t n = kv_page_list_get(s->pt, a->seq, a->layer, h)->n_tokens;
            if ((rc = kv_pol_vec_resize(s, v, n)) == 0)
                memcpy(v->v, buf + (size_t)h * stride, n * sizeof(float));
        }
    }
    kv_mem_free(buf, bytes);
    if (rc == 0 && (want & KV_POL_WANT_Q) && ps->qmom)
        kv_pol_eattn_observe(s, ps, a);
    return rc;
}

int kv_pol_attn_decode(kv_store_t *s, const kv_decode_t *a)
{
    if (!a->seqs || !a->q || !a->out || a->batch == 0 || a->layer >= s->cfg.n_layers)
        return kv_store_decode_raw(s, a);
    const uint32_t B = a->batch, H = s->cfg.n_kv_heads;
    uint32_t stride = a->stats ? a->stats_stride : 0;
    for (uint32_t b = 0; b < B; b++) {
        if (!kv_page_seq_live(s->pt, a->seqs[b]))
            return kv_store_decode_raw(s, a);
        uint32_t n = layer_max_len(s, a->seqs[b], a->layer);
        if (a->stats && a->stats[b] && a->stats_stride < n)
            return KV_ERANGE;
        stride = n > stride ? n : stride;
    }
    size_t pbytes = (size_t)B * sizeof(float *), sbytes = (size_t)B * H * stride * sizeof(float);
    float **sp = kv_mem_alloc(pbytes);
    float *buf = kv_mem_alloc(sbytes);
    int rc = 0;
    if (!sp || !buf)
        rc = KV_ENOMEM;
    for (uint32_t b = 0; b < B && rc == 0; b++) {
        kv_pol_seq_t *ps = kv_pol_get(s, a->seqs[b]);
        uint32_t want = ps ? kv_pol_wants(ps) : 0;
        sp[b] = (want || (a->stats && a->stats[b])) ? buf + (size_t)b * H * stride : NULL;
        if (want & KV_POL_WANT_ACC)
            rc = acc_reserve(s, a->seqs[b], ps, a->layer);
    }
    if (rc == 0) {
        kv_decode_t d = *a;
        d.stats = sp, d.stats_stride = stride;
        rc = kv_store_decode_raw(s, &d);
    }
    for (uint32_t b = 0; b < B && rc == 0; b++) {
        kv_seq_id_t seq = a->seqs[b];
        kv_pol_seq_t *ps = kv_pol_get(s, seq);
        uint32_t want = ps ? kv_pol_wants(ps) : 0;
        const float *st = buf + (size_t)b * H * stride;
        if (a->stats && a->stats[b])
            for (uint32_t h = 0; h < H; h++)
                memcpy(a->stats[b] + (size_t)h * a->stats_stride, st + (size_t)h * stride,
                       kv_page_list_get(s->pt, seq, a->layer, h)->n_tokens * sizeof(float));
        if (want & KV_POL_WANT_ACC)
            acc_add(s, ps, a->layer, st, stride);
        if (want & KV_POL_WANT_SIM)
            ps->sim_mass[a->layer] = sim_mass(s, seq, &ps->pol, a->layer, st, stride, 1);
    }
    kv_mem_free(buf, sbytes);
    kv_mem_free(sp, pbytes);
    return rc;
}

/* ---- prefix-cache restore (kv_store_prefix.c) ------------------------------ */

int kv_pol_acc_stage(const kv_pol_seq_t *ps, const float *snap, uint32_t n, float ***out)
{
    *out = NULL;
    if (!ps->acc || n == 0)
        return KV_EINVAL;
    float **st = kv_mem_calloc(ps->n_lists, sizeof *st);
    if (!st)
        return KV_ENOMEM;
    for (uint32_t i = 0; i < ps->n_lists; i++) {
        if (!(st[i] = kv_mem_alloc((size_t)n * sizeof(float)))) {
            kv_pol_acc_unstage(ps, st, n);
            return KV_ENOMEM;
        }
        memcpy(st[i], snap + (size_t)i * n, (size_t)n * sizeof(float));
    }
    *out = st;
    return 0;
}

void kv_pol_acc_unstage(const kv_pol_seq_t *ps, float **staged, uint32_t n)
{
    if (!staged)
        return;
    for (uint32_t i = 0; i < ps->n_lists; i++)
        kv_mem_free(staged[i], staged[i] ? (size_t)n * sizeof(float) : 0);
    kv_mem_free(staged, (size_t)ps->n_lists * sizeof *staged);
}

void kv_pol_acc_commit(kv_store_t *s, kv_pol_seq_t *ps, float **staged, uint32_t n)
{
    for (uint32_t i = 0; i < ps->n_lists; i++) {
        kv_pol_vec_t *v = &ps->acc[i];
        pol_free(s, v->v, (size_t)v->cap * sizeof(float));
        v->v = staged[i];
        v->n = v->cap = n;
        s->pol->bytes += (size_t)n * sizeof(float);
    }
    kv_mem_free(staged, (size_t)ps->n_lists * sizeof *staged);
}
