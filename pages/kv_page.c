/* SPDX-License-Identifier: MIT */
/*
 * kv_page.c — the page table (kv_page.h): create/destroy, sequences
 * (create, free, fork), read-back and queries.
 *
 * A sequence is an array of n_layers * n_kv_heads lists (layer-major),
 * reached through seqs[id]; free ids sit on a stack. Every entry of a list
 * holds one pool reference to its page. Fork copies each list's entries,
 * positions (exact capacity) and target format, and retains every page
 * (a MERGED page named by two layers' lists gains two references): all metadata is
 * allocated before the first retain, so a failed fork only frees what it
 * allocated. Append lives in kv_page_append.c, compaction in
 * kv_page_compact.c, the invariant check in kv_page_check.c; the shared
 * struct and invariants are in kv_page_int.h.
 *
 * Ownership: the table owns its sequences, lists and one reference per
 * entry; the pool is borrowed.
 */
#include <assert.h>
#include <string.h>

#include "kv_page_int.h"

/* ---- helpers shared by the kv_page*.c files ----------------------------- */

/* kv_page.h */
void *kv_page_addr(const kv_page_table_t *pt, kv_page_id_t id)
{
    void *p = kv_alloc_page_ptr(pt->pool, id);
    assert(p && "page table needs a host-tier pool");
    return p;
}

void kv_page_unref(kv_page_table_t *pt, kv_page_id_t id, uint32_t fmt)
{
    int rc = kv_alloc_release(pt->pool, id);
    assert(rc >= 0 && fmt < KV_FMT_COUNT);
    if (rc == 1) {
        assert(pt->pages_by_format[fmt] > 0);
        pt->pages_by_format[fmt]--;
    }
}

uint32_t kv_page_fmt_tpp(const kv_page_table_t *pt, uint32_t fmt)
{
    const kv_format_traits_t *tr = kv_format_get(fmt);
    return tr ? tr->tokens_per_page(&pt->cfg.geom) : 0;
}

/* ---- table -------------------------------------------------------------- */

int kv_page_table_create(const kv_page_table_config_t *cfg,
                         kv_alloc_pool_t *pool, kv_page_table_t **out)
{
    if (!cfg || !pool || !out || cfg->n_layers == 0 || cfg->n_kv_heads == 0 ||
        cfg->max_seqs == 0)
        return KV_EINVAL;
    if ((uint64_t)cfg->n_layers * cfg->n_kv_heads > UINT32_MAX)
        return KV_ERANGE;
    if (cfg->geom.page_bytes != kv_alloc_page_bytes(pool))
        return KV_ERANGE;
    const kv_format_traits_t *fp16 = kv_format_get(KV_FMT_FP16);
    assert(fp16);
    uint32_t tpp = fp16->tokens_per_page(&cfg->geom);
    if (cfg->geom.head_dim == 0 || tpp == 0 || tpp > UINT16_MAX)
        return KV_ERANGE;
    /* ent.n_tokens is 16 bits: no format may hold more per page (INT2
     * holds 4x FP16, so this bounds page_bytes at small head_dims). */
    for (uint32_t f = 0; f < KV_FMT_COUNT; f++) {
        const kv_format_traits_t *tr = kv_format_get(f);
        if (tr && tr->tokens_per_page(&cfg->geom) > UINT16_MAX)
            return KV_ERANGE;
    }
    uint32_t resid = cfg->residual ? cfg->residual : 128u;
    if (resid % 16 != 0 || resid > 65536u)
        return KV_ERANGE;
    uint32_t df = cfg->default_format;
    if ((df != KV_FMT_FP16 && df != KV_FMT_INT4 && df != KV_FMT_INT2) ||
        kv_format_get(df)->tokens_per_page(&cfg->geom) == 0)
        return KV_ERANGE;

    kv_page_table_t tmp = {.cfg = *cfg, .pool = pool, .fp16_tpp = tpp,
                           .residual = resid,
                           .n_lists = cfg->n_layers * cfg->n_kv_heads};
    size_t seqs_n = (size_t)cfg->max_seqs * sizeof(kv_page_list_t *);
    size_t ids_n = (size_t)cfg->max_seqs * sizeof(uint32_t);
    kv_page_table_t *pt = kv_page_meta_alloc(&tmp, sizeof *pt);
    kv_page_list_t **seqs = kv_mem_calloc(cfg->max_seqs, sizeof *seqs);
    uint32_t *ids = kv_mem_alloc(ids_n);
    if (!pt || !seqs || !ids) {
        kv_mem_free(pt, sizeof *pt);
        kv_mem_free(seqs, seqs ? seqs_n : 0);
        kv_mem_free(ids, ids ? ids_n : 0);
        return KV_ENOMEM;
    }
    *pt = tmp;
    pt->seqs = seqs;
    pt->free_ids = ids;
    pt->meta_bytes += seqs_n + ids_n;
    /* Pop order: lowest id first (not promised by the header). */
    for (uint32_t i = 0; i < cfg->max_seqs; i++)
        ids[i] = cfg->max_seqs - 1 - i;
    pt->n_free = cfg->max_seqs;
    *out = pt;
    return KV_OK;
}

/* Release every page of a live sequence, free its metadata, free its id. */
static void seq_drop(kv_page_table_t *pt, uint32_t seq)
{
    kv_page_list_t *lists = pt->seqs[seq];
    for (uint32_t i = 0; i < pt->n_lists; i++) {
        kv_page_list_t *l = &lists[i];
        for (uint32_t e = 0; e < l->n_ents; e++) {
            /* no I/O may own a page of a dropped sequence (the store waits) */
            assert(!(l->ents[e].flags & KV_PAGE_ENT_PAGING));
            if (kv_page_ent_holds_page(&l->ents[e]))
                kv_page_unref(pt, l->ents[e].id, l->ents[e].format);
        }
        pt->tokens -= l->n_tokens;
        kv_page_meta_free(pt, l->ents, (size_t)l->cap_ents * sizeof *l->ents);
        kv_page_meta_free(pt, l->pos, (size_t)l->cap_pos * sizeof *l->pos);
    }
    kv_page_meta_free(pt, lists, (size_t)pt->n_lists * sizeof *lists);
    pt->seqs[seq] = NULL;
    pt->free_ids[pt->n_free++] = seq;
    pt->n_live--;
}

void kv_page_table_destroy(kv_page_table_t *pt)
{
    if (!pt)
        return;
    for (uint32_t s = 0; s < pt->cfg.max_seqs; s++)
        if (pt->seqs[s])
            seq_drop(pt, s);
    kv_mem_free(pt->seqs, (size_t)pt->cfg.max_seqs * sizeof *pt->seqs);
    kv_mem_free(pt->free_ids, (size_t)pt->cfg.max_seqs * sizeof *pt->free_ids);
    kv_mem_free(pt, sizeof *pt);
}

/* ---- sequences ---------------------------------------------------------- */

int kv_page_seq_live(const kv_page_table_t *pt, uint32_t seq)
{
    return pt && seq < pt->cfg.max_seqs && pt->seqs[seq] != NULL;
}

uint32_t kv_page_seq_count(const kv_page_table_t *pt)
{
    return pt ? pt->n_live : 0;
}

int kv_page_seq_create(kv_page_table_t *pt, uint32_t *seq)
{
    if (!pt || !seq)
        return KV_EINVAL;
    if (pt->n_free == 0)
        return KV_ELIMIT;
    size_t n = (size_t)pt->n_lists * sizeof(kv_page_list_t);
    kv_page_list_t *lists = kv_mem_calloc(pt->n_lists, sizeof *lists);
    if (!lists)
        return KV_ENOMEM;
    pt->meta_bytes += n;
    for (uint32_t i = 0; i < pt->n_lists; i++)
        lists[i].target = pt->cfg.default_format;
    uint32_t id = pt->free_ids[--pt->n_free];
    pt->seqs[id] = lists;
    pt->n_live++;
    *seq = id;
    return KV_OK;
}

int kv_page_seq_free(kv_page_table_t *pt, uint32_t seq)
{
    if (!pt)
        return KV_EINVAL;
    if (!kv_page_seq_live(pt, seq))
        return KV_ENOENT;
    seq_drop(pt, seq);
    return KV_OK;
}

/* Free the metadata of the first n lists of a half-built fork (no page has
 * been retained yet). */
static void fork_undo(kv_page_table_t *pt, kv_page_list_t *lists, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kv_page_meta_free(pt, lists[i].ents,
                          (size_t)lists[i].cap_ents * sizeof *lists[i].ents);
        kv_page_meta_free(pt, lists[i].pos,
                          (size_t)lists[i].cap_pos * sizeof *lists[i].pos);
    }
    kv_page_meta_free(pt, lists, (size_t)pt->n_lists * sizeof *lists);
}

int kv_page_seq_fork(kv_page_table_t *pt, uint32_t parent, uint32_t *child)
{
    if (!pt || !child)
        return KV_EINVAL;
    if (!kv_page_seq_live(pt, parent))
        return KV_ENOENT;
    if (kv_page_seq_busy(pt, parent))
        return KV_ENOTRES;
    if (pt->n_free == 0)
        return KV_ELIMIT;
    const kv_page_list_t *src = pt->seqs[parent];
    kv_page_list_t *lists =
        kv_page_meta_alloc(pt, (size_t)pt->n_lists * sizeof *lists);
    if (!lists)
        return KV_ENOMEM;
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < pt->n_lists; i++) {
        const kv_page_list_t *s = &src[i];
        kv_page_list_t *d = &lists[i];
        memset(d, 0, sizeof *d);
        if (s->n_ents) {
            d->ents = kv_page_meta_alloc(pt, (size_t)s->n_ents *
                                                 sizeof *d->ents);
            if (!d->ents) {
                fork_undo(pt, lists, i);
                return KV_ENOMEM;
            }
            memcpy(d->ents, s->ents, (size_t)s->n_ents * sizeof *d->ents);
            d->n_ents = d->cap_ents = s->n_ents;
        }
        if (s->pos && s->n_tokens) {
            d->pos = kv_page_meta_alloc(pt, (size_t)s->n_tokens *
                                                sizeof *d->pos);
            if (!d->pos) {
                fork_undo(pt, lists, i + 1);
                return KV_ENOMEM;
            }
            memcpy(d->pos, s->pos, (size_t)s->n_tokens * sizeof *d->pos);
            d->cap_pos = s->n_tokens;
            d->pos_next = s->pos_next;
        }
        d->n_tokens = s->n_tokens;
        d->target = s->target;
        tokens += s->n_tokens;
    }
    /* Everything allocated: take the references (cannot fail on held pages). */
    for (uint32_t i = 0; i < pt->n_lists; i++)
        for (uint32_t e = 0; e < lists[i].n_ents; e++) {
            int rc = kv_alloc_retain(pt->pool, lists[i].ents[e].id);
            assert(rc == 0);
            (void)rc;
        }
    uint32_t id = pt->free_ids[--pt->n_free];
    pt->seqs[id] = lists;
    pt->n_live++;
    pt->tokens += tokens;
    *child = id;
    return KV_OK;
}

/* ---- read-back and queries --------------------------------------------- */

void kv_page_list_pos_rescan(kv_page_list_t *l)
{
    int64_t next = 0;
    for (uint32_t i = 0; l->pos && i < l->n_tokens; i++)
        if (l->pos[i] >= next)
            next = (int64_t)l->pos[i] + 1;
    l->pos_next = next;
}

const kv_page_list_t *kv_page_list_get(const kv_page_table_t *pt, uint32_t seq,
                                       uint32_t layer, uint32_t head)
{
    if (!kv_page_seq_live(pt, seq) || layer >= pt->cfg.n_layers ||
        head >= pt->cfg.n_kv_heads)
        return NULL;
    return kv_page_list_at(pt, seq, layer, head);
}

int kv_page_read(const kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                 uint32_t head, uint32_t t0, uint32_t n, float *k, float *v,
                 int32_t *pos)
{
    int rc = kv_page_check_list(pt, seq, layer, head);
    if (rc)
        return rc;
    const kv_page_list_t *l = kv_page_list_at(pt, seq, layer, head);
    if ((uint64_t)t0 + n > l->n_tokens)
        return KV_ERANGE;
    if (__atomic_load_n(&l->n_busy, __ATOMIC_ACQUIRE)) {
        /* every entry overlapping [t0, t0+n) must be readable */
        uint32_t at = 0;
        for (uint32_t e = 0; e < l->n_ents && at < t0 + n; e++) {
            uint8_t fl = __atomic_load_n(&l->ents[e].flags, __ATOMIC_ACQUIRE);
            if (at + l->ents[e].n_tokens > t0 && (fl & KV_PAGE_ENT_OFFLOADED))
                return KV_ENOTRES;
            at += l->ents[e].n_tokens;
        }
    }
    const kv_page_geom_t *g = &pt->cfg.geom;
    size_t row = g->head_dim;
    if (pos)
        for (uint32_t i = 0; i < n; i++)
            pos[i] = kv_page_list_pos(l, t0 + i);
    /* Walk the entries: skip those wholly before t0, then decode runs. */
    uint32_t start = 0, done = 0;
    for (uint32_t e = 0; e < l->n_ents && done < n; e++) {
        const kv_page_ent_t *ent = &l->ents[e];
        uint32_t end = start + ent->n_tokens;
        if (end > t0 + done) {
            uint32_t off = t0 + done - start;
            uint32_t cnt = ent->n_tokens - off;
            if (cnt > n - done)
                cnt = n - done;
            kv_format_load(ent->format, kv_page_ent_variant(ent),
                           kv_page_addr(pt, ent->id), g, off, cnt,
                           k ? k + (size_t)done * row : NULL,
                           v ? v + (size_t)done * row : NULL);
            done += cnt;
        }
        start = end;
    }
    assert(done == n);
    return KV_OK;
}

const kv_page_geom_t *kv_page_table_geom(const kv_page_table_t *pt)
{
    return &pt->cfg.geom;
}

kv_alloc_pool_t *kv_page_table_pool(const kv_page_table_t *pt)
{
    return pt->pool;
}

void kv_page_table_totals(const kv_page_table_t *pt, kv_page_totals_t *out)
{
    memset(out, 0, sizeof *out);
    out->tokens = pt->tokens;
    for (uint32_t f = 0; f < KV_FMT_COUNT; f++)
        out->pages_by_format[f] = pt->pages_by_format[f];
    out->meta_bytes = pt->meta_bytes;
}
