/* SPDX-License-Identifier: MIT */
/*
 * kv_page_int.h — internals of the page table shared by its source files
 * (kv_page.c: table, sequences, queries; kv_page_append.c; kv_page_compact.c;
 * kv_page_check.c; kv_page_convert.c: residual conversion and the helpers
 * below; kv_page_merge.c). Not part of any contract: nothing outside
 * pages/kv_page*.c includes it.
 *
 * Invariants kept here on top of those of kv_page.h:
 *   - seqs[id] != NULL iff id is live; the ids not live are exactly
 *     free_ids[0..n_free), and n_live + n_free == max_seqs;
 *   - meta_bytes == the sum of the sizes of every block this table holds
 *     from kv_mem (the table itself, seqs, free_ids, each live sequence's
 *     list array, each list's ents [cap_ents] and pos [cap_pos]);
 *   - tokens == the sum of n_tokens over every list of every live sequence.
 * Every kv_mem call of the table goes through meta_alloc/meta_free below so
 * that meta_bytes stays exact.
 */
#ifndef KV_PAGE_INT_H
#define KV_PAGE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "alloc/kv_mem.h"
#include "kernels/kv_backend.h"
#include "kv_page.h"

struct kv_page_table {
    kv_page_table_config_t cfg;
    kv_alloc_pool_t *pool;     /* borrowed                                  */
    uint32_t fp16_tpp;         /* FP16 tokens per page, 1..UINT16_MAX       */
    uint32_t residual;         /* R, resolved (cfg.residual may be 0)       */
    uint32_t n_lists;          /* n_layers * n_kv_heads, lists per sequence */
    kv_page_list_t **seqs;     /* [max_seqs]: [n_lists] lists, or NULL      */
    uint32_t *free_ids;        /* [max_seqs] stack of free ids              */
    uint32_t n_free;           /* ids on the stack                          */
    uint32_t n_live;           /* live sequences                            */
    uint64_t tokens;           /* tokens over all lists of live sequences   */
    uint64_t pages_by_format[KV_FMT_COUNT]; /* distinct held pages          */
    uint64_t meta_bytes;       /* bytes held from kv_mem, see above         */
};

/* kv_mem with meta_bytes accounting (for blocks the table keeps). */
static inline void *kv_page_meta_alloc(kv_page_table_t *pt, size_t n)
{
    void *p = kv_mem_alloc(n);
    if (p)
        pt->meta_bytes += n;
    return p;
}
static inline void kv_page_meta_free(kv_page_table_t *pt, void *p, size_t n)
{
    if (!p)
        return;
    kv_mem_free(p, n);
    pt->meta_bytes -= n;
}

/* The list of (seq, layer, head) without checks (caller validated). */
static inline kv_page_list_t *kv_page_list_at(const kv_page_table_t *pt,
                                              uint32_t seq, uint32_t layer,
                                              uint32_t head)
{
    return &pt->seqs[seq][(size_t)layer * pt->cfg.n_kv_heads + head];
}

/* 0 if pt is a table and (seq, layer) a layer of its live sequence seq;
 * else KV_EINVAL (pt NULL), KV_ENOENT (seq) or KV_ERANGE (layer). */
static inline int kv_page_check_layer(const kv_page_table_t *pt,
                                      uint32_t seq, uint32_t layer)
{
    if (!pt)
        return KV_EINVAL;
    if (!kv_page_seq_live(pt, seq))
        return KV_ENOENT;
    return layer < pt->cfg.n_layers ? KV_OK : KV_ERANGE;
}

/* kv_page_check_layer, and head a kv_head of the table (else KV_ERANGE). */
static inline int kv_page_check_list(const kv_page_table_t *pt, uint32_t seq,
                                     uint32_t layer, uint32_t head)
{
    int rc = kv_page_check_layer(pt, seq, layer);
    return rc ? rc : head < pt->cfg.n_kv_heads ? KV_OK : KV_ERANGE;
}

/* 1 if some kv_head list of (seq, layer) has busy entries (residency
 * flags, kv_page.h): mutating calls then return KV_ENOTRES. */
static inline int kv_page_layer_busy(const kv_page_table_t *pt, uint32_t seq,
                                     uint32_t layer)
{
    for (uint32_t h = 0; h < pt->cfg.n_kv_heads; h++)
        if (kv_page_list_at(pt, seq, layer, h)->n_busy)
            return 1;
    return 0;
}

/* Drop one reference of a page of format fmt held by the table; keeps
 * pages_by_format in step when the pool frees it. */
void kv_page_unref(kv_page_table_t *pt, kv_page_id_t id, uint32_t fmt);

/* Tokens per page of format fmt for this table's geometry (0 if unknown). */
uint32_t kv_page_fmt_tpp(const kv_page_table_t *pt, uint32_t fmt);

/* Scratch memory for one call: a small buffer on the caller's stack, or a
 * kv_mem block when that is too small. Not counted in meta_bytes. */
typedef struct kv_page_scratch {
    void *p;     /* the memory (stack buffer or heap block) */
    size_t heap; /* bytes of the heap block, 0 if on the stack */
} kv_page_scratch_t;

static inline void *kv_page_scratch_get(kv_page_scratch_t *s, void *stack_buf,
                                        size_t stack_n, size_t n)
{
    s->heap = 0;
    if (n <= stack_n) {
        s->p = stack_buf;
        return s->p;
    }
    s->p = kv_mem_alloc(n);
    if (s->p)
        s->heap = n;
    return s->p;
}
static inline void kv_page_scratch_put(kv_page_scratch_t *s)
{
    if (s->heap)
        kv_mem_free(s->p, s->heap);
    s->p = NULL;
    s->heap = 0;
}

/* ---- residual and conversions (kv_page_convert.c) ------------------------ */

/* The residual of a list: its trailing run of unflagged FP16 entries.
 * Returns its tokens; *r0 = index of its first entry (n_ents if empty). */
uint32_t kv_page_residual(const kv_page_list_t *l, uint32_t *r0);

/* Capacity for at least need elements, growing geometrically from cap. */
uint32_t kv_page_grow_cap(uint32_t cap, uint32_t need);

/* Where the first c tokens of a residual end (0 < c <= residual tokens). */
typedef struct kv_page_cut {
    uint32_t r0;    /* first residual entry                              */
    uint32_t e_s;   /* first entry not wholly consumed (n_ents if none)  */
    uint32_t a;     /* tokens of entry e_s consumed (0: untouched)       */
    uint32_t fresh; /* 1: e_s is split and shared: its rest moves to a   */
                    /*    fresh FP16 page                                */
} kv_page_cut_t;

void kv_page_cut_plan(const kv_page_table_t *pt, const kv_page_list_t *l,
                      uint32_t r0, uint32_t c, kv_page_cut_t *cut);
/* Source pages of the cut tokens, entries r0 .. e_s (inclusive if a > 0). */
static inline uint32_t kv_page_cut_n_src(const kv_page_cut_t *cut)
{
    return cut->e_s - cut->r0 + (cut->a > 0);
}
/* Entries [e0, e0+n) of l as kernel pages into out[0..n). */
void kv_page_kern_pages(const kv_page_table_t *pt, const kv_page_list_t *l,
                        uint32_t e0, uint32_t n, kv_kern_page_t *out);
/* After the cut tokens were read: move e_s's remaining tokens to the front
 * of its page, or to page fid (cut->fresh, counted as a new FP16 page), and
 * release entries [r0, e_s). The entries themselves are not moved. */
void kv_page_cut_apply(kv_page_table_t *pt, kv_page_list_t *l,
                       const kv_page_cut_t *cut, kv_page_id_t fid);
/* Replace entries [r0, e_s) by n_ins entries the caller then writes at the
 * returned address: shifts entries [e_s, n_ents), installs new_arr
 * (new_cap entries, or NULL: the current array is big enough). */
kv_page_ent_t *kv_page_ents_open(kv_page_table_t *pt, kv_page_list_t *l,
                                 uint32_t r0, uint32_t e_s, uint32_t n_ins,
                                 kv_page_ent_t *new_arr, uint32_t new_cap);

/* Residual conversion of every head list of (seq, layer) (validated).
 * keep == UINT32_MAX: the append rule (floor(residual / R) * R tokens);
 * else all but the newest keep residual tokens, in whole groups. */
int kv_page_convert_residual(kv_page_table_t *pt, uint32_t seq,
                             uint32_t layer, uint32_t keep);

#endif /* KV_PAGE_INT_H */
