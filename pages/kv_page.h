/*
 * kv_page.h — the page table: sequences x layers x kv_heads -> page lists.
 *
 * A kv_page_table_t holds every sequence of one store. Each sequence has one
 * kv_page_list_t per (layer, kv_head): an ordered list of page entries whose
 * tokens, concatenated, are that list's tokens in order, plus each token's
 * original position.
 *
 * Invariants (kv_page_table_check verifies them all):
 *   - every entry references a page held in the pool; a page's refcount equals
 *     the number of entries, over all lists of all live sequences, naming it;
 *   - 1 <= ent.n_tokens <= tokens_per_page(format); list.n_tokens is the sum;
 *   - only the last entry of a list may be partly filled, and only FP16
 *     entries are ever appended to;
 *   - a page with refcount > 1 is never written (copy-on-write): an append to
 *     a shared tail page first copies it to a fresh page;
 *   - pos holds list.n_tokens positions, or is NULL meaning pos[i] == i.
 *   - pages_by_format[f] counts distinct held pages of format f.
 *
 * Every mutating call is all-or-nothing: on any error (bad input, no page,
 * no metadata memory) the table is exactly as before.
 *
 * Ownership: the table owns its sequences and their lists and holds one
 * reference per entry; the pool is borrowed and must outlive the table.
 * Not thread-safe for mutation; concurrent readers are fine.
 */
#ifndef KV_PAGE_H
#define KV_PAGE_H

#include <stdint.h>

#include "alloc/kv_alloc.h"
#include "kv_format.h"

typedef struct kv_page_ent {
    kv_page_id_t id;   /* page in the pool                         */
    uint8_t format;    /* kv_format_t                              */
    uint8_t flags;     /* reserved, 0                              */
    uint16_t n_tokens; /* tokens used in this page, >= 1           */
} kv_page_ent_t;

typedef struct kv_page_list {    /* one (sequence, layer, kv_head)   */
    kv_page_ent_t *ents;         /* [n_ents] in token order          */
    uint32_t n_ents, cap_ents;
    uint32_t n_tokens;           /* sum of ents[i].n_tokens          */
    int32_t *pos;                /* [cap_pos] or NULL (= identity)   */
    uint32_t cap_pos;
} kv_page_list_t;

typedef struct kv_page_table kv_page_table_t;

typedef struct kv_page_table_config {
    kv_page_geom_t geom;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t max_seqs;   /* live sequences at once; ids are 0..max_seqs-1 */
} kv_page_table_config_t;

/* Errors: KV_EINVAL, KV_ERANGE (geometry holds no FP16 token, page_bytes
 * differs from the pool's), KV_ENOMEM. */
int  kv_page_table_create(const kv_page_table_config_t *cfg,
                          kv_alloc_pool_t *pool, kv_page_table_t **out);
/* Frees every sequence (releasing its pages) and the table. NULL: no-op. */
void kv_page_table_destroy(kv_page_table_t *pt);

/* Sequences. Ids are reused after free (lowest free id first is not
 * promised). Errors: KV_ELIMIT, KV_ENOMEM, KV_ENOENT. */
int kv_page_seq_create(kv_page_table_t *pt, uint32_t *seq);
int kv_page_seq_free(kv_page_table_t *pt, uint32_t seq);
int kv_page_seq_fork(kv_page_table_t *pt, uint32_t parent, uint32_t *child);
/* 1 if seq is live. */
int kv_page_seq_live(const kv_page_table_t *pt, uint32_t seq);
uint32_t kv_page_seq_count(const kv_page_table_t *pt);

/* Append n tokens to every kv_head of (seq, layer); k, v as in kv_append
 * ([n][n_kv_heads][head_dim] of dtype), pos [n] or NULL. Validates values
 * (finite, |x| <= 65504 -> else KV_ERANGE). All heads or none. */
int kv_page_append(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                   uint32_t n, kv_dtype_t dtype, const void *k, const void *v,
                   const int32_t *pos);

/* Keep tokens keep[0..n_keep) (strictly increasing) of one list. */
int kv_page_compact(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                    uint32_t head, const uint32_t *keep, uint32_t n_keep);

/* Decode tokens [t0, t0+n) of one list (k, v: [n][head_dim] or NULL;
 * pos: [n] or NULL). */
int kv_page_read(const kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                 uint32_t head, uint32_t t0, uint32_t n, float *k, float *v,
                 int32_t *pos);

/* The list of (seq, layer, head), or NULL if seq is not live or an index is
 * out of range. Valid until the next mutating call. */
const kv_page_list_t *kv_page_list_get(const kv_page_table_t *pt, uint32_t seq,
                                       uint32_t layer, uint32_t head);
/* Position of token i of a list (i < n_tokens). */
static inline int32_t kv_page_list_pos(const kv_page_list_t *l, uint32_t i)
{
    return l->pos ? l->pos[i] : (int32_t)i;
}

/* Address of a page's bytes (host pool). */
const void *kv_page_data(const kv_page_table_t *pt, kv_page_id_t id);

const kv_page_geom_t *kv_page_table_geom(const kv_page_table_t *pt);
kv_alloc_pool_t *kv_page_table_pool(const kv_page_table_t *pt);

/* Totals: tokens over all lists, distinct pages per format, metadata bytes
 * owned by the table (lists, entries, positions, sequence records). */
typedef struct kv_page_totals {
    uint64_t tokens;
    uint64_t pages_by_format[KV_FMT_COUNT];
    uint64_t meta_bytes;
} kv_page_totals_t;
void kv_page_table_totals(const kv_page_table_t *pt, kv_page_totals_t *out);

/* Verify every invariant above against the pool. 0 or KV_ECORRUPT. Also
 * checks that the pool's used count equals the number of distinct pages
 * referenced (the table must be the pool's only user for that part). */
int kv_page_table_check(const kv_page_table_t *pt);

#endif /* KV_PAGE_H */
