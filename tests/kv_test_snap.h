/* SPDX-License-Identifier: MIT */
/*
 * kv_test_snap.h — "a failed call changed nothing": what a store shows
 * through the public API, taken before and after a call and compared bit
 * for bit. The one definition of that snapshot for every test that checks
 * it (test_alloc_failures, test_api_errors, test_api_formats,
 * test_api_policy, test_api_pressure, the test_store_offload_* tests through
 * test_store_offload_util.h, test_stress_model).
 *
 *   kv_test_list_t  one (seq, layer, kv_head) list decoded: kv_read's K, V
 *                   [n][head_dim] and positions [n]
 *   kv_test_seq_t   every list of a sequence, list (l, h) at l * n_kv_heads
 *                   + h (kv_test_seq_list); the shape is the store's
 *   kv_test_snap_t  the statistics an unchanged store reproduces exactly
 *                   (kv_test_stats_same), the metadata bytes live in the
 *                   process (the caller's kv_mem_live_bytes(), or 0), and
 *                   the tracked sequences
 *
 * take returns 0 or the first error of the store (KV_ENOMEM when the test
 * itself runs out of memory); whatever it took is freed by the matching
 * free, also after an error (a zeroed struct frees as nothing).
 */
#ifndef KV_TEST_SNAP_H
#define KV_TEST_SNAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/kvpage.h"

typedef struct kv_test_list {
    uint32_t n;   /* tokens          */
    float *k, *v; /* [n][head_dim]   */
    int32_t *pos; /* [n]             */
} kv_test_list_t;

typedef struct kv_test_seq {
    uint32_t n_layers, n_kv_heads, head_dim;
    kv_test_list_t *l; /* [n_layers * n_kv_heads] */
} kv_test_seq_t;

typedef struct kv_test_snap {
    kv_stats_t st;
    uint64_t live;      /* the caller's kv_mem_live_bytes(), or 0 */
    uint32_t n;         /* tracked sequences                      */
    kv_test_seq_t *seq; /* [n]                                    */
} kv_test_snap_t;

static inline void kv_test_list_free(kv_test_list_t *x)
{
    free(x->k);
    free(x->v);
    free(x->pos);
    memset(x, 0, sizeof *x);
}

/* List (seq, layer, head) of a store with head_dim hd into *x. */
static inline int kv_test_list_take(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                                    uint32_t head, uint32_t hd, kv_test_list_t *x)
{
    memset(x, 0, sizeof *x);
    int rc = kv_seq_len(s, seq, layer, head, &x->n);
    if (rc)
        return rc;
    x->k = malloc(((size_t)x->n + 1) * hd * sizeof(float));
    x->v = malloc(((size_t)x->n + 1) * hd * sizeof(float));
    x->pos = malloc(((size_t)x->n + 1) * sizeof(int32_t));
    if (!x->k || !x->v || !x->pos)
        return KV_ENOMEM;
    return x->n ? kv_read(s, seq, layer, head, 0, x->n, x->k, x->v, x->pos) : 0;
}

/* 1 when a and b hold the same tokens, bit for bit. */
static inline int kv_test_list_same(const kv_test_list_t *a, const kv_test_list_t *b,
                                    uint32_t hd)
{
    size_t n = a->n;
    return a->n == b->n &&
           (n == 0 || (!memcmp(a->k, b->k, n * hd * sizeof(float)) &&
                       !memcmp(a->v, b->v, n * hd * sizeof(float)) &&
                       !memcmp(a->pos, b->pos, n * sizeof(int32_t))));
}

static inline kv_test_list_t *kv_test_seq_list(const kv_test_seq_t *q, uint32_t layer,
                                               uint32_t head)
{
    return &q->l[(size_t)layer * q->n_kv_heads + head];
}

static inline void kv_test_seq_free(kv_test_seq_t *q)
{
    for (uint32_t i = 0; q->l && i < q->n_layers * q->n_kv_heads; i++)
        kv_test_list_free(&q->l[i]);
    free(q->l);
    memset(q, 0, sizeof *q);
}

/* Every list of seq. */
static inline int kv_test_seq_take(const kv_store_t *s, kv_seq_id_t seq, kv_test_seq_t *q)
{
    memset(q, 0, sizeof *q);
    kv_config_t c;
    int rc = kv_store_config(s, &c);
    if (rc)
        return rc;
    q->l = calloc((size_t)c.n_layers * c.n_kv_heads, sizeof *q->l);
    if (!q->l)
        return KV_ENOMEM;
    q->n_layers = c.n_layers, q->n_kv_heads = c.n_kv_heads, q->head_dim = c.head_dim;
    for (uint32_t l = 0; l < c.n_layers; l++)
        for (uint32_t h = 0; h < c.n_kv_heads; h++)
            if ((rc = kv_test_list_take(s, seq, l, h, c.head_dim, kv_test_seq_list(q, l, h))))
                return rc;
    return 0;
}

static inline int kv_test_seq_same(const kv_test_seq_t *a, const kv_test_seq_t *b)
{
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads ||
        a->head_dim != b->head_dim)
        return 0;
    for (uint32_t i = 0; i < a->n_layers * a->n_kv_heads; i++)
        if (!kv_test_list_same(&a->l[i], &b->l[i], a->head_dim))
            return 0;
    return 1;
}

/* The statistics an unchanged store reproduces exactly (not the peak or
 * the cumulative counters, which a failed call may move). */
static inline int kv_test_stats_same(const kv_stats_t *a, const kv_stats_t *b)
{
    return a->pages_used == b->pages_used && a->pages_free == b->pages_free &&
           a->n_seqs == b->n_seqs && a->tokens == b->tokens &&
           a->kv_bytes == b->kv_bytes && a->fp16_bytes == b->fp16_bytes &&
           a->meta_bytes == b->meta_bytes &&
           memcmp(a->pages_by_format, b->pages_by_format, sizeof a->pages_by_format) == 0;
}

static inline void kv_test_snap_free(kv_test_snap_t *sn)
{
    for (uint32_t i = 0; sn->seq && i < sn->n; i++)
        kv_test_seq_free(&sn->seq[i]);
    free(sn->seq);
    memset(sn, 0, sizeof *sn);
}

/* Statistics, live bytes and the sequences ids[0..n). */
static inline int kv_test_snap_take(const kv_store_t *s, const kv_seq_id_t *ids, uint32_t n,
                                    uint64_t live, kv_test_snap_t *sn)
{
    memset(sn, 0, sizeof *sn);
    sn->live = live;
    sn->st.struct_size = sizeof sn->st;
    int rc = kv_store_stats(s, &sn->st);
    if (rc)
        return rc;
    sn->seq = calloc((size_t)n + 1, sizeof *sn->seq);
    if (!sn->seq)
        return KV_ENOMEM;
    sn->n = n;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = kv_test_seq_take(s, ids[i], &sn->seq[i])))
            return rc;
    return 0;
}

/* NULL when a and b describe the same store, else what differs first:
 * "statistics", "live metadata bytes", "tracked sequences" or "list
 * contents". */
static inline const char *kv_test_snap_diff(const kv_test_snap_t *a, const kv_test_snap_t *b)
{
    if (!kv_test_stats_same(&a->st, &b->st))
        return "statistics";
    if (a->live != b->live)
        return "live metadata bytes";
    if (a->n != b->n)
        return "tracked sequences";
    for (uint32_t i = 0; i < a->n; i++)
        if (!kv_test_seq_same(&a->seq[i], &b->seq[i]))
            return "list contents";
    return NULL;
}

#endif /* KV_TEST_SNAP_H */
