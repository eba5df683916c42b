/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_prefill.c — causal prefill attention on the CPU.
 *
 * One sequence, n_kv_heads lists; list h holds seq_len[h] tokens of which the
 * last n_new are the new ones, so new row i sees tokens [0, base_h + i],
 * base_h = seq_len[h] - n_new. Work units are (kv head, block of up to
 * KV_CPU_ROWS query rows x G q heads): each decodes the pages its rows see
 * once and runs the same online-softmax loop as decode over them (rows see a
 * growing prefix: the task's causal limit), then writes its rows of out and,
 * when statistics are requested, each row's log-sum-exp.
 *
 * Statistics need every row's final log-sum-exp first, so they are a second
 * pass: units are (kv head, 256-token range); each recomputes the logits of
 * its tokens against all counted rows (stats_row0..n_new-1, all G heads) in a
 * fixed row order and writes the summed probabilities. No unit shares an
 * output with another, so results do not depend on the thread count.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kv_cpu.h"

#define KV_CPU_ROWS        64u  /* q rows (row x head) per prefill unit */
#define KV_CPU_STATS_RANGE 256u /* tokens per statistics unit           */

typedef struct prefill_plan {
    const kv_cpu_t *cx;
    const kv_attn_prefill_params_t *p;
    uint32_t H, G, D, rows_blk, n_blocks, n_thr;
    size_t n_stat_units, thread_floats;
    float *qh;                 /* [H][n_new*G][D] scaled, grouped by head */
    float *lse;                /* [H][n_new*G] or NULL                    */
    kv_cpu_span_t *spans; /* [n_stat_units]                          */
    uint32_t *span_head;       /* [n_stat_units]                          */
    float *thread;             /* [n_thr][thread_floats] per worker       */
} prefill_plan_t;

static void plan_layout(const kv_attn_prefill_params_t *p, prefill_plan_t *pl,
                        kv_kern_arena_t *a)
{
    size_t rows = (size_t)pl->H * p->n_new * pl->G;
    pl->qh = kv_kern_arena_take(a, rows * pl->D * sizeof(float));
    pl->lse = p->stats ? kv_kern_arena_take(a, rows * sizeof(float)) : NULL;
    pl->spans = kv_kern_arena_take(a, pl->n_stat_units * sizeof *pl->spans);
    pl->span_head = kv_kern_arena_take(a, pl->n_stat_units * sizeof(uint32_t));
    pl->thread = kv_kern_arena_take(a, pl->n_thr * pl->thread_floats * 4);
}

static void plan_fill(const kv_attn_prefill_params_t *p, prefill_plan_t *pl)
{
    const uint32_t nq = p->n_q_heads, D = pl->D, G = pl->G;
    for (uint32_t h = 0; h < pl->H; h++)
        for (uint32_t i = 0; i < p->n_new; i++) {
            const float *src = p->q + ((size_t)i * nq + (size_t)h * G) * D;
            float *dst = pl->qh + (((size_t)h * p->n_new + i) * G) * D;
            for (size_t j = 0; j < (size_t)G * D; j++)
                dst[j] = src[j] * p->scale;
        }
    size_t u = 0;
    for (uint32_t h = 0; p->stats && h < pl->H; h++) {
        uint32_t len = p->seq_len[h];
        kv_cpu_split(p->pages + p->indptr[h], len, KV_CPU_STATS_RANGE,
                          pl->spans + u);
        for (uint32_t k = 0; k < (len - 1) / KV_CPU_STATS_RANGE + 1; k++)
            pl->span_head[u++] = h;
    }
    assert(u == pl->n_stat_units);
}

/* Unit u: rows of one block of one head. Blocks are claimed last-first so
 * the longest (latest rows) start first. */
static void run_block(void *arg, size_t u, uint32_t worker)
{
    const prefill_plan_t *pl = arg;
    const kv_attn_prefill_params_t *p = pl->p;
    const uint32_t G = pl->G, D = pl->D;
    uint32_t h = (uint32_t)(u / pl->n_blocks);
    uint32_t blk = pl->n_blocks - 1 - (uint32_t)(u % pl->n_blocks);
    uint32_t r0 = blk * pl->rows_blk;
    uint32_t r1 = r0 + pl->rows_blk < p->n_new ? r0 + pl->rows_blk : p->n_new;
    uint32_t nr = (r1 - r0) * G, base = p->seq_len[h] - p->n_new;

    assert(worker < pl->n_thr);
    float *scratch = pl->thread + worker * pl->thread_floats;
    float *m = scratch + kv_cpu_thread_floats(D, pl->rows_blk * G);
    float *l = m + (size_t)pl->rows_blk * G;
    float *acc = l + (size_t)pl->rows_blk * G;
    for (uint32_t r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nr * D * sizeof *acc);

    kv_cpu_task_t t = {
        .geom = &p->geom,
        .span = {.pages = p->pages + p->indptr[h], .t_end = base + r1},
        .q = pl->qh + (((size_t)h * p->n_new + r0) * G) * D,
        .n_rows = nr,
        .scratch_rows = pl->rows_blk * G,
        .group = G,
        .lim0 = base + r0 + 1,
        .m = m,
        .l = l,
        .acc = acc,
        .fmt = kv_cpu_fmt_table(pl->cx),
    };
    pl->cx->loops->attend(&t, scratch);

    for (uint32_t r = 0; r < nr; r++) {
        uint32_t i = r0 + r / G, g = r % G;
        float *o = p->out + ((size_t)i * p->n_q_heads + (size_t)h * G + g) * D;
        float inv = 1.0f / l[r];
        for (uint32_t j = 0; j < D; j++)
            o[j] = acc[(size_t)r * D + j] * inv;
        if (pl->lse)
            pl->lse[((size_t)h * p->n_new + i) * G + g] = m[r] + logf(l[r]);
    }
}

static void stats_range(void *arg, size_t u, uint32_t worker)
{
    const prefill_plan_t *pl = arg;
    const kv_attn_prefill_params_t *p = pl->p;
    const uint32_t G = pl->G, h = pl->span_head[u], row0 = p->stats_row0;
    size_t first = ((size_t)h * p->n_new + row0) * G; /* first counted row */
    kv_cpu_task_t t = {
        .geom = &p->geom,
        .span = pl->spans[u],
        .q = pl->qh + first * pl->D,
        .n_rows = (p->n_new - row0) * G,
        .scratch_rows = pl->rows_blk * G,
        .group = G,
        .lim0 = p->seq_len[h] - p->n_new + row0 + 1,
        .lse = pl->lse + first,
        .stats = p->stats + (size_t)h * p->stats_stride,
        .fmt = kv_cpu_fmt_table(pl->cx),
    };
    assert(worker < pl->n_thr);
    pl->cx->loops->stats(&t, pl->thread + worker * pl->thread_floats);
}

int kv_cpu_prefill(void *ctx, const kv_attn_prefill_params_t *p)
{
    const kv_cpu_t *cx = ctx;
    int rc = kv_kern_check_prefill(p);
    if (rc)
        return rc;
    prefill_plan_t pl = {
        .cx = cx,
        .p = p,
        .H = p->n_kv_heads,
        .G = p->n_q_heads / p->n_kv_heads,
        .D = p->geom.head_dim,
    };
    pl.rows_blk = pl.G >= KV_CPU_ROWS ? 1 : KV_CPU_ROWS / pl.G;
    pl.n_blocks = (p->n_new - 1) / pl.rows_blk + 1;
    for (uint32_t h = 0; p->stats && h < pl.H; h++)
        pl.n_stat_units += (p->seq_len[h] - 1) / KV_CPU_STATS_RANGE + 1;
    size_t n_units = (size_t)pl.H * pl.n_blocks;
    pl.n_thr = kv_workers_size(cx->workers);
    size_t blk_rows = (size_t)pl.rows_blk * pl.G;
    pl.thread_floats = kv_cpu_thread_floats(pl.D, (uint32_t)blk_rows) +
                       blk_rows * (2 + (size_t)pl.D);

    kv_kern_arena_t a = {0};
    plan_layout(p, &pl, &a);
    if ((rc = kv_kern_arena_alloc(&a)))
        return rc;
    plan_layout(p, &pl, &a);
    plan_fill(p, &pl);

    kv_cpu_run(cx->workers, n_units, run_block, &pl);
    if (pl.n_stat_units) /* needs every row's log-sum-exp: a second job */
        kv_cpu_run(cx->workers, pl.n_stat_units, stats_range, &pl);
    kv_kern_arena_free(&a);
    return 0;
}
