/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload.c — the page-file tier's life inside a store: config
 * fields, create/open of the file at kv_store_create (and restore with
 * KV_OFFLOAD_OPEN), teardown at kv_store_destroy (finish I/O, persist,
 * close), statistics, the invariant check, kv_store_seqs.
 *
 * Invariants: s->off == NULL iff cfg.offload_path == NULL; with it,
 * cfg.offload_path points to off->path. The per-sequence counters and sums
 * follow the entries (kv_store_int.h); kv_store_off_check verifies them
 * against the page table and the file.
 *
 * Ownership: the store owns off, its arrays, its batches and the file
 * object; the file on disk outlives the store.
 */
#include <stdio.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_store_int.h"

#define OFF_DEFAULT_QD   64u
#define OFF_DEFAULT_HIGH 900u
#define OFF_DEFAULT_LOW  750u
#define OFF_FLAGS (KV_OFFLOAD_WAIT | KV_OFFLOAD_OPEN | KV_OFFLOAD_PREAD)
#define OFF_SETTLE_TRIES 1000 /* progress errors tolerated at destroy */
#define OFF_FAULT_PPM_MAX 1000000u /* offload_fault_ppm: every I/O at most */

/* kv_config_t.offload_fault_ppm split evenly over the fault kinds (the
 * first ppm % KV_OFFLOAD_FAULT_COUNT kinds get one more: the sum is ppm). */
static kv_offload_fault_t off_fault(const kv_config_t *c)
{
    kv_offload_fault_t f = {.seed = c->offload_fault_seed};
    for (uint32_t k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        f.ppm[k] = c->offload_fault_ppm / KV_OFFLOAD_FAULT_COUNT +
                   (k < c->offload_fault_ppm % KV_OFFLOAD_FAULT_COUNT);
    return f;
}

int kv_store_off_resolve(kv_config_t *c)
{
    if (!c->offload_path)
        return c->offload_pages || c->offload_qd || c->offload_high ||
                       c->offload_low || c->offload_flags || c->offload_fault_ppm ||
                       c->offload_fault_seed
                   ? KV_EINVAL
                   : 0;
    if (!*c->offload_path || (c->offload_flags & ~OFF_FLAGS))
        return KV_EINVAL;
    if (c->offload_fault_ppm > OFF_FAULT_PPM_MAX)
        return KV_ERANGE;
    if (!(c->offload_flags & KV_OFFLOAD_OPEN) &&
        (c->offload_pages == 0 || c->offload_pages > KV_ALLOC_MAX_PAGES))
        return KV_ERANGE;
    if (c->offload_qd > KV_OFFLOAD_MAX_QD)
        return KV_ERANGE;
    if (c->offload_qd == 0)
        c->offload_qd = OFF_DEFAULT_QD;
    if (c->offload_high == 0)
        c->offload_high = OFF_DEFAULT_HIGH;
    if (c->offload_low == 0)
        c->offload_low = c->offload_high > OFF_DEFAULT_LOW ? OFF_DEFAULT_LOW
                                                           : c->offload_high / 2;
    if (c->offload_high > 1000 || c->offload_low >= c->offload_high)
        return KV_ERANGE;
    return 0;
}

int kv_store_off_init(kv_store_t *s)
{
    const kv_config_t *c = &s->cfg;
    if (!c->offload_path)
        return 0;
    kv_store_off_t *o = kv_mem_calloc(1, sizeof *o);
    if (!o)
        return KV_ENOMEM;
    pthread_mutex_init(&o->lock, NULL);
    o->next_gen = 1;
    s->off = o;
    o->path_bytes = strlen(c->offload_path) + 1;
    o->path = kv_mem_alloc(o->path_bytes);
    if (!o->path)
        return KV_ENOMEM; /* kv_store_destroy -> fini cleans up */
    memcpy(o->path, c->offload_path, o->path_bytes);
    s->cfg.offload_path = o->path;

    kv_offload_config_t oc = kv_offload_config_default();
    oc.page_bytes = c->page_bytes;
    oc.capacity = c->offload_pages;
    oc.queue_depth = c->offload_qd;
    oc.ioq = (c->offload_flags & KV_OFFLOAD_PREAD) ? KV_OFFLOAD_IOQ_PREAD
                                                      : KV_OFFLOAD_IOQ_AUTO;
    oc.fault = off_fault(c);
    if (c->offload_fault_ppm)
        oc.max_io_bytes = 1; /* one page per I/O: every page meets the shim */
    int rc = (c->offload_flags & KV_OFFLOAD_OPEN) ? kv_offload_open(o->path, &oc, &o->file)
                                                  : kv_offload_create(o->path, &oc, &o->file);
    if (rc)
        return rc;
    kv_offload_stats_t st;
    kv_offload_stats(o->file, &st);
    o->capacity = (uint32_t)st.capacity;
    o->slot_gen = kv_mem_calloc(o->capacity, sizeof *o->slot_gen);
    o->seqs = kv_mem_calloc(c->max_seqs, sizeof *o->seqs);
    if (!o->slot_gen || !o->seqs)
        return KV_ENOMEM;
    if ((c->offload_flags & KV_OFFLOAD_OPEN) && (rc = kv_store_off_restore(s)))
        return rc;
    o->open_ok = 1;
    return 0;
}

/* Every entry of seq that names a slot (on the file, lost or not) gives it
 * back; counters follow. Entries keep their (now meaningless) ids: the
 * caller drops the sequence next. */
static void seq_slots_free(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_t *o = s->off;
    kv_store_off_seq_t *q = &o->seqs[seq];
    uint32_t n_lists = s->cfg.n_layers * s->cfg.n_kv_heads;
    for (uint32_t li = 0; li < n_lists && q->on_file; li++) {
        const kv_page_list_t *l =
            kv_page_list_get(s->pt, seq, li / s->cfg.n_kv_heads, li % s->cfg.n_kv_heads);
        for (uint32_t e = 0; e < l->n_ents; e++) {
            const kv_page_ent_t *ent = &l->ents[e];
            if ((ent->flags & (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING)) ==
                KV_PAGE_ENT_OFFLOADED) {
                int rc = kv_offload_free(o->file, &ent->id, 1);
                (void)rc; /* held by construction (kv_store_off_check) */
                q->on_file--;
                o->on_file--;
                if (ent->flags & KV_PAGE_ENT_LOST) {
                    q->lost--;
                    o->lost--;
                }
            }
        }
    }
    kv_store_off_record_free(s, seq);
}

int kv_store_off_seq_drop(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_t *o = s->off;
    if (!o || !kv_page_seq_live(s->pt, seq))
        return 0;
    pthread_mutex_lock(&o->lock);
    int rc = kv_store_off_settle(s, seq, 1, 1);
    if (rc == 0) {
        seq_slots_free(s, seq);
        memset(&o->seqs[seq], 0, sizeof o->seqs[seq]);
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

void kv_store_off_fini(kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    if (!o)
        return;
    pthread_mutex_lock(&o->lock);
    if (o->file) {
        for (int i = 0; o->batches && i < OFF_SETTLE_TRIES; i++)
            kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1);
        if (o->open_ok && !o->batches) {
            /* persist what is wholly on the file (and the prefix cache's
             * host nodes); the rest is not restorable */
            kv_pfx_file_sync(s);
            kv_store_off_records_write(s);
            for (kv_seq_id_t id = 0; id < s->cfg.max_seqs; id++)
                if (kv_page_seq_live(s->pt, id) && o->seqs[id].n_rec == 0)
                    seq_slots_free(s, id);
            kv_offload_close(o->file);
        } else {
            kv_offload_crash(o->file); /* leave the file as it was on disk */
        }
        o->file = NULL;
        kv_store_off_abandon(s); /* only batches the file gave up on */
    }
    for (kv_seq_id_t id = 0; o->seqs && id < s->cfg.max_seqs; id++)
        kv_store_off_record_free(s, id);
    kv_mem_free(o->slot_gen, (size_t)o->capacity * sizeof *o->slot_gen);
    kv_mem_free(o->seqs, o->seqs ? (size_t)s->cfg.max_seqs * sizeof *o->seqs : 0);
    kv_mem_free(o->path, o->path ? o->path_bytes : 0);
    pthread_mutex_unlock(&o->lock);
    pthread_mutex_destroy(&o->lock);
    kv_mem_free(o, sizeof *o);
    s->off = NULL;
}

size_t kv_store_off_meta_bytes(const kv_store_t *s)
{
    const kv_store_off_t *o = s->off;
    if (!o)
        return 0;
    return sizeof *o + o->path_bytes + (size_t)o->capacity * sizeof *o->slot_gen +
           (size_t)s->cfg.max_seqs * sizeof *o->seqs + (size_t)o->held_bytes;
}

void kv_store_off_stats(const kv_store_t *s, kv_stats_t *out)
{
    kv_store_off_t *o = s->off;
    if (!o)
        return;
    kv_offload_stats_t st;
    kv_offload_stats(o->file, &st);
    pthread_mutex_lock(&o->lock);
    out->offload_slots = st.capacity;
    out->offload_slots_used = st.slots_used;
    out->pages_on_file = o->on_file;
    out->pages_in_flight = o->in_flight;
    out->pages_lost = o->lost;
    out->pages_out = o->pages_out;
    out->pages_in = o->pages_in;
    out->bytes_out = o->bytes_out;
    out->bytes_in = o->bytes_in;
    out->io_errors = o->io_errors;
    out->seqs_dropped = o->seqs_dropped;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        out->offload_faults += st.faults[k];
    pthread_mutex_unlock(&o->lock);
}

/* ---- the check ------------------------------------------------------------ */

#define OFF_FAIL(...)                                                  \
    do {                                                               \
        fprintf(stderr, "kv_store_check (offload): " __VA_ARGS__);     \
        fputc('\n', stderr);                                           \
        return KV_ECORRUPT;                                            \
    } while (0)

/* One sequence's entries against its counters and the file. */
static int check_seq(const kv_store_t *s, kv_seq_id_t seq, kv_store_off_seq_t *sum)
{
    kv_store_off_t *o = s->off;
    const uint32_t H = s->cfg.n_kv_heads;
    kv_store_off_seq_t c = {0};
    for (uint32_t li = 0; li < s->cfg.n_layers * H; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        for (uint32_t e = 0; e < l->n_ents; e++) {
            const kv_page_ent_t *ent = &l->ents[e];
            uint32_t r = ent->flags & KV_PAGE_ENT_RESIDENCY;
            c.writing += r == KV_PAGE_ENT_PAGING;
            c.reading += r == (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING);
            c.lost += (r & KV_PAGE_ENT_LOST) != 0;
            if ((r & (KV_PAGE_ENT_OFFLOADED | KV_PAGE_ENT_PAGING)) != KV_PAGE_ENT_OFFLOADED)
                continue;
            c.on_file++;
            kv_offload_entry_t fe;
            if (kv_offload_info(o->file, ent->id, &fe) != 0 ||
                fe.key != kv_store_off_key(s, seq, li, e) ||
                fe.generation != o->slot_gen[kv_alloc_page_index(ent->id)] ||
                fe.format != ent->format || fe.tokens != ent->n_tokens)
                OFF_FAIL("seq %u list %u ent %u: slot %#x does not hold its page", seq,
                         li, e, ent->id);
        }
    }
    const kv_store_off_seq_t *q = &o->seqs[seq];
    if (c.on_file != q->on_file || c.lost != q->lost || c.writing != q->writing ||
        c.reading != q->reading)
        OFF_FAIL("seq %u: on_file/lost/writing/reading %u/%u/%u/%u, counted %u/%u/%u/%u",
                 seq, q->on_file, q->lost, q->writing, q->reading, c.on_file, c.lost,
                 c.writing, c.reading);
    for (uint32_t i = 0; i < q->n_rec; i++) {
        kv_offload_entry_t fe;
        if (kv_offload_info(o->file, q->rec[i], &fe) != 0 || !(fe.key >> 63) ||
            ((fe.key >> 24) & 0xFFFFFFu) != seq)
            OFF_FAIL("seq %u: record slot %#x not held", seq, q->rec[i]);
    }
    if (q->n_rec && c.on_file == 0)
        OFF_FAIL("seq %u: a record but no page on the file", seq);
    sum->on_file += c.on_file;
    sum->lost += c.lost;
    sum->writing += c.writing + c.reading;
    sum->n_rec += q->n_rec;
    return 0;
}

int kv_store_off_check(const kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    if (!o)
        return 0;
    pthread_mutex_lock(&o->lock);
    int rc = 0;
    kv_store_off_seq_t sum = {0};
    for (kv_seq_id_t id = 0; id < s->cfg.max_seqs && rc == 0; id++) {
        if (kv_page_seq_live(s->pt, id)) {
            rc = check_seq(s, id, &sum);
        } else if (o->seqs[id].on_file || o->seqs[id].batches || o->seqs[id].n_rec) {
            fprintf(stderr, "kv_store_check (offload): free seq %u has state\n", id);
            rc = KV_ECORRUPT;
        }
    }
    uint64_t in_batches = 0;
    for (const kv_store_off_batch_t *b = o->batches; b; b = b->next)
        in_batches += b->n;
    if (rc == 0 && (sum.on_file != o->on_file || sum.lost != o->lost ||
                    sum.writing != o->in_flight || in_batches != o->in_flight ||
                    sum.n_rec != o->rec_slots)) {
        fprintf(stderr, "kv_store_check (offload): sums differ (on_file %llu/%llu, "
                        "in flight %llu/%llu/%llu)\n",
                (unsigned long long)sum.on_file, (unsigned long long)o->on_file,
                (unsigned long long)sum.writing, (unsigned long long)o->in_flight,
                (unsigned long long)in_batches);
        rc = KV_ECORRUPT;
    }
    if (rc == 0 && !o->batches) { /* no I/O: every held slot is accounted for */
        kv_offload_stats_t st;
        kv_offload_stats(o->file, &st);
        const uint64_t named = o->on_file + o->rec_slots + kv_pfx_file_slots(s);
        if (st.slots_used != named || st.batches_open != 0) {
            fprintf(stderr, "kv_store_check (offload): file holds %llu slots, store "
                            "names %llu\n", (unsigned long long)st.slots_used,
                    (unsigned long long)named);
            rc = KV_ECORRUPT;
        }
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

/* ---- small things ---------------------------------------------------------- */

int kv_store_seqs(const kv_store_t *s, kv_seq_id_t *ids, uint32_t cap, uint32_t *count)
{
    if (!s || !count || (cap && !ids))
        return KV_EINVAL;
    uint32_t n = 0;
    for (kv_seq_id_t id = 0; id < s->cfg.max_seqs; id++)
        if (kv_page_seq_live(s->pt, id)) {
            if (n < cap)
                ids[n] = id;
            n++;
        }
    *count = n;
    return 0;
}

kv_offload_file_t *kv_store_off_file(const kv_store_t *s)
{
    return s && s->off ? s->off->file : NULL;
}

int kv_store_off_set_fault(kv_store_t *s, const kv_offload_fault_t *fault)
{
    if (!s || !s->off)
        return KV_ENOTSUP;
    return kv_offload_set_fault(s->off->file, fault);
}
