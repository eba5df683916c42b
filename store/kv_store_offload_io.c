/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload_io.c — page-outs and page-ins of one sequence as
 * batches on the page file, and what their completions do to the entries.
 *
 * Page-out (write_seq): every resident, unbusy entry of the sequence whose
 * page has refcount 1, whose format is not MERGED and whose index fits the
 * key (< 2^18 entries per list) is written in one batch; the entries become
 * PAGING (still readable; the page is the batch's until its completion is
 * seen). On completion: written -> OFFLOADED (id = the slot, slot_gen
 * remembers the generation, the pool page is released); failed -> resident
 * again, the error recorded for kv_seq_wait.
 *
 * Page-in (read_seq): every OFFLOADED entry not being read (lost ones too)
 * gets a fresh pool page (all or none), and one read batch fills them; the
 * entries become OFFLOADED|PAGING holding their destination page. On
 * completion: verified -> resident, its slot freed; failed -> OFFLOADED|LOST
 * on its slot again, the destination page released, the error kept (a page
 * that fails its check is never made readable).
 *
 * A batch's statuses start at KV_STORE_OFF_PENDING: the file fills them when
 * it reports the batch, so a poll/wait that returns an error of its own
 * (the I/O queue failed to reap) leaves the batch pending and in flight.
 * Generations come from a store-wide counter, so (key, generation) never
 * repeats in a file and a stale slot can never pass for a page.
 *
 * Everything here runs with off->lock held; write completions only from
 * mutating calls (settle with writes = 1), see kv_store_int.h.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_store_int.h"

#define KEY_MAX_ENTS (1u << 18) /* kv_offload_key's index field */

uint64_t kv_store_off_key(const kv_store_t *s, kv_seq_id_t seq, uint32_t li, uint32_t e)
{
    return kv_offload_key(seq, li / s->cfg.n_kv_heads, li % s->cfg.n_kv_heads, e);
}

static uint32_t n_lists(const kv_store_t *s)
{
    return s->cfg.n_layers * s->cfg.n_kv_heads;
}

static const kv_page_list_t *list_of(const kv_store_t *s, kv_seq_id_t seq, uint32_t li)
{
    return kv_page_list_get(s->pt, seq, li / s->cfg.n_kv_heads, li % s->cfg.n_kv_heads);
}

/* One block: the batch, pg[n], slots[n], status[n], then `extra` bytes. */
static kv_store_off_batch_t *batch_new(uint32_t n, size_t extra, void **extra_p)
{
    size_t bytes = sizeof(kv_store_off_batch_t) +
                   (size_t)n * (sizeof(kv_store_off_pg_t) + sizeof(kv_offload_slot_t) +
                                sizeof(int)) +
                   extra;
    kv_store_off_batch_t *b = kv_mem_alloc(bytes);
    if (!b)
        return NULL;
    memset(b, 0, sizeof *b);
    b->pg = (kv_store_off_pg_t *)(b + 1);
    b->slots = (kv_offload_slot_t *)(b->pg + n);
    b->status = (int *)(b->slots + n);
    *extra_p = b->status + n;
    for (uint32_t i = 0; i < n; i++) {
        b->slots[i] = KV_PAGE_ID_INVALID;
        b->status[i] = KV_STORE_OFF_PENDING;
    }
    b->n = n;
    b->bytes = bytes;
    return b;
}

static void batch_link(kv_store_off_t *o, kv_store_off_batch_t *b)
{
    b->next = o->batches;
    o->batches = b;
    o->seqs[b->seq].batches++;
    o->in_flight += b->n;
    o->held_bytes += b->bytes;
}

/* 1 if the entry may go to the file. */
static int eligible(const kv_store_t *s, const kv_page_ent_t *ent, uint32_t e)
{
    return !(ent->flags & KV_PAGE_ENT_RESIDENCY) && ent->format != KV_FMT_MERGED &&
           e < KEY_MAX_ENTS && kv_alloc_refcount(s->pool, ent->id) == 1;
}

int kv_store_off_write_seq(kv_store_t *s, kv_seq_id_t seq, uint32_t *n_out)
{
    kv_store_off_t *o = s->off;
    uint32_t n = 0;
    *n_out = 0;
    for (uint32_t li = 0; li < n_lists(s); li++) {
        const kv_page_list_t *l = list_of(s, seq, li);
        for (uint32_t e = 0; e < l->n_ents; e++)
            n += (uint32_t)eligible(s, &l->ents[e], e);
    }
    if (n == 0)
        return 0;
    kv_offload_wpage_t *w;
    kv_store_off_batch_t *b = batch_new(n, (size_t)n * sizeof *w, (void **)&w);
    if (!b)
        return KV_ENOMEM;
    b->seq = seq;
    b->write = 1;
    uint32_t i = 0;
    for (uint32_t li = 0; li < n_lists(s); li++) {
        const kv_page_list_t *l = list_of(s, seq, li);
        for (uint32_t e = 0; e < l->n_ents; e++) {
            const kv_page_ent_t *ent = &l->ents[e];
            if (!eligible(s, ent, e))
                continue;
            b->pg[i] = (kv_store_off_pg_t){.li = li, .e = e, .page = ent->id,
                                           .gen = o->next_gen + i};
            w[i] = (kv_offload_wpage_t){.key = kv_store_off_key(s, seq, li, e),
                                        .generation = b->pg[i].gen,
                                        .data = kv_page_addr(s->pt, ent->id),
                                        .bytes = s->cfg.page_bytes,
                                        .tokens = ent->n_tokens,
                                        .format = ent->format};
            i++;
        }
    }
    assert(i == n);
    int rc = kv_offload_write_submit(o->file, w, n, b->slots, b->status, &b->ticket);
    if (rc == -ENOSPC && kv_pfx_file_room(s, n)) /* the prefix cache's copies yield */
        rc = kv_offload_write_submit(o->file, w, n, b->slots, b->status, &b->ticket);
    if (rc) {
        kv_mem_free(b, b->bytes);
        return rc;
    }
    o->next_gen += n;
    for (i = 0; i < n; i++)
        kv_page_ent_set_residency(s->pt, seq, b->pg[i].li, b->pg[i].e, b->pg[i].page,
                                  KV_PAGE_ENT_PAGING);
    o->seqs[seq].writing += n;
    batch_link(o, b);
    *n_out = n;
    return 0;
}

int kv_store_off_read_seq(kv_store_t *s, kv_seq_id_t seq, uint32_t *n_out)
{
    kv_store_off_t *o = s->off;
    kv_store_off_seq_t *q = &o->seqs[seq];
    uint32_t n = q->on_file;
    *n_out = 0;
    if (n == 0)
        return 0;
    kv_offload_rpage_t *r;
    kv_store_off_batch_t *b = batch_new(n, (size_t)n * (sizeof *r + sizeof(kv_page_id_t)),
                                        (void **)&r);
    if (!b)
        return KV_ENOMEM;
    kv_page_id_t *pages = (kv_page_id_t *)(r + n);
    int rc = kv_alloc_pages(s->pool, n, pages);
    if (rc) {
        kv_mem_free(b, b->bytes);
        return rc;
    }
    b->seq = seq;
    uint32_t i = 0;
    for (uint32_t li = 0; li < n_lists(s) && i < n; li++) {
        const kv_page_list_t *l = list_of(s, seq, li);
        for (uint32_t e = 0; e < l->n_ents; e++) {
            const kv_page_ent_t *ent = &l->ents[e];
            if ((ent->flags & (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING)) !=
                KV_PAGE_ENT_OFFLOADED)
                continue;
            assert(i < n);
            kv_store_off_pg_t *p = &b->pg[i];
            *p = (kv_store_off_pg_t){.li = li, .e = e, .page = pages[i], .slot = ent->id,
                                     .gen = o->slot_gen[kv_alloc_page_index(ent->id)]};
            r[i] = (kv_offload_rpage_t){.slot = ent->id,
                                        .key = kv_store_off_key(s, seq, li, e),
                                        .generation = p->gen,
                                        .data = kv_page_addr(s->pt, pages[i])};
            i++;
        }
    }
    assert(i == n);
    rc = kv_offload_read_submit(o->file, r, n, b->status, &b->ticket);
    if (rc) {
        for (i = 0; i < n; i++)
            kv_alloc_release(s->pool, pages[i]);
        kv_mem_free(b, b->bytes);
        return rc;
    }
    for (i = 0; i < n; i++) {
        const kv_page_list_t *l = list_of(s, seq, b->pg[i].li);
        if (l->ents[b->pg[i].e].flags & KV_PAGE_ENT_LOST) {
            q->lost--;
            o->lost--;
        }
        kv_page_ent_set_residency(s->pt, seq, b->pg[i].li, b->pg[i].e, pages[i],
                                  KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING);
    }
    if (q->lost == 0)
        q->lost_err = 0;
    q->on_file -= n;
    q->reading += n;
    o->on_file -= n;
    kv_store_off_record_free(s, seq); /* no longer wholly on the file */
    batch_link(o, b);
    *n_out = n;
    return 0;
}

/* ---- completions ------------------------------------------------------------ */

static void note_error(kv_store_off_t *o, kv_store_off_seq_t *q, int st)
{
    o->io_errors++;
    if (!q->err)
        q->err = st;
}

/* Apply a reported batch to its entries; unlink and free it (*link -> b). */
static void batch_complete(kv_store_t *s, kv_store_off_batch_t **link)
{
    kv_store_off_t *o = s->off;
    kv_store_off_batch_t *b = *link;
    kv_store_off_seq_t *q = &o->seqs[b->seq];
    for (uint32_t i = 0; i < b->n; i++) {
        const kv_store_off_pg_t *p = &b->pg[i];
        int st = b->status[i];
        assert(st <= 0);
        if (b->write) {
            q->writing--;
            if (st == 0) {
                assert(b->slots[i] != KV_PAGE_ID_INVALID);
                o->slot_gen[kv_alloc_page_index(b->slots[i])] = p->gen;
                kv_page_ent_set_residency(s->pt, b->seq, p->li, p->e, b->slots[i],
                                          KV_PAGE_ENT_OFFLOADED);
                q->on_file++;
                o->on_file++;
                o->pages_out++;
                o->bytes_out += s->cfg.page_bytes;
            } else {
                kv_page_ent_set_residency(s->pt, b->seq, p->li, p->e, p->page, 0);
                note_error(o, q, st);
            }
        } else {
            q->reading--;
            if (st == 0) {
                kv_page_ent_set_residency(s->pt, b->seq, p->li, p->e, p->page, 0);
                int rc = kv_offload_free(o->file, &p->slot, 1);
                assert(rc == 0);
                (void)rc;
                o->pages_in++;
                o->bytes_in += s->cfg.page_bytes;
            } else {
                kv_page_ent_set_residency(s->pt, b->seq, p->li, p->e, p->slot,
                                          KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_LOST);
                q->on_file++;
                q->lost++;
                q->lost_err = st;
                o->on_file++;
                o->lost++;
                note_error(o, q, st);
            }
        }
    }
    q->batches--;
    o->in_flight -= b->n;
    o->held_bytes -= b->bytes;
    *link = b->next;
    kv_mem_free(b, b->bytes);
}

/* Poll or wait for one batch. 1: reported (statuses filled), 0: still
 * running, < 0: the file's own error (the batch stays in flight). */
static int batch_reported(kv_store_off_t *o, kv_store_off_batch_t *b, int block)
{
    int rc = block ? kv_offload_wait(o->file, b->ticket) : kv_offload_poll(o->file, b->ticket);
    if (!block && rc == 1)
        return 0;
    for (uint32_t i = 0; i < b->n; i++)
        if (b->status[i] == KV_STORE_OFF_PENDING)
            return rc < 0 ? rc : KV_EIO;
    return 1;
}

int kv_store_off_settle(kv_store_t *s, kv_seq_id_t seq, int writes, int block)
{
    kv_store_off_t *o = s->off;
    int err = 0;
    kv_store_off_batch_t **link = &o->batches;
    while (*link) {
        kv_store_off_batch_t *b = *link;
        if ((seq != KV_STORE_OFF_ALL && b->seq != seq) || (b->write && !writes)) {
            link = &b->next;
            continue;
        }
        int r = batch_reported(o, b, block);
        if (r == 1) {
            batch_complete(s, link);
            continue;
        }
        if (r < 0 && !err)
            err = r;
        link = &b->next;
    }
    return err;
}

int kv_store_off_page_in(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_seq_t *q = &s->off->seqs[seq];
    const int err0 = q->err; /* a failure here is the caller's to report */
    int rc = kv_store_off_settle(s, seq, 0, 1);
    uint32_t n;
    if (rc == 0 && q->on_file)
        rc = kv_store_off_read_seq(s, seq, &n);
    if (rc == 0)
        rc = kv_store_off_settle(s, seq, 0, 1);
    if (rc == 0 && (q->on_file || q->reading))
        rc = q->lost_err ? q->lost_err : KV_EIO;
    q->err = err0;
    return rc;
}

void kv_store_off_abandon(kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    while (o->batches) {
        kv_store_off_batch_t *b = o->batches;
        for (uint32_t i = 0; i < b->n; i++)
            b->status[i] = KV_EIO; /* the slots went with the file */
        if (b->write)
            for (uint32_t i = 0; i < b->n; i++)
                b->slots[i] = KV_PAGE_ID_INVALID;
        batch_complete(s, &o->batches);
    }
}
