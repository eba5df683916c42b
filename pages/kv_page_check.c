/* SPDX-License-Identifier: MIT */
/*
 * kv_page_check.c — kv_page_table_check: verify every invariant of
 * kv_page.h and kv_page_int.h against the pool.
 *
 * Two passes over all lists of all live sequences: the first validates each
 * list and counts references per page index (and notes each page's format),
 * the second compares each referenced page's pool refcount with its count
 * (references from both layers of a MiniCache pair count alike). Per entry:
 * flags (kv_page.h), n_tokens within the format's (MERGED: the page
 * header's) capacity, INT entries in whole groups, FP16 runs full inside;
 * entries on the page file (OFFLOADED, no pool page) are checked for flags
 * and token counts only (their slots are the store's to check), busy ones
 * are counted against list.n_busy.
 * External references (kv_page_table_check_ext: the prefix cache's nodes)
 * are validated and counted like entries.
 * Then the per-format distinct page counts, the pool's used count, the token
 * total, the id bookkeeping and meta_bytes are recomputed and compared. The
 * first violation is described in one line on stderr. Scratch (two arrays
 * over the pool's capacity) comes from kv_mem and is freed before return;
 * if it cannot be had the check returns KV_ENOMEM.
 */
#include <stdio.h>

#include "formats/kv_fmt_merged.h"
#include "kv_page_int.h"

#define FAIL(...)                                                  \
    do {                                                           \
        fprintf(stderr, "kv_page_table_check: " __VA_ARGS__);      \
        fputc('\n', stderr);                                       \
        rc = KV_ECORRUPT;                                          \
        goto out;                                                  \
    } while (0)

static int is_int(uint32_t fmt)
{
    return fmt == KV_FMT_INT4 || fmt == KV_FMT_INT2;
}

/* Flags allowed on this entry of list li (layer li / n_kv_heads). */
static int flags_ok(const kv_page_table_t *pt, const kv_page_ent_t *e,
                    uint32_t li)
{
    uint32_t f = e->flags;
    if (f & ~(KV_PAGE_ENT_SHAPE | KV_PAGE_ENT_RESIDENCY))
        return 0;
    uint32_t r = f & KV_PAGE_ENT_RESIDENCY;
    if (r && (e->format == KV_FMT_MERGED ||
              ((r & KV_PAGE_ENT_LOST) && r != (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_LOST))))
        return 0;
    if ((f & KV_PAGE_ENT_UPPER) && e->format == KV_FMT_MERGED &&
        li / pt->cfg.n_kv_heads == 0)
        return 0;
    if ((f & KV_PAGE_ENT_VARIANT) && e->format != KV_FMT_MERGED &&
        kv_page_ent_variant(e) >= kv_format_variants(e->format, &pt->cfg.geom))
        return 0; /* FP16; INT rotated at a head_dim that cannot be */
    return !(f & KV_PAGE_ENT_RETAINED) || e->format == KV_FMT_FP16;
}

/* Tokens the entry's page can hold: tpp, or for MERGED its own capacity
 * from its header (0 if the header is not valid). */
static uint32_t ent_capacity(const kv_page_table_t *pt, const kv_page_ent_t *e,
                             uint32_t tpp)
{
    if (e->format != KV_FMT_MERGED)
        return tpp;
    const kv_page_geom_t *g = &pt->cfg.geom;
    uint32_t df = kv_fmt_merged_dir_format(kv_page_addr(pt, e->id), g);
    return df == UINT32_MAX ? 0 : kv_fmt_merged_capacity(g, df);
}

/* 1 if entries x and y are FP16 with equal flags (one run). */
static int same_run(const kv_page_ent_t *x, const kv_page_ent_t *y)
{
    return x->format == KV_FMT_FP16 && y->format == KV_FMT_FP16 &&
           (x->flags & KV_PAGE_ENT_SHAPE) == (y->flags & KV_PAGE_ENT_SHAPE);
}

/* 1 if entry e must be full: it is FP16 and followed by an entry of its
 * run, and it is not the head of a run that follows other entries (the
 * one place a conversion or merge leaves a partly filled FP16 page). */
static int run_inner(const kv_page_list_t *l, uint32_t e)
{
    const kv_page_ent_t *x = &l->ents[e];
    if (e + 1 >= l->n_ents || !same_run(x, &l->ents[e + 1]))
        return 0;
    return e == 0 || same_run(&l->ents[e - 1], x);
}

/* Count one reference to ent's page (its format noted at the first, and
 * in the distinct and per-format totals): 0, or -1 if an earlier reference
 * gave the page another format. */
static int count_ref(uint32_t *refs, uint8_t *fmts, const kv_page_ent_t *ent,
                     uint64_t *distinct, uint64_t *by_fmt)
{
    uint32_t idx = kv_alloc_page_index(ent->id);
    if (refs[idx] == 0) {
        fmts[idx] = ent->format;
        (*distinct)++;
        by_fmt[ent->format]++;
    } else if (fmts[idx] != ent->format) {
        return -1;
    }
    refs[idx]++;
    return 0;
}

int kv_page_table_check(const kv_page_table_t *pt)
{
    return kv_page_table_check_ext(pt, NULL, 0);
}

int kv_page_table_check_ext(const kv_page_table_t *pt, const kv_page_ent_t *ext,
                            size_t n_ext)
{
    if (!pt || (n_ext && !ext))
        return KV_EINVAL;
    uint32_t cap = kv_alloc_capacity(pt->pool);
    uint32_t *refs = kv_mem_calloc(cap, sizeof *refs);  /* [cap] references */
    uint8_t *fmts = kv_mem_calloc(cap, sizeof *fmts);   /* [cap] format     */
    int rc = KV_OK;
    if (!refs || !fmts) {
        rc = KV_ENOMEM;
        goto out;
    }

    /* Sequence bookkeeping and metadata size. */
    uint64_t meta = sizeof *pt + (uint64_t)pt->cfg.max_seqs *
                                     (sizeof *pt->seqs + sizeof *pt->free_ids);
    uint32_t live = 0;
    for (uint32_t s = 0; s < pt->cfg.max_seqs; s++)
        live += pt->seqs[s] != NULL;
    if (live != pt->n_live || live + pt->n_free != pt->cfg.max_seqs)
        FAIL("live %u, n_live %u, n_free %u, max_seqs %u", live, pt->n_live,
             pt->n_free, pt->cfg.max_seqs);
    for (uint32_t i = 0; i < pt->n_free; i++)
        if (pt->free_ids[i] >= pt->cfg.max_seqs || pt->seqs[pt->free_ids[i]])
            FAIL("free id stack slot %u holds %u (live or out of range)", i,
                 pt->free_ids[i]);

    /* Pass 1: lists. */
    uint64_t tokens = 0, distinct = 0;
    uint64_t by_fmt[KV_FMT_COUNT] = {0};
    for (uint32_t s = 0; s < pt->cfg.max_seqs; s++) {
        const kv_page_list_t *lists = pt->seqs[s];
        if (!lists)
            continue;
        meta += (uint64_t)pt->n_lists * sizeof *lists;
        for (uint32_t li = 0; li < pt->n_lists; li++) {
            const kv_page_list_t *l = &lists[li];
            uint64_t sum = 0;
            meta += (uint64_t)l->cap_ents * sizeof *l->ents +
                    (uint64_t)l->cap_pos * sizeof *l->pos;
            if (l->n_ents > l->cap_ents || (l->cap_ents && !l->ents) ||
                (l->pos && l->cap_pos < l->n_tokens) || (!l->pos && l->cap_pos))
                FAIL("seq %u list %u: arrays (n_ents %u cap %u, pos cap %u)", s,
                     li, l->n_ents, l->cap_ents, l->cap_pos);
            const uint32_t tf = kv_page_target_format(l->target);
            if ((tf != KV_FMT_FP16 && tf != KV_FMT_INT4 && tf != KV_FMT_INT2) ||
                (kv_page_target_variant(l->target) &&
                 kv_format_variants(tf, &pt->cfg.geom) < 2u))
                FAIL("seq %u list %u: target format %u", s, li, l->target);
            if (l->pos && l->cap_pos >= l->n_tokens) {
                int64_t next = 0; /* pos_next == 1 + the largest position */
                for (uint32_t i = 0; i < l->n_tokens; i++)
                    next = l->pos[i] >= next ? (int64_t)l->pos[i] + 1 : next;
                if (next != l->pos_next)
                    FAIL("seq %u list %u: pos_next %lld, largest position + 1 is %lld",
                         s, li, (long long)l->pos_next, (long long)next);
            }
            uint32_t busy = 0;
            for (uint32_t e = 0; e < l->n_ents; e++) {
                const kv_page_ent_t *ent = &l->ents[e];
                uint32_t tpp = kv_page_fmt_tpp(pt, ent->format);
                int holds = kv_page_ent_holds_page(ent);
                busy += (ent->flags & KV_PAGE_ENT_RESIDENCY) != 0;
                if ((holds ? !kv_alloc_id_valid(pt->pool, ent->id)
                           : ent->id == KV_PAGE_ID_INVALID) || tpp == 0)
                    FAIL("seq %u list %u ent %u: bad id %#x or format %u", s,
                         li, e, ent->id, ent->format);
                if (!flags_ok(pt, ent, li))
                    FAIL("seq %u list %u ent %u: flags %#x on format %u", s,
                         li, e, ent->flags, ent->format);
                if (!holds) { /* on the page file: no pool page to look at */
                    if (ent->n_tokens < 1 || ent->n_tokens > tpp ||
                        (is_int(ent->format) && ent->n_tokens % 16 != 0))
                        FAIL("seq %u list %u ent %u: %u tokens offloaded (page "
                             "holds %u)", s, li, e, ent->n_tokens, tpp);
                    sum += ent->n_tokens;
                    continue;
                }
                tpp = ent_capacity(pt, ent, tpp);
                if (ent->n_tokens < 1 || ent->n_tokens > tpp ||
                    (is_int(ent->format) && ent->n_tokens % 16 != 0) ||
                    (run_inner(l, e) && ent->n_tokens != tpp))
                    FAIL("seq %u list %u ent %u: %u tokens (page holds %u)", s,
                         li, e, ent->n_tokens, tpp);
                if (count_ref(refs, fmts, ent, &distinct, by_fmt))
                    FAIL("page %#x has formats %u and %u", ent->id,
                         fmts[kv_alloc_page_index(ent->id)], ent->format);
                sum += ent->n_tokens;
            }
            if (sum != l->n_tokens)
                FAIL("seq %u list %u: n_tokens %u, entries hold %llu", s, li,
                     l->n_tokens, (unsigned long long)sum);
            if (busy != l->n_busy)
                FAIL("seq %u list %u: n_busy %u, busy entries %u", s, li,
                     l->n_busy, busy);
            tokens += sum;
        }
    }

    /* External references (kv_page_extern.c): counted like entries. */
    for (size_t i = 0; i < n_ext; i++) {
        const kv_page_ent_t *ent = &ext[i];
        uint32_t tpp = kv_page_fmt_tpp(pt, ent->format);
        if (ent->flags || ent->format == KV_FMT_MERGED || tpp == 0 ||
            !kv_alloc_id_valid(pt->pool, ent->id) || ent->n_tokens < 1 ||
            ent->n_tokens > tpp || (is_int(ent->format) && ent->n_tokens % 16 != 0))
            FAIL("external reference %zu: page %#x format %u flags %#x tokens %u", i,
                 ent->id, ent->format, ent->flags, ent->n_tokens);
        if (count_ref(refs, fmts, ent, &distinct, by_fmt))
            FAIL("page %#x has formats %u and %u", ent->id,
                 fmts[kv_alloc_page_index(ent->id)], ent->format);
    }
    for (size_t i = 0; i < n_ext; i++) {
        uint32_t rc_pool = kv_alloc_refcount(pt->pool, ext[i].id);
        if (rc_pool != refs[kv_alloc_page_index(ext[i].id)])
            FAIL("page %#x: refcount %u, referenced %u times (external included)",
                 ext[i].id, rc_pool, refs[kv_alloc_page_index(ext[i].id)]);
    }

    /* Pass 2: refcounts. */
    for (uint32_t s = 0; s < pt->cfg.max_seqs; s++) {
        const kv_page_list_t *lists = pt->seqs[s];
        for (uint32_t li = 0; lists && li < pt->n_lists; li++)
            for (uint32_t e = 0; e < lists[li].n_ents; e++) {
                const kv_page_ent_t *ent = &lists[li].ents[e];
                if (!kv_page_ent_holds_page(ent))
                    continue;
                kv_page_id_t id = ent->id;
                uint32_t rc_pool = kv_alloc_refcount(pt->pool, id);
                if (rc_pool != refs[kv_alloc_page_index(id)])
                    FAIL("page %#x: refcount %u, referenced %u times", id,
                         rc_pool, refs[kv_alloc_page_index(id)]);
                if ((ent->flags & KV_PAGE_ENT_RESIDENCY) && rc_pool != 1)
                    FAIL("page %#x: owned by an I/O but has refcount %u", id,
                         rc_pool);
            }
    }

    /* Totals. */
    for (uint32_t f = 0; f < KV_FMT_COUNT; f++)
        if (by_fmt[f] != pt->pages_by_format[f])
            FAIL("format %u: %llu pages counted, %llu recorded", f,
                 (unsigned long long)by_fmt[f],
                 (unsigned long long)pt->pages_by_format[f]);
    kv_alloc_stats_t st;
    kv_alloc_stats(pt->pool, &st);
    if (st.used != distinct || st.used + st.free != st.capacity)
        FAIL("pool used %llu free %llu capacity %llu, pages referenced %llu",
             (unsigned long long)st.used, (unsigned long long)st.free,
             (unsigned long long)st.capacity, (unsigned long long)distinct);
    if (tokens != pt->tokens)
        FAIL("tokens %llu, recorded %llu", (unsigned long long)tokens,
             (unsigned long long)pt->tokens);
    if (meta != pt->meta_bytes)
        FAIL("meta_bytes %llu, recorded %llu", (unsigned long long)meta,
             (unsigned long long)pt->meta_bytes);

out:
    kv_mem_free(refs, (size_t)cap * sizeof *refs);
    kv_mem_free(fmts, (size_t)cap * sizeof *fmts);
    return rc;
}
