/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_select.c — which tokens a list keeps, and keeping them.
 *
 * Selection works per (layer, kv_head) list on scores parallel to the list
 * (kv_policy_int.h): StreamingLLM (sinks + recent), H2O and MiniKV (top-hh
 * accumulated attention outside the recent window + the window), SnapKV
 * (top C-w of the max-pooled window scores + the window), SimLayerKV trim
 * (sink + last w). kv_pol_keep compacts the list and its score vectors and,
 * with CaM, first merges each evicted token's value into the m tokens
 * that follow it, heavy hitters skipped (V_j += M V_e / m, M ~
 * Bernoulli(clamp(A_e / mean A_j, 0, 1)), one draw per evicted token and kv
 * head, in position order; see cam_plan).
 * kv_pol_keep is all-or-nothing: CaM's value update is undone (in place, no
 * allocation: its pages are private by then) if the compaction fails.
 * Ties in top-k keep the lower index.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

uint32_t kv_pol_amount(kv_pol_amount_t a, uint32_t T)
{
    if (!a.is_ratio)
        return (uint32_t)a.v;
    return (uint32_t)floor(a.v * T + 0.5);
}

void kv_pol_budgets(const kv_policy_t *p, uint32_t T, uint32_t *hh, uint32_t *recent)
{
    *hh = kv_pol_amount(p->hh, T);
    *recent = kv_pol_amount(p->recent, T);
    if (*recent == 0 && !kv_pol_sel_scored(p->sel))
        *recent = 1; /* the newest token always stays */
}

uint32_t kv_pol_merge_first(const kv_policy_t *p, uint32_t n_layers)
{
    return (uint32_t)(n_layers * p->mc_from);
}

uint32_t kv_pol_pyramid(uint32_t h, uint32_t p, uint32_t l, uint32_t L)
{
    if (p == 0 || L < 2)
        return h;
    double hi = 2.0 * h - (double)h / p, lo = (double)h / p;
    double x = hi + (lo - hi) * (double)l / (double)(L - 1);
    return (uint32_t)floor(x + 0.5);
}

void kv_pol_maxpool(const float *in, uint32_t n, uint32_t kernel, float *out)
{
    uint32_t r = kernel / 2;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t a = i > r ? i - r : 0, b = i + r < n ? i + r : n - 1;
        float m = in[a];
        for (uint32_t j = a + 1; j <= b; j++)
            m = in[j] > m ? in[j] : m;
        out[i] = m;
    }
}

/* Sort key: descending score, then ascending index. */
static uint64_t key_of(float f, uint32_t i)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending order */
    return ((uint64_t)~u << 32) | i;
}

/* ada=1 for layers of at most this many kv heads (plans on the stack);
 * wider layers select per list. */
#define KV_MAX_KV_HEADS_SEL 64u

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

uint32_t kv_pol_topk_keep(const float *score, uint32_t n_cand, uint32_t n,
                          uint32_t k, uint32_t *keep, uint32_t *scratch)
{
    uint32_t m = 0;
    if (k >= n_cand) {
        for (uint32_t i = 0; i < n_cand; i++)
            keep[m++] = i;
    } else if (k + 1 == n_cand) { /* evict one: the lowest, highest index on ties */
        uint32_t worst = 0;
        for (uint32_t i = 1; i < n_cand; i++)
            if (score[i] <= score[worst])
                worst = i;
        for (uint32_t i = 0; i < n_cand; i++)
            if (i != worst)
                keep[m++] = i;
    } else if (k) {
        uint64_t *keys = (uint64_t *)(void *)scratch;
        for (uint32_t i = 0; i < n_cand; i++)
            keys[i] = key_of(score[i], i);
        qsort(keys, n_cand, sizeof *keys, cmp_u64);
        for (uint32_t i = 0; i < k; i++)
            keep[m++] = (uint32_t)keys[i];
        qsort(keep, m, sizeof *keep, cmp_u32);
    }
    for (uint32_t i = n_cand; i < n; i++)
        keep[m++] = i;
    return m;
}

static void vec_compact(kv_pol_vec_t *v, const uint32_t *keep, uint32_t n_keep)
{
    if (!v || v->n == 0)
        return;
    for (uint32_t i = 0; i < n_keep; i++)
        v->v[i] = keep[i] < v->n ? v->v[keep[i]] : 0.0f;
    v->n = n_keep < v->n ? n_keep : v->n;
}

static double rng_uniform(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (double)(*x >> 11) / 9007199254740992.0;
}

/* CaM over one list (old indices): the evicted tokens, in position order,
 * each merge into the next m tokens after them that are not kept heavy
 * hitters (the then-oldest tokens of a window sliding over the sequence;
 * for a single eviction while decoding: the m oldest of the recent window).
 * Merged values travel on when their token is evicted later, so only the
 * first mm tokens of the final window [t0, t0+mm) change: their originals
 * go to ov, their new values to nv ([mm][D]). vb: [n - e0][D] scratch. */
static int cam_plan(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer,
                    uint32_t head, const uint32_t *keep, uint32_t n_keep, uint32_t n,
                    uint32_t t0, uint32_t mm, float *ov, float *nv, float *vb,
                    uint32_t e0, uint8_t *cls)
{
    const uint32_t D = s->cfg.head_dim, m = ps->pol.cam_m;
    kv_pol_vec_t *acc = &ps->acc[layer * s->cfg.n_kv_heads + head];
    int rc = kv_pol_vec_resize(s, acc, n);
    if (rc || (rc = kv_page_read(s->pt, seq, layer, head, e0, n - e0, NULL, vb, NULL)))
        return rc;
    /* cls: 0 evicted, 1 kept heavy hitter, 2 recent window */
    for (uint32_t i = e0, k = 0; i < n; i++) {
        while (k < n_keep && keep[k] < i)
            k++;
        cls[i - e0] = i >= t0 ? 2 : (k < n_keep && keep[k] == i) ? 1 : 0;
    }
    uint32_t *tg = (uint32_t *)(void *)(cls + (n - e0)); /* [m] targets */
    for (uint32_t e = e0; e < t0; e++) {
        if (cls[e - e0] != 0)
            continue;
        uint32_t nt = 0;
        double mean = 0;
        for (uint32_t j = e + 1; j < n && nt < m; j++)
            if (cls[j - e0] != 1) {
                tg[nt++] = j;
                mean += acc->v[j];
            }
        if (nt == 0)
            continue;
        mean /= nt;
        double p = mean > 0 ? acc->v[e] / mean : acc->v[e] > 0;
        p = p < 0 ? 0 : p > 1 ? 1 : p;
        int mask = ps->pol.cam_force || rng_uniform(&ps->rng) < p;
        if (!mask)
            continue;
        const float *ve = vb + (size_t)(e - e0) * D;
        for (uint32_t q = 0; q < nt; q++) {
            float *vj = vb + (size_t)(tg[q] - e0) * D;
            for (uint32_t d = 0; d < D; d++) {
                float x = vj[d] + ve[d] / (float)m;
                vj[d] = x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
            }
        }
    }
    memcpy(nv, vb + (size_t)(t0 - e0) * D, (size_t)mm * D * sizeof *nv);
    return kv_page_read(s->pt, seq, layer, head, t0, mm, NULL, ov, NULL);
}

int kv_pol_keep(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer,
                uint32_t head, const uint32_t *keep, uint32_t n_keep, uint32_t win_tokens)
{
    const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, head);
    const uint32_t n = l->n_tokens, D = s->cfg.head_dim;
    if (n_keep >= n)
        return 0;
    int cam = ps->pol.cam && win_tokens > 0;
    uint32_t mm = 0, t0 = 0;
    float *mem = NULL;
    size_t bytes = 0;
    uint64_t rng0 = ps->rng;
    int rc = 0;
    if (cam) {
        mm = ps->pol.cam_m < win_tokens ? ps->pol.cam_m : win_tokens;
        t0 = n - win_tokens;
        uint32_t e0 = 0; /* first evicted token */
        while (e0 < n_keep && keep[e0] == e0)
            e0++;
        bytes = ((size_t)2 * mm * D + (size_t)(n - e0) * D) * sizeof *mem +
                (n - e0) + (size_t)ps->pol.cam_m * sizeof(uint32_t) + 8;
        if (!(mem = kv_mem_alloc(bytes)))
            return KV_ENOMEM;
        float *vb = mem + (size_t)2 * mm * D;
        uint8_t *cls = (uint8_t *)(vb + (size_t)(n - e0) * D);
        cls += (4 - ((uintptr_t)cls + (n - e0)) % 4) % 4; /* align targets */
        rc = cam_plan(s, seq, ps, layer, head, keep, n_keep, n, t0, mm, mem,
                      mem + (size_t)mm * D, vb, e0, cls);
        if (!rc)
            rc = kv_page_update_v(s->pt, seq, layer, head, t0, mm, mem + (size_t)mm * D);
        if (rc) {
            ps->rng = rng0;
            kv_mem_free(mem, bytes);
            return rc;
        }
    }
    rc = kv_page_compact(s->pt, seq, layer, head, keep, n_keep);
    if (rc) {
        if (cam) {
            int urc = kv_page_update_v(s->pt, seq, layer, head, t0, mm, mem);
            assert(urc == 0);
            (void)urc;
            ps->rng = rng0;
        }
    } else {
        const uint32_t i = layer * s->cfg.n_kv_heads + head;
        if (ps->acc)
            vec_compact(&ps->acc[i], keep, n_keep);
        if (ps->win)
            vec_compact(&ps->win[i], keep, n_keep);
    }
    kv_mem_free(mem, bytes);
    return rc;
}

int kv_pol_sim_trim(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer,
                    uint32_t head)
{
    const kv_policy_t *p = &ps->pol;
    uint32_t n = kv_page_list_get(s->pt, seq, layer, head)->n_tokens;
    if (n <= p->sim_sink + p->sim_w)
        return 0;
    uint32_t n_keep = p->sim_sink + p->sim_w;
    uint32_t *keep = kv_mem_alloc(n_keep * sizeof *keep);
    if (!keep)
        return KV_ENOMEM;
    for (uint32_t i = 0; i < n_keep; i++)
        keep[i] = i < p->sim_sink ? i : n - n_keep + i;
    int rc = kv_pol_keep(s, seq, ps, layer, head, keep, n_keep, 0);
    kv_mem_free(keep, n_keep * sizeof *keep);
    return rc;
}

/* What one list's selection keeps: the top k of candidates [0, n_cand)
 * plus [n_cand, n); nothing to do when n <= budget (or skip). */
typedef struct sel_plan {
    uint32_t n, n_cand, k, win, budget;
    int skip;
} sel_plan_t;

static sel_plan_t plan_list(const kv_store_t *s, kv_seq_id_t seq, const kv_pol_seq_t *ps,
                            uint32_t layer, uint32_t head, int at_prefill)
{
    const kv_policy_t *p = &ps->pol;
    sel_plan_t pl = {.n = kv_page_list_get(s->pt, seq, layer, head)->n_tokens};
    const uint32_t n = pl.n;
    switch (p->sel) {
    case KV_POL_SEL_STREAM:
        pl.win = ps->recent;
        pl.budget = p->sink + pl.win;
        pl.n_cand = n > pl.win ? n - pl.win : 0;
        pl.k = p->sink;
        break;
    case KV_POL_SEL_H2O:
    case KV_POL_SEL_MINIKV:
        if (p->sel == KV_POL_SEL_MINIKV && !at_prefill)
            pl.skip = 1; /* heavy hitters frozen while decoding */
        pl.win = ps->recent;
        pl.k = ps->hh_layer[layer];
        pl.budget = pl.k + pl.win;
        pl.n_cand = n > pl.win ? n - pl.win : 0;
        break;
    case KV_POL_SEL_SNAPKV: /* the last `window` kept, the rest scored   */
    case KV_POL_SEL_EATTN:  /* the last rw kept, the rest scored (sinks +inf) */
    case KV_POL_SEL_KVZIP:  /* every token scored (sinks +inf)          */
        pl.skip = !at_prefill;
        pl.budget = ps->hh_layer[layer];
        pl.win = p->sel == KV_POL_SEL_SNAPKV  ? p->window
                 : p->sel == KV_POL_SEL_EATTN ? ps->recent
                                              : 0;
        pl.win = pl.win < n ? pl.win : n;
        pl.win = pl.win < pl.budget ? pl.win : pl.budget;
        pl.k = pl.budget - pl.win;
        pl.n_cand = n - pl.win;
        break;
    default:
        pl.skip = 1;
    }
    return pl;
}

/* The candidates' scores of one list into *score (pooled: [n_cand]
 * scratch for SnapKV's max-pool, the sinks' marks for StreamingLLM). */
static int list_scores(kv_store_t *s, kv_pol_seq_t *ps, uint32_t i, const sel_plan_t *pl,
                       float *pooled, const float **score)
{
    const kv_policy_t *p = &ps->pol;
    if (p->sel == KV_POL_SEL_STREAM) {
        memset(pooled, 0, pl->n_cand * sizeof *pooled);
        for (uint32_t t = 0; t < pl->n_cand && t < pl->k; t++)
            pooled[t] = 1.0f; /* the sinks */
        *score = pooled;
        return 0;
    }
    kv_pol_vec_t *v = kv_pol_sel_scored(p->sel) ? &ps->win[i] : &ps->acc[i];
    int rc = kv_pol_vec_resize(s, v, pl->n);
    *score = v->v;
    if (rc == 0 && p->sel == KV_POL_SEL_SNAPKV && pl->n_cand) {
        kv_pol_maxpool(v->v, pl->n_cand, p->kernel, pooled);
        *score = pooled;
    }
    return rc;
}

static int cmp_u64_desc(const void *a, const void *b)
{
    return cmp_u64(b, a);
}

void kv_pol_ada_split(const float *const *score, const uint32_t *n_cand, uint32_t H,
                      uint32_t k, double alpha, uint32_t *k_out, uint64_t *keys)
{
    const uint32_t floor_k = (uint32_t)floor(alpha * k);
    uint64_t total = 0, floors = 0, m = 0;
    for (uint32_t h = 0; h < H; h++) {
        total += n_cand[h];
        k_out[h] = floor_k < n_cand[h] ? floor_k : n_cand[h];
        floors += k_out[h];
    }
    const uint64_t budget = (uint64_t)H * k;
    if (total <= budget) {
        for (uint32_t h = 0; h < H; h++)
            k_out[h] = n_cand[h];
        return;
    }
    /* The pool: every head's candidates but its top k_out[h] (a head's
     * best first, so its floor is its top floor_k): key = score, then
     * lower head first (key_of orders descending score, ascending index). */
    for (uint32_t h = 0; h < H; h++) {
        uint64_t *hk = keys + m;
        for (uint32_t t = 0; t < n_cand[h]; t++)
            hk[t] = key_of(score[h][t], t);
        qsort(hk, n_cand[h], sizeof *hk, cmp_u64);
        for (uint32_t t = k_out[h]; t < n_cand[h]; t++) {
            uint32_t u = (uint32_t)(~(hk[t] >> 32)); /* the score's order key */
            keys[m++] = ((uint64_t)u << 32) | (uint32_t)(~h);
        }
    }
    qsort(keys, m, sizeof *keys, cmp_u64_desc);
    for (uint64_t r = 0; r < budget - floors && r < m; r++)
        k_out[~(uint32_t)keys[r]]++;
}

/* Keep the top k of one list's candidates (+ the rest past n_cand). */
static int keep_top(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer,
                    uint32_t head, const sel_plan_t *pl, const float *score, uint32_t k,
                    uint64_t *scr, uint32_t *keep)
{
    const kv_policy_t *p = &ps->pol;
    uint32_t n_keep = kv_pol_topk_keep(score, pl->n_cand, pl->n, k, keep, (uint32_t *)(void *)scr);
    uint32_t cam_win = p->sel == KV_POL_SEL_STREAM || p->sel == KV_POL_SEL_H2O ? pl->win : 0;
    return kv_pol_keep(s, seq, ps, layer, head, keep, n_keep, cam_win);
}

int kv_pol_select_split(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    if (ps->pol.ada != 2 || ps->k_set)
        return 0;
    const uint32_t H = s->cfg.n_kv_heads, N = ps->n_lists;
    uint64_t sum_cand = 0;
    for (uint32_t i = 0; i < N; i++)
        sum_cand += plan_list(s, seq, ps, i / H, i % H, 1).n_cand;
    size_t bytes = (size_t)N * (sizeof(uint32_t) + sizeof(const float *)) +
                   sum_cand * (sizeof(uint64_t) + sizeof(float));
    char *mem = kv_mem_alloc(bytes);
    if (!mem)
        return KV_ENOMEM;
    const float **score = (const float **)(void *)mem;
    uint64_t *keys = (uint64_t *)(void *)(score + N);
    float *pooled = (float *)(void *)(keys + sum_cand);
    uint32_t *n_cand = (uint32_t *)(void *)(pooled + sum_cand), k = 0;
    int rc = 0;
    for (uint32_t i = 0, at = 0; i < N && !rc; at += n_cand[i], i++) {
        sel_plan_t pl = plan_list(s, seq, ps, i / H, i % H, 1);
        n_cand[i] = pl.n_cand;
        k = i ? k : pl.k; /* the layers' budgets are one (no pyramid here) */
        rc = list_scores(s, ps, i, &pl, pooled + at, &score[i]);
    }
    if (!rc) {
        kv_pol_ada_split(score, n_cand, N, k, ps->pol.ada_alpha, ps->k_list, keys);
        ps->k_set = 1;
    }
    kv_mem_free(mem, bytes);
    return rc;
}

int kv_pol_select_layer(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, uint32_t layer,
                        int at_prefill)
{
    const uint32_t H = s->cfg.n_kv_heads;
    if (plan_list(s, seq, ps, layer, 0, at_prefill).skip)
        return 0;
    if (ps->pol.ada != 1 || H == 1 || H > KV_MAX_KV_HEADS_SEL) { /* per list */
        int rc = 0;
        for (uint32_t h = 0; h < H && !rc; h++) {
            sel_plan_t q = plan_list(s, seq, ps, layer, h, at_prefill);
            if (ps->pol.ada == 2 && ps->k_set) /* its share of the sequence's */
                q.k = ps->k_list[layer * H + h];
            if (q.n_cand <= q.k)
                continue;
            size_t bytes = (size_t)q.n * sizeof(uint32_t) +
                           (size_t)q.n_cand * (sizeof(uint64_t) + sizeof(float));
            char *mem = kv_mem_alloc(bytes);
            if (!mem)
                return KV_ENOMEM;
            uint64_t *scr = (uint64_t *)(void *)mem;
            float *pooled = (float *)(void *)(scr + q.n_cand);
            uint32_t *keep = (uint32_t *)(void *)(pooled + q.n_cand);
            const float *sc;
            rc = list_scores(s, ps, layer * H + h, &q, pooled, &sc);
            if (!rc)
                rc = keep_top(s, seq, ps, layer, h, &q, sc, q.k, scr, keep);
            kv_mem_free(mem, bytes);
        }
        return rc;
    }
    /* AdaKV: the layer keeps H * k candidates in all (+ each list's
     * window), split by kv_pol_ada_split */
    sel_plan_t pl[KV_MAX_KV_HEADS_SEL];
    uint32_t n_cand[KV_MAX_KV_HEADS_SEL], k_h[KV_MAX_KV_HEADS_SEL], n_max = 0;
    const float *score[KV_MAX_KV_HEADS_SEL];
    uint64_t sum_cand = 0;
    for (uint32_t h = 0; h < H; h++) {
        pl[h] = plan_list(s, seq, ps, layer, h, at_prefill);
        n_cand[h] = pl[h].n_cand;
        sum_cand += pl[h].n_cand;
        n_max = pl[h].n > n_max ? pl[h].n : n_max;
    }
    if (sum_cand <= (uint64_t)H * pl[0].k)
        return 0;
    size_t bytes = sum_cand * (sizeof(uint64_t) + sizeof(float)) +
                   (size_t)n_max * sizeof(uint32_t);
    char *mem = kv_mem_alloc(bytes);
    if (!mem)
        return KV_ENOMEM;
    uint64_t *scr = (uint64_t *)(void *)mem;
    float *pooled = (float *)(void *)(scr + sum_cand);
    uint32_t *keep = (uint32_t *)(void *)(pooled + sum_cand);
    int rc = 0;
    for (uint32_t h = 0, at = 0; h < H && !rc; at += n_cand[h], h++)
        rc = list_scores(s, ps, layer * H + h, &pl[h], pooled + at, &score[h]);
    if (!rc)
        kv_pol_ada_split(score, n_cand, H, pl[0].k, ps->pol.ada_alpha, k_h, scr);
    for (uint32_t h = 0; h < H && !rc; h++)
        if (k_h[h] < n_cand[h])
            rc = keep_top(s, seq, ps, layer, h, &pl[h], score[h], k_h[h], scr, keep);
    kv_mem_free(mem, bytes);
    return rc;
}
