/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload_access.c — what a call does when it meets pages that are
 * not resident (kvpage.h, "offload").
 *
 * access() runs before attention and kv_read read the lists they need:
 * a lock-free pass checks those lists (n_busy, then each entry's flags,
 * loaded with acquire: kv_page_resid.c publishes id before flags); if all
 * are readable it costs nothing more. Otherwise, under off->lock, completed
 * page-ins of the sequence are taken in; then without KV_OFFLOAD_WAIT the
 * answer is KV_ENOTRES, with it the whole sequence is read back and waited
 * for. Attention calls may run concurrently: page-ins are serialized by the
 * lock, they only change entries that are not readable (so the lists other
 * calls are reading never change), and write completions, which free
 * pages, are never processed here.
 *
 * ready() runs before a mutating call on a sequence (append, compact, fork):
 * its I/O in flight is finished first (a page owned by an I/O is never
 * written), then a sequence with pages on the file gets KV_ENOTRES, or with
 * WAIT is read back.
 */
#include "kv_store_int.h"

/* 1 if every entry of the lists of seq at layer (head, or all) is readable. */
static int readable(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer, uint32_t head)
{
    uint32_t h0 = head == UINT32_MAX ? 0 : head;
    uint32_t h1 = head == UINT32_MAX ? s->cfg.n_kv_heads : head + 1;
    for (uint32_t h = h0; h < h1; h++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, layer, h);
        if (!__atomic_load_n(&l->n_busy, __ATOMIC_ACQUIRE))
            continue;
        for (uint32_t e = 0; e < l->n_ents; e++)
            if (__atomic_load_n(&l->ents[e].flags, __ATOMIC_ACQUIRE) &
                KV_PAGE_ENT_OFFLOADED)
                return 0;
    }
    return 1;
}

int kv_store_off_access(const kv_store_t *cs, const kv_seq_id_t *seqs, uint32_t n,
                        uint32_t layer, uint32_t head)
{
    if (!cs->off)
        return 0;
    uint32_t b = 0;
    while (b < n && readable(cs, seqs[b], layer, head))
        b++;
    if (b == n)
        return 0;
    /* Page-ins change residency, never content: the store is not const. */
    kv_store_t *s = (kv_store_t *)cs;
    kv_store_off_t *o = s->off;
    const int wait = (s->cfg.offload_flags & KV_OFFLOAD_WAIT) != 0;
    int rc = 0;
    pthread_mutex_lock(&o->lock);
    for (; b < n && rc == 0; b++) {
        if (readable(s, seqs[b], layer, head))
            continue;
        rc = kv_store_off_settle(s, seqs[b], 0, wait);
        if (rc == 0 && !readable(s, seqs[b], layer, head))
            rc = wait ? kv_store_off_page_in(s, seqs[b]) : KV_ENOTRES;
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int kv_store_off_ready(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_t *o = s->off;
    if (!o || seq >= s->cfg.max_seqs)
        return 0;
    const kv_store_off_seq_t *q = &o->seqs[seq];
    if (!q->batches && !q->on_file) /* mutating calls are serialized: no race */
        return 0;
    pthread_mutex_lock(&o->lock);
    int rc = kv_store_off_settle(s, seq, 1, 1);
    if (rc == 0 && q->on_file)
        rc = (s->cfg.offload_flags & KV_OFFLOAD_WAIT) ? kv_store_off_page_in(s, seq)
                                                      : KV_ENOTRES;
    pthread_mutex_unlock(&o->lock);
    return rc;
}
