/* SPDX-License-Identifier: MIT */
/*
 * kv_page_resid.c — residency of page-table entries, for the store's
 * page-file tier (store/kv_store_offload*.c): the one place that changes
 * an entry between "its data is in a pool page" and "its data is in a slot
 * of the page file" (kv_page.h, residency flags), and the adoption of a
 * sequence rebuilt from a page file.
 *
 * Invariants kept: an entry holds one pool reference iff
 * kv_page_ent_holds_page(); pages_by_format counts distinct held pages, so
 * it follows that; list.n_busy counts the entries with residency bits.
 * Concurrent attention calls may read the entries being changed (a page-in
 * under KV_OFFLOAD_WAIT runs inside an attention call): the id is stored
 * before the flags, both with release ordering, and readers load the
 * flags (acquire) before they trust the id.
 *
 * Ownership: the table's, as everywhere in pages/; adopted blocks become
 * the table's.
 */
#include <assert.h>
#include <string.h>

#include "kv_page_int.h"

int kv_page_seq_busy(const kv_page_table_t *pt, uint32_t seq)
{
    const kv_page_list_t *lists = pt->seqs[seq];
    for (uint32_t i = 0; i < pt->n_lists; i++)
        if (__atomic_load_n(&lists[i].n_busy, __ATOMIC_ACQUIRE))
            return 1;
    return 0;
}

void kv_page_ent_set_residency(kv_page_table_t *pt, uint32_t seq, uint32_t li,
                               uint32_t e, kv_page_id_t id, uint32_t rflags)
{
    assert(kv_page_seq_live(pt, seq) && li < pt->n_lists);
    kv_page_list_t *l = &pt->seqs[seq][li];
    assert(e < l->n_ents && !(rflags & ~KV_PAGE_ENT_RESIDENCY));
    kv_page_ent_t *ent = &l->ents[e];
    kv_page_ent_t next = *ent;
    next.id = id;
    next.flags = (uint8_t)((ent->flags & ~KV_PAGE_ENT_RESIDENCY) | rflags);
    int held = kv_page_ent_holds_page(ent), holds = kv_page_ent_holds_page(&next);
    int was_busy = (ent->flags & KV_PAGE_ENT_RESIDENCY) != 0, busy = rflags != 0;
    assert(ent->format < KV_FMT_COUNT && (!busy || ent->format != KV_FMT_MERGED));
    kv_page_id_t old = ent->id;
    if (holds && !held) /* the caller's reference becomes the entry's */
        pt->pages_by_format[ent->format]++;
    __atomic_store_n(&ent->id, id, __ATOMIC_RELEASE);
    __atomic_store_n(&ent->flags, next.flags, __ATOMIC_RELEASE);
    if (busy != was_busy)
        __atomic_store_n(&l->n_busy, l->n_busy + (busy ? 1u : (uint32_t)-1),
                         __ATOMIC_RELEASE);
    if (held && !holds)
        kv_page_unref(pt, old, ent->format);
}

int kv_page_seq_adopt(kv_page_table_t *pt, uint32_t id, kv_page_list_t *lists)
{
    if (!pt || !lists)
        return KV_EINVAL;
    if (id >= pt->cfg.max_seqs || pt->seqs[id])
        return KV_ESTATE;
    uint64_t tokens = 0, meta = (uint64_t)pt->n_lists * sizeof *lists;
    for (uint32_t i = 0; i < pt->n_lists; i++) {
        const kv_page_list_t *l = &lists[i];
        uint64_t sum = 0;
        uint32_t busy = 0;
        if (l->n_ents > l->cap_ents || (l->cap_ents && !l->ents) ||
            (l->pos ? l->cap_pos < l->n_tokens : l->cap_pos != 0))
            return KV_EINVAL;
        for (uint32_t e = 0; e < l->n_ents; e++) {
            sum += l->ents[e].n_tokens;
            busy += (l->ents[e].flags & KV_PAGE_ENT_RESIDENCY) != 0;
        }
        if (sum != l->n_tokens || busy != l->n_busy)
            return KV_EINVAL;
        tokens += sum;
        meta += (uint64_t)l->cap_ents * sizeof *l->ents +
                (uint64_t)l->cap_pos * sizeof *l->pos;
    }
    /* take id off the free stack (order of the rest kept) */
    uint32_t at = pt->n_free;
    for (uint32_t i = 0; i < pt->n_free; i++)
        if (pt->free_ids[i] == id)
            at = i;
    assert(at < pt->n_free);
    memmove(&pt->free_ids[at], &pt->free_ids[at + 1],
            (size_t)(pt->n_free - at - 1) * sizeof *pt->free_ids);
    pt->n_free--;
    for (uint32_t i = 0; i < pt->n_lists; i++)
        for (uint32_t e = 0; e < lists[i].n_ents; e++)
            if (kv_page_ent_holds_page(&lists[i].ents[e]))
                pt->pages_by_format[lists[i].ents[e].format]++;
    pt->seqs[id] = lists;
    pt->n_live++;
    pt->tokens += tokens;
    pt->meta_bytes += meta;
    return KV_OK;
}
