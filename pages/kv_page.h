/* SPDX-License-Identifier: MIT */
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
 *     the number of entries, over all lists of all live sequences, naming it
 *     (a MERGED page is named by the lists of both layers of its pair: the
 *     cross-layer references count like any other);
 *   - 1 <= ent.n_tokens <= tokens_per_page(format) (MERGED: the page's own
 *     capacity for its direction format); INT4/INT2 entries hold whole
 *     16-token groups (n_tokens % 16 == 0); list.n_tokens is the sum;
 *   - fill: in every maximal run of consecutive FP16 entries with equal
 *     flags, every entry but the last is full, except the run's first when
 *     other entries precede it (a residual conversion or merge cuts the
 *     head of a residual; appends fill the last); entries of other formats
 *     may be partly filled;
 *   - flags: KV_PAGE_ENT_UPPER only on MERGED entries (and only in lists of
 *     layer >= 1), bit 0 as KV_PAGE_ENT_ROT only on INT4/INT2 entries and
 *     only when head_dim is a power of two, KV_PAGE_ENT_RETAINED only on FP16 entries, the residency
 *     bits (below) only in their valid combinations on non-MERGED entries,
 *     no other bit; list.n_busy counts the entries with residency bits; an
 *     entry that holds no page (OFFLOADED) is not counted in the pool or
 *     pages_by_format, and a busy entry that holds one is its only holder;
 *     the fill rule compares the structural bits only;
 *   - only the last entry is appended to, and only if it is an unflagged
 *     FP16 entry; a page with refcount > 1 is never written (copy-on-write):
 *     an append to a shared tail page first copies it to a fresh page, and
 *     so does a conversion that adds groups to a shared INT page;
 *   - pos holds list.n_tokens positions, or is NULL meaning pos[i] == i.
 *   - pages_by_format[f] counts distinct held pages of format f.
 *   - list.target is KV_FMT_FP16, KV_FMT_INT4 or KV_FMT_INT2, the INT ones
 *     possibly | KV_FMT_ROT (then head_dim is a power of two).
 *
 * The residual of a list is its trailing run of unflagged FP16 entries (all
 * its tokens after the last converted, merged or retained one). With a
 * target format other than FP16, an append that makes the residual reach R
 * tokens (config.residual) converts its oldest floor(residual / R) * R
 * tokens to the target format (KIVI): whole 16-token groups, into the INT
 * page just before the residual if it has room (copied first if shared),
 * then fresh pages; the FP16 pages they came from are released (a page
 * holding both converted and remaining tokens keeps the remaining ones,
 * moved to its front). Token order and positions never change. If the pages
 * or memory for that conversion cannot be had, the append still succeeds
 * and the conversion is deferred to the next append that finds the residual
 * >= R (the result is the same: group boundaries are counted from the
 * residual's start). kv_page_quantize converts on demand.
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
#include "formats/kv_format.h"

typedef struct kv_page_ent {
    kv_page_id_t id;   /* page in the pool                         */
    uint8_t format;    /* kv_format_t                              */
    uint8_t flags;     /* KV_PAGE_ENT_* bits                       */
    uint16_t n_tokens; /* tokens used in this page, >= 1           */
} kv_page_ent_t;

/* kv_page_ent_t.flags. Bit 0 is the entry's variant (kv_format_load): for a
 * MERGED entry, which layer of the pair this list is; for an INT4/INT2
 * entry, whether its page stores rotated rows (every entry naming the page
 * says the same: the page was written so; page files record the bit). */
#define KV_PAGE_ENT_UPPER    0x1u /* MERGED: read as layer l (else l-1)  */
#define KV_PAGE_ENT_ROT      0x1u /* INT4/INT2: stored rotated           */
                                  /* (variant 1, formats/kv_fmt_rot.h)   */
#define KV_PAGE_ENT_RETAINED 0x2u /* FP16: retained originals of tokens  */
                                  /* of a merged pair (not residual)     */
#define KV_PAGE_ENT_VARIANT  0x1u /* the flag bits that are the variant  */

/* Residency (the store's page-file tier, store/kv_store_offload*.c; the
 * table itself never sets these, kv_page_ent_set_residency does):
 *   none                 resident: id is a pool page
 *   PAGING               a write to the page file reads the page: still
 *                        readable, never written or released
 *   OFFLOADED            only on the page file: id is a slot of the store's
 *                        file (not a pool page); not readable
 *   OFFLOADED|PAGING     a read fills the pool page id; not readable
 *   OFFLOADED|LOST       on file, but its last read failed (id: the slot)
 * Only FP16/INT4/INT2 entries of pages with refcount 1 get these flags. An
 * entry "holds a page" (one pool reference) unless it is OFFLOADED without
 * PAGING. A list with busy entries (n_busy > 0) is not mutated: append,
 * compact, conversion, merge, update_v and fork return KV_ENOTRES. */
#define KV_PAGE_ENT_OFFLOADED 0x04u
#define KV_PAGE_ENT_PAGING    0x08u
#define KV_PAGE_ENT_LOST      0x10u
#define KV_PAGE_ENT_RESIDENCY 0x1Cu /* the residency bits                */
#define KV_PAGE_ENT_SHAPE     0x03u /* the structural bits (UPPER, RETAINED) */

static inline uint32_t kv_page_ent_variant(const kv_page_ent_t *e)
{
    return e->flags & KV_PAGE_ENT_VARIANT;
}

/* A list's target (kv_page_list_t.target): a format, or'ed with KV_FMT_ROT
 * (kvpage.h) for rotated INT pages: its format and its stored variant. */
static inline uint32_t kv_page_target_format(uint32_t target)
{
    return target & ~(uint32_t)KV_FMT_ROT;
}
static inline uint32_t kv_page_target_variant(uint32_t target)
{
    return (target & KV_FMT_ROT) ? 1u : 0u;
}

/* 1 if the entry's data is in its pool page (resident or being written). */
static inline int kv_page_ent_readable(const kv_page_ent_t *e)
{
    return !(e->flags & KV_PAGE_ENT_OFFLOADED);
}

/* 1 if the entry holds a pool reference (its id is a pool page). */
static inline int kv_page_ent_holds_page(const kv_page_ent_t *e)
{
    return !(e->flags & KV_PAGE_ENT_OFFLOADED) || (e->flags & KV_PAGE_ENT_PAGING);
}

typedef struct kv_page_list {    /* one (sequence, layer, kv_head)   */
    kv_page_ent_t *ents;         /* [n_ents] in token order          */
    uint32_t n_ents, cap_ents;
    uint32_t n_tokens;           /* sum of ents[i].n_tokens          */
    int32_t *pos;                /* [cap_pos] or NULL (= identity)   */
    uint32_t cap_pos;
    int64_t pos_next;            /* with pos: 1 + the largest        */
                                 /* position held (0: none); where a */
                                 /* pos=NULL append continues (a     */
                                 /* merge reorders, so the last      */
                                 /* token need not hold the largest) */
    uint32_t target;             /* format the residual converts to  */
                                 /* (KV_FMT_FP16: never), | KV_FMT_ROT */
                                 /* for rotated INT pages            */
    uint32_t n_busy;             /* entries with residency flags     */
} kv_page_list_t;

typedef struct kv_page_table kv_page_table_t;

struct kv_backend; /* kernels/kv_backend.h */

typedef struct kv_page_table_config {
    kv_page_geom_t geom;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t max_seqs;   /* live sequences at once; ids are 0..max_seqs-1 */
    uint32_t default_format; /* list target at seq create: FP16 (0), INT4, */
                             /* INT2                                       */
    uint32_t residual;   /* R: a multiple of 16 in 16..65536; 0 = 128      */
    const struct kv_backend *backend; /* conversion kernels (borrowed, may */
                         /* be filled in after create); NULL: CPU reference */
} kv_page_table_config_t;

/* Errors: KV_EINVAL, KV_ERANGE (geometry holds no FP16 token, some format
 * would hold more than 65535 tokens per page, page_bytes differs from the
 * pool's, residual out of range, default_format not FP16/INT4/INT2 or its
 * pages hold no group), KV_ENOMEM. */
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

/* Target format of every kv_head list of (seq, layer): KV_FMT_FP16 (stop
 * converting), KV_FMT_INT4, KV_FMT_INT2. Converted pages stay as they are;
 * the next append converts if the residual has reached R. Errors:
 * KV_ENOENT, KV_ERANGE (layer), KV_EINVAL (other format), KV_ENOTSUP (this
 * geometry's pages of fmt hold no 16-token group). Allocates nothing. */
int kv_page_set_format(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                       uint32_t fmt);

/* Convert now, in every kv_head list of (seq, layer) whose target is not
 * FP16, the residual's tokens but its newest keep_fp16 (rounded so that
 * whole 16-token groups convert). FP16 tokens outside the residual
 * (retained originals) are left alone. All heads or none (KV_ENOMEM). */
int kv_page_quantize(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                     uint32_t keep_fp16);

/* MiniCache merge of layers (layer-1, layer) of seq, every kv_head (see
 * kv_page_merge.c): the residual tokens both lists hold, but the newest
 * keep_fp16, become MERGED pages named by both lists plus FP16 entries
 * (flag RETAINED) with the retained tokens' originals in each list. */
typedef struct kv_page_merge_opts {
    float t;             /* SLERP parameter, [0, 1]                 */
    float gamma;         /* retention threshold, [0, 1]             */
    uint32_t dir_format; /* KV_FMT_FP16 or KV_FMT_INT4              */
    uint32_t keep_fp16;  /* newest residual tokens left unmerged    */
} kv_page_merge_opts_t;

/* Errors: KV_EINVAL (opts), KV_ENOENT, KV_ERANGE (layer 0 or >= n_layers),
 * KV_ENOTSUP (dir_format holds no token in this geometry), KV_ESTATE (the
 * two layers' residuals differ in length or positions), KV_ENOMEM. All
 * heads or none. */
int kv_page_merge_layers(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                         const kv_page_merge_opts_t *opts);

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

/* 1 + the largest position a list holds (0 if empty): where an append
 * without positions continues. */
static inline int64_t kv_page_list_pos_next(const kv_page_list_t *l)
{
    return l->pos ? l->pos_next : (int64_t)l->n_tokens;
}

/* Recompute pos_next from a list's pos array (after positions were
 * rewritten wholesale: compaction, restore). */
void kv_page_list_pos_rescan(kv_page_list_t *l);

/* Address of a page's bytes (the table's pool is a host pool: asserted). */
void *kv_page_addr(const kv_page_table_t *pt, kv_page_id_t id);

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
/* kv_page_table_check with n_ext external references (below) counted as
 * entries: ext[i] names a page held (resident, unflagged, not MERGED). */
int kv_page_table_check_ext(const kv_page_table_t *pt, const kv_page_ent_t *ext,
                            size_t n_ext);

/* ---- external references (kv_page_extern.c) ----------------------------
 * A holder outside the lists (the store's prefix cache) may keep pool
 * references to pages the table allocated: refcount == entries naming the
 * page + external references, and pages_by_format counts a page until its
 * last reference, external or not, is dropped. Such pages are never written
 * (refcount > 1, or the holder's alone). */
/* A fresh page of format fmt held by one external reference (the caller
 * fills it before anyone reads it): 0, KV_ENOMEM (pool empty), KV_EINVAL. */
int kv_page_ref_new(kv_page_table_t *pt, uint32_t fmt, kv_page_id_t *id);
/* Take one reference to a held page (cannot fail). */
void kv_page_ref_take(kv_page_table_t *pt, kv_page_id_t id);
/* Drop one reference to a page of format fmt (frees it with the last). */
void kv_page_ref_drop(kv_page_table_t *pt, kv_page_id_t id, uint32_t fmt);
/* Install ents (list-major: n_ents[li] entries for list li, li = layer *
 * n_kv_heads + head, [n_lists]) as the whole contents of the lists of live
 * seq, which must all be empty (KV_ESTATE): each entry takes one reference.
 * pos: the tokens' positions, list-major (list li's n_tokens = its entries'
 * tokens, in token order), copied; NULL: the identity. Entries must hold
 * pages, unflagged, not MERGED, within their format's capacity (KV_EINVAL).
 * targets: each list's target format ([n_lists], as kv_page_list_t.target,
 * not checked), or NULL: the targets stay. All or nothing: KV_ENOMEM. */
int kv_page_seq_attach(kv_page_table_t *pt, uint32_t seq, const kv_page_ent_t *ents,
                       const uint32_t *n_ents, const int32_t *pos, const uint32_t *targets);

/* Overwrite the VALUE rows of tokens [t0, t0+n) of one list (v: [n][head_dim]
 * FP32, finite and within FP16 range) — CaM (kv_page_update.c). Every token
 * must sit in an FP16 entry (else KV_EINVAL); shared pages are copied first
 * (CoW). All-or-nothing; allocates nothing when no touched page is shared.
 * Errors: KV_EINVAL, KV_ENOENT, KV_ERANGE, KV_ENOMEM. */
int kv_page_update_v(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                     uint32_t head, uint32_t t0, uint32_t n, const float *v);

/* ---- residency (kv_page_resid.c), for the store's page-file tier -------- */

/* 1 if some list of seq (live) has busy entries. O(lists). */
int kv_page_seq_busy(const kv_page_table_t *pt, uint32_t seq);

/* Set the residency of entry e of list li (layer * n_kv_heads + head) of
 * live seq: its id and residency flags (KV_PAGE_ENT_RESIDENCY bits of
 * rflags; the structural bits stay). Accounting follows "holds a page":
 * when the entry stops holding one, its page reference is released; when it
 * starts, the caller's reference to id (refcount 1) becomes the entry's.
 * n_busy and pages_by_format follow. The id is stored before the flags and
 * both with release ordering (concurrent readers load flags with acquire
 * before id). Callers serialize these calls; allocates nothing. */
void kv_page_ent_set_residency(kv_page_table_t *pt, uint32_t seq, uint32_t li,
                               uint32_t e, kv_page_id_t id, uint32_t rflags);

/* Install a sequence under id (not live, < max_seqs) from lists[n_lists]
 * built by the caller in kv_mem blocks exactly as the table keeps them
 * (ents [cap_ents], pos [cap_pos] or NULL, n_tokens, target, n_busy): the
 * table takes ownership of lists and every block, and their references
 * (entries that hold a page must hold one reference each). Used to
 * restore sequences from a page file. Errors (nothing taken): KV_EINVAL
 * (NULL, a list inconsistent), KV_ESTATE (id live or out of range). */
int kv_page_seq_adopt(kv_page_table_t *pt, uint32_t id, kv_page_list_t *lists);

#endif /* KV_PAGE_H */
