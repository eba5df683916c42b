/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_decode.c — batched decode attention on the CPU (flash-decoding).
 *
 * Each list (b, kv head h) is split into partitions of P tokens; a work unit
 * is one (list, partition) and serves the G = n_q_heads / n_kv_heads query
 * heads of the group together, so each page is decoded once per group. Units
 * run on the backend's workers (kv_workers.c) and leave partial online-softmax
 * states (m[G], l[G], acc[G][D]); the unit that finishes a list last (an
 * atomic count per list) combines the list's partials in partition order
 * with the (max, sum-exp) rule and writes out and each q row's log-sum-exp.
 * When a batch row asks for statistics, units also record every logit
 * (scratch [G][len] per list) and that same last unit turns them into
 * probabilities with the exact log-sum-exp. So a call is one job: no
 * worker waits for another mid-call.
 *
 * P depends only on the shapes (never on the thread count), so results are
 * bit-identical for any n_threads. Scratch is one kv_mem block per call;
 * out and stats are written only after validation and allocation succeeded.
 */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kv_cpu.h"

/* Default partition: enough units for a few threads at batch 1 (about 16
 * over the whole batch), but never below 256 tokens so the reduce and the
 * per-unit overhead stay small; a multiple of 16 (a default FP16 page). */
#define KV_CPU_MIN_PART   256u
#define KV_CPU_UNITS_GOAL 16u

static uint32_t default_partition(const kv_attn_decode_params_t *p,
                                  uint32_t n_lists)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_lists; i++)
        total += p->seq_len[i];
    uint64_t part = (total + KV_CPU_UNITS_GOAL - 1) / KV_CPU_UNITS_GOAL;
    part = (part + 15) / 16 * 16;
    if (part < KV_CPU_MIN_PART)
        part = KV_CPU_MIN_PART;
    return part > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)part;
}

/* Everything one call needs, carved from one scratch block. */
typedef struct decode_plan {
    const kv_cpu_t *cx;
    const kv_attn_decode_params_t *p;
    uint32_t H, G, D, n_lists, part, n_thr;
    size_t n_units, state_floats, thread_floats;
    kv_cpu_span_t *spans; /* [n_units]                        */
    uint32_t *unit_list;       /* [n_units] list of each unit       */
    uint32_t *first_unit;      /* [n_lists + 1]                     */
    _Atomic uint32_t *left;    /* [n_lists] units not finished yet  */
    float *state;              /* [n_units][2G + G*D] m, l, acc     */
    float *qs;                 /* [batch][n_q][D] scaled queries    */
    float *lse;                /* [n_lists][G]                      */
    float **logits;            /* [n_lists]: NULL or [G][len]       */
    float *thread;             /* [n_thr][thread_floats] per worker */
} decode_plan_t;

static int want_stats(const kv_attn_decode_params_t *p, uint32_t b)
{
    return p->stats && p->stats[b];
}

/* Sizing pass (a->base NULL) or carving pass. */
static void plan_layout(const kv_attn_decode_params_t *p, decode_plan_t *pl,
                        kv_kern_arena_t *a)
{
    pl->spans = kv_kern_arena_take(a, pl->n_units * sizeof *pl->spans);
    pl->unit_list = kv_kern_arena_take(a, pl->n_units * sizeof *pl->unit_list);
    pl->first_unit =
        kv_kern_arena_take(a, ((size_t)pl->n_lists + 1) * sizeof(uint32_t));
    pl->left = kv_kern_arena_take(a, pl->n_lists * sizeof *pl->left);
    pl->state = kv_kern_arena_take(a, pl->n_units * pl->state_floats * 4);
    pl->qs = kv_kern_arena_take(
        a, (size_t)p->batch * p->n_q_heads * pl->D * sizeof(float));
    pl->lse = kv_kern_arena_take(a, (size_t)pl->n_lists * pl->G * sizeof(float));
    pl->logits = kv_kern_arena_take(a, pl->n_lists * sizeof(float *));
    for (uint32_t i = 0; i < pl->n_lists; i++) {
        float *lg = NULL;
        if (want_stats(p, i / pl->H))
            lg = kv_kern_arena_take(a, (size_t)pl->G * p->seq_len[i] * 4);
        if (pl->logits)
            pl->logits[i] = lg;
    }
    pl->thread = kv_kern_arena_take(a, pl->n_thr * pl->thread_floats * 4);
}

static void plan_fill(const kv_attn_decode_params_t *p, decode_plan_t *pl)
{
    size_t u = 0;
    for (uint32_t i = 0; i < pl->n_lists; i++) {
        uint32_t len = p->seq_len[i];
        pl->first_unit[i] = (uint32_t)u;
        kv_cpu_split(p->pages + p->indptr[i], len, pl->part,
                          pl->spans + u);
        uint32_t n = (len - 1) / pl->part + 1;
        for (uint32_t k = 0; k < n; k++)
            pl->unit_list[u++] = i;
        atomic_init(&pl->left[i], n);
    }
    pl->first_unit[pl->n_lists] = (uint32_t)u;
    assert(u == pl->n_units);
    size_t nq = (size_t)p->batch * p->n_q_heads * pl->D;
    for (size_t j = 0; j < nq; j++)
        pl->qs[j] = p->q[j] * p->scale;
}

/* Unit u: the partial state of its partition. */
static void run_unit(const decode_plan_t *pl, size_t u, uint32_t worker)
{
    const kv_attn_decode_params_t *p = pl->p;
    uint32_t list = pl->unit_list[u], b = list / pl->H, h = list % pl->H;
    float *m = pl->state + u * pl->state_floats;
    float *l = m + pl->G, *acc = l + pl->G;
    for (uint32_t g = 0; g < pl->G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, (size_t)pl->G * pl->D * sizeof *acc);
    kv_cpu_task_t t = {
        .geom = &p->geom,
        .span = pl->spans[u],
        .q = pl->qs + ((size_t)b * p->n_q_heads + (size_t)h * pl->G) * pl->D,
        .n_rows = pl->G,
        .scratch_rows = pl->G,
        .group = pl->G,
        .lim0 = p->seq_len[list],
        .m = m,
        .l = l,
        .acc = acc,
        .logits = pl->logits[list],
        .logits_stride = p->seq_len[list],
        .fmt = kv_cpu_fmt_table(pl->cx),
    };
    assert(worker < pl->n_thr);
    pl->cx->loops->attend(&t, pl->thread + worker * pl->thread_floats);
}

/* Combine the partitions of one list: out rows and lse. */
static void reduce_list(const kv_attn_decode_params_t *p,
                        const decode_plan_t *pl, uint32_t list)
{
    uint32_t b = list / pl->H, h = list % pl->H, D = pl->D;
    uint32_t u0 = pl->first_unit[list], u1 = pl->first_unit[list + 1];
    for (uint32_t g = 0; g < pl->G; g++) {
        float mx = -INFINITY;
        for (uint32_t u = u0; u < u1; u++)
            mx = fmaxf(mx, pl->state[u * pl->state_floats + g]);
        size_t row = (size_t)b * p->n_q_heads + (size_t)h * pl->G + g;
        float *o = p->out + row * D;
        float sum = 0.0f;
        memset(o, 0, D * sizeof *o);
        for (uint32_t u = u0; u < u1; u++) {
            const float *st = pl->state + u * pl->state_floats;
            float w = expf(st[g] - mx);
            const float *acc = st + 2 * pl->G + (size_t)g * D;
            sum += st[pl->G + g] * w;
            for (uint32_t j = 0; j < D; j++)
                o[j] += acc[j] * w;
        }
        float inv = 1.0f / sum;
        for (uint32_t j = 0; j < D; j++)
            o[j] *= inv;
        pl->lse[(size_t)list * pl->G + g] = mx + logf(sum);
    }
}

/* Probabilities of every token of a list from its recorded logits. */
static void stats_list(const decode_plan_t *pl, uint32_t list)
{
    const kv_attn_decode_params_t *p = pl->p;
    uint32_t b = list / pl->H, h = list % pl->H;
    kv_cpu_task_t t = {
        .geom = &p->geom,
        .span = {.t_end = p->seq_len[list]},
        .n_rows = pl->G,
        .group = pl->G,
        .logits = pl->logits[list],
        .logits_stride = p->seq_len[list],
        .lse = pl->lse + (size_t)list * pl->G,
        .stats = p->stats[b] + (size_t)h * p->stats_stride,
    };
    pl->cx->loops->stats_from_logits(&t);
}

/* Unit u, then, if it was its list's last, the list's reduce and stats. */
static void unit_step(void *arg, size_t u, uint32_t worker)
{
    const decode_plan_t *pl = arg;
    uint32_t list = pl->unit_list[u];
    run_unit(pl, u, worker);
    if (atomic_fetch_sub_explicit(&pl->left[list], 1,
                                  memory_order_acq_rel) != 1)
        return;
    reduce_list(pl->p, pl, list);
    if (pl->logits[list])
        stats_list(pl, list);
}

int kv_cpu_decode(void *ctx, const kv_attn_decode_params_t *p)
{
    const kv_cpu_t *cx = ctx;
    int rc = kv_kern_check_decode(p);
    if (rc)
        return rc;
    decode_plan_t pl = {
        .cx = cx,
        .p = p,
        .H = p->n_kv_heads,
        .G = p->n_q_heads / p->n_kv_heads,
        .D = p->geom.head_dim,
        .n_lists = p->batch * p->n_kv_heads,
    };
    pl.part = p->partition_tokens ? p->partition_tokens
                                  : default_partition(p, pl.n_lists);
    for (uint32_t i = 0; i < pl.n_lists; i++)
        pl.n_units += (p->seq_len[i] - 1) / pl.part + 1;
    if (pl.n_units > UINT32_MAX)
        return KV_ENOMEM; /* tiny partitions over huge lists */
    pl.n_thr = kv_workers_size(cx->workers);
    pl.state_floats = (size_t)pl.G * (2 + pl.D);
    pl.thread_floats = kv_cpu_thread_floats(pl.D, pl.G);

    kv_kern_arena_t a = {0};
    plan_layout(p, &pl, &a);
    if ((rc = kv_kern_arena_alloc(&a)))
        return rc;
    plan_layout(p, &pl, &a);
    plan_fill(p, &pl);

    kv_cpu_run(cx->workers, pl.n_units, unit_step, &pl);
    kv_kern_arena_free(&a);
    return 0;
}
