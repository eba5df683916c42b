/* SPDX-License-Identifier: MIT */
/*
 * kv_page_extern.c — page references held outside the table's lists (the
 * store's prefix cache, store/kv_store_prefix.c), and installing such pages
 * as the first entries of an empty sequence (kv_page.h, "external
 * references").
 *
 * Invariants: an external reference is one pool reference, taken with
 * kv_page_ref_take on a page the table (or another external holder) already
 * holds, and given back with kv_page_ref_drop, which keeps pages_by_format in
 * step like any entry's release; kv_page_table_check_ext counts them.
 * Ownership: the holder owns its references; the table owns every entry
 * array kv_page_seq_attach installs.
 */
#include <assert.h>
#include <string.h>

#include "kv_page_int.h"

void kv_page_ref_take(kv_page_table_t *pt, kv_page_id_t id)
{
    int rc = kv_alloc_retain(pt->pool, id);
    assert(rc == 0 && "an external reference is taken on a held page");
    (void)rc;
}

int kv_page_ref_new(kv_page_table_t *pt, uint32_t fmt, kv_page_id_t *id)
{
    if (!pt || !id || fmt >= KV_FMT_COUNT)
        return KV_EINVAL;
    int rc = kv_alloc_page(pt->pool, id);
    if (rc == 0)
        pt->pages_by_format[fmt]++;
    return rc;
}

void kv_page_ref_drop(kv_page_table_t *pt, kv_page_id_t id, uint32_t fmt)
{
    kv_page_unref(pt, id, fmt);
}

/* Free the arrays attach gave lists [0, n) (they were empty before). */
static void attach_undo(kv_page_table_t *pt, kv_page_list_t *lists, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        kv_page_list_t *l = &lists[k];
        kv_page_meta_free(pt, l->ents, (size_t)l->cap_ents * sizeof *l->ents);
        l->ents = NULL;
        l->cap_ents = 0;
    }
}

int kv_page_seq_attach(kv_page_table_t *pt, uint32_t seq, const kv_page_ent_t *ents,
                       const uint32_t *n_ents, const int32_t *pos, const uint32_t *targets)
{
    if (!pt || !n_ents)
        return KV_EINVAL;
    if (!kv_page_seq_live(pt, seq))
        return KV_ENOENT;
    kv_page_list_t *lists = pt->seqs[seq];
    size_t total = 0;
    for (uint32_t i = 0; i < pt->n_lists; i++) {
        if (lists[i].n_ents || lists[i].n_tokens || lists[i].n_busy)
            return KV_ESTATE;
        total += n_ents[i];
    }
    if (total && !ents)
        return KV_EINVAL;
    /* Validate before anything changes: held, resident, unflagged, full
     * groups, within the format's capacity. */
    for (size_t j = 0; j < total; j++) {
        const kv_page_ent_t *e = &ents[j];
        uint32_t tpp = kv_page_fmt_tpp(pt, e->format);
        if (e->flags || e->format == KV_FMT_MERGED || tpp == 0 || e->n_tokens == 0 ||
            e->n_tokens > tpp || (e->format != KV_FMT_FP16 && e->n_tokens % 16) ||
            !kv_alloc_id_valid(pt->pool, e->id) || kv_alloc_refcount(pt->pool, e->id) == 0)
            return KV_EINVAL;
    }
    /* Every array first (all-or-nothing), then the references. The
     * positions' arrays wait in a scratch until all exist. */
    struct attach_pos { int32_t *pos; uint32_t tok; } *pa = NULL;
    if (pos && !(pa = kv_page_meta_alloc(pt, (size_t)pt->n_lists * sizeof *pa)))
        return KV_ENOMEM;
    uint32_t i = 0;
    size_t at = 0;
    for (; i < pt->n_lists; i++) {
        uint32_t tok = 0;
        for (uint32_t e = 0; e < n_ents[i]; e++)
            tok += ents[at + e].n_tokens;
        at += n_ents[i];
        if (pa)
            pa[i] = (struct attach_pos){NULL, tok};
        if (!n_ents[i])
            continue;
        lists[i].ents = kv_page_meta_alloc(pt, (size_t)n_ents[i] * sizeof *ents);
        if (!lists[i].ents)
            break;
        lists[i].cap_ents = n_ents[i];
        if (pa && !(pa[i].pos = kv_page_meta_alloc(pt, (size_t)tok * sizeof *pos)))
            break;
    }
    if (i < pt->n_lists) { /* undo: the lists were empty */
        attach_undo(pt, lists, i + 1);
        for (uint32_t k = 0; pa && k <= i; k++)
            kv_page_meta_free(pt, pa[k].pos, (size_t)pa[k].tok * sizeof *pos);
        kv_page_meta_free(pt, pa, (size_t)pt->n_lists * sizeof *pa);
        return KV_ENOMEM;
    }
    at = 0;
    size_t pat = 0;
    for (i = 0; i < pt->n_lists; i++) {
        kv_page_list_t *l = &lists[i];
        uint32_t tok = 0;
        for (uint32_t e = 0; e < n_ents[i]; e++, at++) {
            l->ents[e] = ents[at];
            kv_page_ref_take(pt, ents[at].id);
            tok += ents[at].n_tokens;
        }
        l->n_ents = n_ents[i];
        l->n_tokens = tok;
        pt->tokens += tok;
        /* positions: identity (pos NULL) or the caller's; an emptied list
         * may keep an array */
        kv_page_meta_free(pt, l->pos, (size_t)l->cap_pos * sizeof *l->pos);
        l->pos = NULL;
        l->cap_pos = 0;
        l->pos_next = 0;
        if (pa && pa[i].pos) {
            memcpy(pa[i].pos, pos + pat, (size_t)tok * sizeof *pos);
            l->pos = pa[i].pos;
            l->cap_pos = tok;
            kv_page_list_pos_rescan(l);
        }
        pat += tok;
        if (targets)
            l->target = targets[i];
    }
    if (pa)
        kv_page_meta_free(pt, pa, (size_t)pt->n_lists * sizeof *pa);
    return 0;
}
