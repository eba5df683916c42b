/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload_api.c — the per-sequence calls of the page-file tier
 * (kvpage.h, "offload"): kv_seq_offload, kv_seq_prefetch, kv_seq_wait,
 * kv_seq_residency. Each validates, takes off->lock, first takes completed
 * I/O of its own sequence into account without blocking, then does its one
 * thing through kv_store_offload_io.c. Only the named sequence's entries
 * change (its write completions free its pool pages): so these calls may
 * run while attention reads other sequences (kvpage.h).
 *
 * Ownership: nothing is kept beyond the batches the io file links.
 */
#include "kv_store_int.h"

int kv_store_off_enter(kv_store_t *s, const kv_seq_id_t *seq)
{
    if (!s)
        return KV_EINVAL;
    if (!s->off)
        return KV_ENOTSUP;
    if (seq && !kv_page_seq_live(s->pt, *seq))
        return KV_ENOENT;
    pthread_mutex_lock(&s->off->lock);
    kv_store_off_settle(s, seq ? *seq : KV_STORE_OFF_ALL, 1, 0);
    return 0;
}

static int enter(kv_store_t *s, kv_seq_id_t seq)
{
    return kv_store_off_enter(s, &seq);
}

/* Page every page of seq out (in = 0: kv_seq_offload) or in (in = 1:
 * kv_seq_prefetch). I/O of seq in flight the other way is waited for first,
 * so that the call covers every page. */
static int transfer(kv_store_t *s, kv_seq_id_t seq, int in)
{
    int rc = enter(s, seq);
    if (rc)
        return rc;
    const kv_store_off_seq_t *q = &s->off->seqs[seq];
    uint32_t n;
    if (in ? q->writing : q->reading)
        rc = kv_store_off_settle(s, seq, 1, 1);
    if (rc == 0)
        rc = in ? kv_store_off_read_seq(s, seq, &n)
                : kv_store_off_write_seq(s, seq, &n);
    pthread_mutex_unlock(&s->off->lock);
    if (rc == 0 && in)
        kv_store_touch(s, seq);
    return rc;
}

int kv_seq_offload(kv_store_t *s, kv_seq_id_t seq)
{
    return transfer(s, seq, 0);
}

int kv_seq_prefetch(kv_store_t *s, kv_seq_id_t seq)
{
    return transfer(s, seq, 1);
}

int kv_seq_wait(kv_store_t *s, kv_seq_id_t seq)
{
    int rc = enter(s, seq);
    if (rc)
        return rc;
    kv_store_off_seq_t *q = &s->off->seqs[seq];
    rc = kv_store_off_settle(s, seq, 1, 1);
    if (rc == 0)
        rc = q->err ? q->err : q->lost ? q->lost_err : 0;
    q->err = 0;
    pthread_mutex_unlock(&s->off->lock);
    return rc;
}

int kv_seq_residency(kv_store_t *s, kv_seq_id_t seq, kv_residency_t *out)
{
    if (!s || !out)
        return KV_EINVAL;
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    if (s->off) {
        pthread_mutex_lock(&s->off->lock);
        kv_store_off_settle(s, seq, 1, 0);
    }
    kv_residency_t r = {0};
    const uint32_t H = s->cfg.n_kv_heads;
    for (uint32_t li = 0; li < s->cfg.n_layers * H; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        for (uint32_t e = 0; e < l->n_ents; e++) {
            uint32_t f = l->ents[e].flags;
            r.pages++;
            r.resident += !(f & KV_PAGE_ENT_OFFLOADED);
            r.in_flight += (f & KV_PAGE_ENT_PAGING) != 0;
            r.on_file += (f & (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING)) ==
                         KV_PAGE_ENT_OFFLOADED;
            r.lost += (f & KV_PAGE_ENT_LOST) != 0;
        }
    }
    if (s->off)
        pthread_mutex_unlock(&s->off->lock);
    *out = r;
    return 0;
}
