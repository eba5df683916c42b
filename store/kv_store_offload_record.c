/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload_record.c — sequence records: what a page file needs
 * besides its pages to give a sequence back after a restart
 * (kv_store_offload_sync, and restore at kv_store_create with
 * KV_OFFLOAD_OPEN).
 *
 * A record is written for a sequence whose pages are all on the file (at
 * least one, no I/O in flight) and that has none yet; it stays valid while
 * the sequence stays wholly on the file (the sequence cannot change then:
 * every mutating call needs it resident) and is freed when a page-in
 * starts or the sequence is freed. Its bytes: the sequence record "KVSQ"
 * (util/kv_rec.h), cut into page_bytes chunks, each one page of the file
 * with key KV_REC_SEQ_KEY_BIT | seq << 24 | chunk, format tag
 * KV_REC_CHUNK_FORMAT, and the record's generation (all chunks alike); each
 * chunk has its slot's crc32c like any page. Entry e of list (layer, head)
 * is the page with key kv_offload_key(seq, layer, head, e) and the
 * generation above.
 *
 * Restore: the file's held slots are listed (sorted by key, generation);
 * for each sequence with record chunks the newest generation whose chunks
 * all read back and parse, and whose pages are all there, wins; the
 * sequence is installed under its old id with every entry OFFLOADED
 * (kv_page_seq_adopt). Every slot no restored sequence claims (orphaned
 * pages, stale records) is then freed. A sequence that cannot be restored
 * counts in seqs_dropped. A record for another model shape or beyond
 * max_seqs fails the create (KV_EINVAL, KV_ELIMIT): the file is left as
 * it was.
 *
 * Ownership: record slot arrays (seqs[].rec) belong to the store; the
 * encode buffer and restore scratch are freed before return.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_store_int.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"
#include "formats/kv_format.h"

#define REC_TRIES   3   /* reads of a record chunk before giving up */
#define REC_WAITS   1000 /* waits for a record write to be reported  */

static uint64_t rec_key(kv_seq_id_t seq, uint32_t chunk)
{
    return KV_REC_SEQ_KEY_BIT | ((uint64_t)seq << 24) | chunk;
}

static const kv_page_list_t *list_of(const kv_store_t *s, kv_seq_id_t seq, uint32_t li)
{
    return kv_page_list_get(s->pt, seq, li / s->cfg.n_kv_heads, li % s->cfg.n_kv_heads);
}

/* ---- write ------------------------------------------------------------------ */

static uint64_t rec_bytes(const kv_store_t *s, kv_seq_id_t seq, uint64_t *ents)
{
    uint64_t n = KV_REC_SEQ_HDR_BYTES;
    *ents = 0;
    for (uint32_t li = 0; li < s->cfg.n_layers * s->cfg.n_kv_heads; li++) {
        const kv_page_list_t *l = list_of(s, seq, li);
        n += KV_REC_SEQ_LIST_BYTES + (uint64_t)l->n_ents * KV_REC_SEQ_ENT_BYTES +
             (l->pos ? 4ull * l->n_tokens : 0);
        *ents += l->n_ents;
    }
    return n;
}

void kv_store_off_rec_head_put(uint8_t *p, uint32_t magic, uint32_t version, uint32_t id,
                               const kv_config_t *c, uint32_t chunks, uint64_t bytes)
{
    kv_le_put32(p, magic);
    kv_le_put32(p + 4, version);
    kv_le_put32(p + 8, id);
    kv_le_put32(p + 12, c->n_layers);
    kv_le_put32(p + 16, c->n_kv_heads);
    kv_le_put32(p + 20, c->head_dim);
    kv_le_put32(p + 24, c->page_bytes);
    kv_le_put32(p + 28, chunks);
    kv_le_put64(p + 32, bytes);
}

int kv_store_off_rec_head_check(const uint8_t *p, uint32_t magic, uint32_t version,
                                uint32_t id, const kv_config_t *c)
{
    if (kv_le_get32(p) != magic || kv_le_get32(p + 4) != version ||
        kv_le_get32(p + 8) != id)
        return KV_ECORRUPT;
    if (kv_le_get32(p + 12) != c->n_layers || kv_le_get32(p + 16) != c->n_kv_heads ||
        kv_le_get32(p + 20) != c->head_dim || kv_le_get32(p + 24) != c->page_bytes)
        return KV_EINVAL;
    return 0;
}

static void rec_encode(const kv_store_t *s, kv_seq_id_t seq, uint8_t *p, uint64_t bytes,
                       uint32_t chunks)
{
    const kv_config_t *c = &s->cfg;
    const kv_store_off_t *o = s->off;
    memset(p, 0, KV_REC_SEQ_HDR_BYTES);
    kv_store_off_rec_head_put(p, KV_REC_SEQ_MAGIC, KV_REC_SEQ_VERSION, seq, c, chunks, bytes);
    p += KV_REC_SEQ_HDR_BYTES;
    for (uint32_t li = 0; li < c->n_layers * c->n_kv_heads; li++) {
        const kv_page_list_t *l = list_of(s, seq, li);
        kv_le_put32(p, l->n_ents);
        kv_le_put32(p + 4, l->n_tokens);
        kv_le_put32(p + 8, l->target);
        kv_le_put32(p + 12, l->pos && l->n_tokens);
        p += KV_REC_SEQ_LIST_BYTES;
        for (uint32_t e = 0; e < l->n_ents; e++, p += KV_REC_SEQ_ENT_BYTES) {
            const kv_page_ent_t *ent = &l->ents[e];
            kv_le_put64(p, o->slot_gen[kv_alloc_page_index(ent->id)]);
            kv_le_put16(p + 8, ent->n_tokens);
            p[10] = ent->format;
            p[11] = (uint8_t)(ent->flags & KV_PAGE_ENT_SHAPE);
            kv_le_put32(p + 12, 0);
        }
        for (uint32_t t = 0; l->pos && t < l->n_tokens; t++, p += 4)
            kv_le_put32(p, (uint32_t)l->pos[t]);
    }
}

/* Write seq's record (the caller checked it is wholly on the file). */
static int record_write(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_t *o = s->off;
    const uint32_t pb = s->cfg.page_bytes;
    uint64_t n_ents, bytes = rec_bytes(s, seq, &n_ents);
    uint64_t chunks64 = (bytes + pb - 1) / pb;
    if (chunks64 >= (1u << 24))
        return KV_ELIMIT;
    uint32_t n = (uint32_t)chunks64;
    size_t buf_n = (size_t)n * pb, arr_n = (size_t)n * sizeof(kv_offload_slot_t);
    size_t aux_n = (size_t)n * (sizeof(kv_offload_wpage_t) + sizeof(int));
    uint8_t *buf = kv_mem_alloc(buf_n);
    kv_offload_slot_t *slots = kv_mem_calloc(n, sizeof *slots);
    kv_offload_wpage_t *w = kv_mem_alloc(aux_n);
    int rc = KV_ENOMEM;
    if (buf && slots && w) {
        int *status = (int *)(w + n);
        memset(buf + bytes, 0, buf_n - bytes);
        rec_encode(s, seq, buf, bytes, n);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t left = bytes - (uint64_t)i * pb;
            w[i] = (kv_offload_wpage_t){.key = rec_key(seq, i), .generation = o->next_gen,
                                        .data = buf + (size_t)i * pb,
                                        .bytes = left < pb ? (uint32_t)left : pb,
                                        .format = KV_REC_CHUNK_FORMAT};
            status[i] = KV_STORE_OFF_PENDING;
        }
        kv_offload_ticket_t t;
        rc = kv_offload_write_submit(o->file, w, n, slots, status, &t);
        if (rc == 0) {
            int waits = 0;
            do
                rc = kv_offload_wait(o->file, t);
            while (status[0] == KV_STORE_OFF_PENDING && ++waits < REC_WAITS);
            if (status[0] == KV_STORE_OFF_PENDING)
                return KV_EIO; /* never reported: its memory stays its own */
            o->next_gen++;
            for (uint32_t i = 0; rc && i < n; i++)
                if (slots[i] != KV_PAGE_ID_INVALID)
                    kv_offload_free(o->file, &slots[i], 1);
        }
    }
    kv_mem_free(buf, buf ? buf_n : 0);
    kv_mem_free(w, w ? aux_n : 0);
    if (rc) {
        kv_mem_free(slots, slots ? arr_n : 0);
        return rc;
    }
    kv_store_off_seq_t *q = &o->seqs[seq];
    q->rec = slots;
    q->n_rec = n;
    q->rec_new = 1;
    o->rec_slots += n;
    o->held_bytes += arr_n;
    return 0;
}

int kv_store_off_records_write(kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    int err = 0;
    for (kv_seq_id_t id = 0; id < s->cfg.max_seqs; id++) {
        const kv_store_off_seq_t *q = &o->seqs[id];
        if (!kv_page_seq_live(s->pt, id) || q->n_rec || !q->on_file || q->batches)
            continue;
        uint64_t ents;
        rec_bytes(s, id, &ents);
        if (ents != q->on_file)
            continue; /* not wholly on the file */
        int rc = record_write(s, id);
        if (rc && !err)
            err = rc;
    }
    return err;
}

void kv_store_off_record_free(kv_store_t *s, kv_seq_id_t seq)
{
    kv_store_off_t *o = s->off;
    kv_store_off_seq_t *q = &o->seqs[seq];
    if (!q->rec)
        return;
    if (o->file)
        kv_offload_free(o->file, q->rec, q->n_rec);
    kv_mem_free(q->rec, (size_t)q->n_rec * sizeof *q->rec);
    o->rec_slots -= q->n_rec;
    o->held_bytes -= (size_t)q->n_rec * sizeof *q->rec;
    q->rec = NULL;
    q->n_rec = 0;
    q->rec_new = 0;
}

/* End of a sync: keep (ok) or drop the records it wrote. */
static void records_settle(kv_store_t *s, int ok)
{
    kv_store_off_t *o = s->off;
    for (kv_seq_id_t id = 0; id < s->cfg.max_seqs; id++)
        if (o->seqs[id].rec_new) {
            if (ok)
                o->seqs[id].rec_new = 0;
            else
                kv_store_off_record_free(s, id);
        }
}

int kv_store_offload_sync(kv_store_t *s)
{
    int rc = kv_store_off_enter(s, NULL);
    if (rc)
        return rc;
    kv_store_off_t *o = s->off;
    rc = kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1);
    int wrc = kv_store_off_records_write(s);
    kv_pfx_file_sync(s); /* the prefix cache's host nodes (best effort) */
    if (wrc == 0)
        wrc = kv_offload_sync(o->file);
    records_settle(s, wrc == 0); /* all or nothing */
    pthread_mutex_unlock(&o->lock);
    return wrc ? wrc : rc;
}

/* ---- restore ----------------------------------------------------------------- */

typedef struct restore {
    kv_offload_entry_t *ents; /* [n] the file's held slots, sorted         */
    uint64_t n;
    uint8_t *claimed;         /* [capacity] by slot index: 1 = restored    */
                              /* sequences own it                          */
    uint8_t *blob;            /* one record being parsed [blob_n]          */
    size_t blob_n;
} restore_t;

/* Index of (key, gen) in the sorted entries, or n (kv_store_int.h). */
uint64_t kv_store_off_rec_find(const kv_offload_entry_t *ents, uint64_t n, uint64_t key,
                               uint64_t gen)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const kv_offload_entry_t *e = &ents[mid];
        if (e->key < key || (e->key == key && e->generation < gen))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ents[lo].key == key && ents[lo].generation == gen ? lo : n;
}

static uint64_t find(const restore_t *r, uint64_t key, uint64_t gen)
{
    return kv_store_off_rec_find(r->ents, r->n, key, gen);
}

int kv_store_off_rec_read(kv_store_t *s, const kv_offload_entry_t *e, uint8_t *dst)
{
    kv_offload_rpage_t q = {.slot = e->slot, .key = e->key, .generation = e->generation,
                            .data = dst};
    int rc = KV_EIO;
    for (int i = 0; i < REC_TRIES && rc; i++) {
        int st = KV_STORE_OFF_PENDING;
        rc = kv_offload_read(s->off->file, &q, 1, &st);
        if (rc == 0 && st != 0)
            rc = KV_EIO;
    }
    return rc;
}

/* Read every chunk of record (seq, gen) into r->blob; *n_chunks. Errors:
 * KV_ECORRUPT (a chunk missing or unreadable, or not a record of seq: try
 * another generation), KV_EINVAL (a record of another model shape),
 * KV_ENOMEM. */
static int blob_read(kv_store_t *s, restore_t *r, kv_seq_id_t seq, uint64_t gen,
                     uint32_t *n_chunks)
{
    const kv_config_t *c = &s->cfg;
    const uint32_t pb = c->page_bytes;
    uint8_t *hdr = kv_mem_alloc(pb);
    if (!hdr)
        return KV_ENOMEM;
    uint64_t at = find(r, rec_key(seq, 0), gen);
    int rc = at == r->n || kv_store_off_rec_read(s, &r->ents[at], hdr) ? KV_ECORRUPT : 0;
    if (rc == 0 && r->ents[at].bytes < KV_REC_SEQ_HDR_BYTES)
        rc = KV_ECORRUPT;
    if (rc == 0)
        rc = kv_store_off_rec_head_check(hdr, KV_REC_SEQ_MAGIC, KV_REC_SEQ_VERSION, seq, c);
    uint32_t n = rc ? 0 : kv_le_get32(hdr + 28);
    uint64_t bytes = rc ? 0 : kv_le_get64(hdr + 32);
    if (rc == 0 && (n == 0 || n >= (1u << 24) || bytes <= (uint64_t)(n - 1) * pb ||
                    bytes > (uint64_t)n * pb))
        rc = KV_ECORRUPT;
    if (rc == 0) {
        r->blob_n = (size_t)n * pb;
        r->blob = kv_mem_alloc(r->blob_n);
        if (!r->blob)
            rc = KV_ENOMEM;
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        uint64_t k = i ? find(r, rec_key(seq, i), gen) : at;
        uint64_t left = bytes - (uint64_t)i * pb;
        if (k == r->n || r->ents[k].bytes != (left < pb ? left : pb) ||
            r->ents[k].format != KV_REC_CHUNK_FORMAT)
            rc = KV_ECORRUPT;
        else if (i == 0)
            memcpy(r->blob, hdr, pb);
        else if (kv_store_off_rec_read(s, &r->ents[k], r->blob + (size_t)i * pb))
            rc = KV_ECORRUPT;
    }
    kv_mem_free(hdr, pb);
    *n_chunks = n;
    return rc;
}

static void lists_free(kv_page_list_t *lists, uint32_t n)
{
    for (uint32_t i = 0; lists && i < n; i++) {
        kv_mem_free(lists[i].ents, (size_t)lists[i].cap_ents * sizeof *lists[i].ents);
        kv_mem_free(lists[i].pos, (size_t)lists[i].cap_pos * sizeof *lists[i].pos);
    }
    kv_mem_free(lists, (size_t)n * sizeof *lists);
}

/* 1 if a page of format fmt with these shape flags may hold `tokens`. */
int kv_store_off_page_ok(const kv_page_table_t *pt, uint32_t fmt, uint32_t flags,
                         uint32_t tokens)
{
    const kv_page_geom_t *g = kv_page_table_geom(pt);
    if ((fmt != KV_FMT_FP16 && fmt != KV_FMT_INT4 && fmt != KV_FMT_INT2) ||
        (flags & ~(uint32_t)KV_PAGE_ENT_SHAPE))
        return 0;
    if (fmt == KV_FMT_FP16 ? (flags & KV_PAGE_ENT_UPPER) != 0 /* RETAINED only */
                           : (flags & KV_PAGE_ENT_RETAINED) != 0 ||
                                 (flags & KV_PAGE_ENT_ROT) >= kv_format_variants(fmt, g))
        return 0;
    uint32_t tpp = kv_format_get(fmt)->tokens_per_page(g);
    return tokens >= 1 && tokens <= tpp && (fmt == KV_FMT_FP16 || tokens % 16 == 0);
}

/* One list at r->blob + *at into l; claims its pages' slots. */
static int list_parse(kv_store_t *s, restore_t *r, kv_seq_id_t seq, uint32_t li,
                      uint64_t total, uint64_t *at, kv_page_list_t *l)
{
    const uint32_t H = s->cfg.n_kv_heads;
    if (*at + KV_REC_SEQ_LIST_BYTES > total)
        return KV_ECORRUPT;
    const uint8_t *p = r->blob + *at;
    uint32_t ne = kv_le_get32(p), nt = kv_le_get32(p + 4);
    uint32_t tg = kv_le_get32(p + 8), hp = kv_le_get32(p + 12);
    *at += KV_REC_SEQ_LIST_BYTES;
    const uint32_t tf = kv_page_target_format(tg);
    if (hp > 1 || (hp && !nt) || (tf != KV_FMT_FP16 && tf != KV_FMT_INT4 && tf != KV_FMT_INT2) ||
        (kv_page_target_variant(tg) &&
         kv_format_variants(tf, kv_page_table_geom(s->pt)) < 2u) ||
        (uint64_t)ne * KV_REC_SEQ_ENT_BYTES + (hp ? 4ull * nt : 0) > total - *at)
        return KV_ECORRUPT;
    l->target = tg;
    l->n_tokens = nt;
    if (ne && !(l->ents = kv_mem_alloc((size_t)ne * sizeof *l->ents)))
        return KV_ENOMEM;
    l->cap_ents = ne;
    if (hp && !(l->pos = kv_mem_alloc((size_t)nt * sizeof *l->pos)))
        return KV_ENOMEM;
    l->cap_pos = hp ? nt : 0;
    uint64_t sum = 0;
    for (uint32_t e = 0; e < ne; e++, *at += KV_REC_SEQ_ENT_BYTES) {
        p = r->blob + *at;
        uint64_t gen = kv_le_get64(p);
        uint32_t tok = kv_le_get16(p + 8), fmt = p[10], fl = p[11];
        uint64_t k = find(r, kv_offload_key(seq, li / H, li % H, e), gen);
        if (!kv_store_off_page_ok(s->pt, fmt, fl, tok) || k == r->n ||
            r->ents[k].format != fmt || r->ents[k].tokens != tok ||
            r->ents[k].bytes != s->cfg.page_bytes)
            return KV_ECORRUPT;
        uint32_t idx = kv_alloc_page_index(r->ents[k].slot);
        if (r->claimed[idx])
            return KV_ECORRUPT;
        r->claimed[idx] = 1;
        s->off->slot_gen[idx] = gen;
        l->ents[l->n_ents++] = (kv_page_ent_t){.id = r->ents[k].slot, .format = (uint8_t)fmt,
                                               .flags = (uint8_t)(fl | KV_PAGE_ENT_OFFLOADED),
                                               .n_tokens = (uint16_t)tok};
        l->n_busy++;
        sum += tok;
    }
    for (uint32_t t = 0; hp && t < nt; t++, *at += 4)
        l->pos[t] = (int32_t)kv_le_get32(r->blob + *at);
    if (hp)
        kv_page_list_pos_rescan(l);
    return sum == nt ? 0 : KV_ECORRUPT;
}

/* Parse r->blob into lists, claiming every page's slot; on error nothing
 * stays claimed. Errors: KV_ECORRUPT, KV_ENOMEM. */
static int blob_parse(kv_store_t *s, restore_t *r, kv_seq_id_t seq,
                      kv_page_list_t **out, uint64_t *n_pages)
{
    const uint32_t NL = s->cfg.n_layers * s->cfg.n_kv_heads;
    const uint64_t total = kv_le_get64(r->blob + 32);
    kv_page_list_t *lists = kv_mem_calloc(NL, sizeof *lists);
    if (!lists)
        return KV_ENOMEM;
    uint64_t at = KV_REC_SEQ_HDR_BYTES, pages = 0;
    int rc = 0;
    for (uint32_t li = 0; li < NL && rc == 0; li++) {
        rc = list_parse(s, r, seq, li, total, &at, &lists[li]);
        pages += lists[li].n_ents;
    }
    if (rc == 0 && (at != total || pages == 0))
        rc = KV_ECORRUPT;
    if (rc) {
        for (uint32_t li = 0; li < NL; li++)
            for (uint32_t e = 0; e < lists[li].n_ents; e++)
                r->claimed[kv_alloc_page_index(lists[li].ents[e].id)] = 0;
        lists_free(lists, NL);
        return rc;
    }
    *out = lists;
    *n_pages = pages;
    return 0;
}

/* Restore record (seq, gen): 0, or KV_ECORRUPT (not restorable from this
 * record; nothing claimed), KV_EINVAL, KV_ENOMEM. */
static int restore_one(kv_store_t *s, restore_t *r, kv_seq_id_t seq, uint64_t gen)
{
    kv_store_off_t *o = s->off;
    const uint32_t NL = s->cfg.n_layers * s->cfg.n_kv_heads;
    uint32_t chunks = 0;
    kv_page_list_t *lists = NULL;
    uint64_t pages = 0;
    int rc = blob_read(s, r, seq, gen, &chunks);
    if (rc == 0)
        rc = blob_parse(s, r, seq, &lists, &pages);
    kv_mem_free(r->blob, r->blob ? r->blob_n : 0);
    r->blob = NULL;
    if (rc)
        return rc;
    size_t arr_n = (size_t)chunks * sizeof(kv_offload_slot_t);
    kv_offload_slot_t *rec = kv_mem_alloc(arr_n);
    if (rec)
        rc = kv_page_seq_adopt(s->pt, seq, lists);
    if (!rec || rc) {
        for (uint32_t li = 0; li < NL; li++)
            for (uint32_t e = 0; e < lists[li].n_ents; e++)
                r->claimed[kv_alloc_page_index(lists[li].ents[e].id)] = 0;
        lists_free(lists, NL);
        kv_mem_free(rec, rec ? arr_n : 0);
        return rec ? KV_ECORRUPT : KV_ENOMEM;
    }
    for (uint32_t i = 0; i < chunks; i++) {
        uint64_t k = find(r, rec_key(seq, i), gen);
        r->claimed[kv_alloc_page_index(r->ents[k].slot)] = 1;
        rec[i] = r->ents[k].slot;
    }
    kv_store_off_seq_t *q = &o->seqs[seq];
    q->on_file = (uint32_t)pages;
    q->rec = rec;
    q->n_rec = chunks;
    o->on_file += pages;
    o->rec_slots += chunks;
    o->held_bytes += arr_n;
    kv_store_touch(s, seq);
    return 0;
}

/* The records of one sequence are r->ents[i0, i1) (sorted by chunk, then
 * generation): try its generations newest first. */
static int restore_seq(kv_store_t *s, restore_t *r, uint64_t i0, uint64_t i1)
{
    kv_seq_id_t seq = (kv_seq_id_t)((r->ents[i0].key >> 24) & 0xFFFFFFu);
    if (seq >= s->cfg.max_seqs)
        return KV_ELIMIT;
    uint64_t c0 = i0; /* chunk 0 entries: [i0, c0) */
    while (c0 < i1 && r->ents[c0].key == rec_key(seq, 0))
        c0++;
    for (uint64_t k = c0; k-- > i0;) {
        if (k + 1 < c0 && r->ents[k].generation == r->ents[k + 1].generation)
            continue;
        int rc = restore_one(s, r, seq, r->ents[k].generation);
        if (rc != KV_ECORRUPT)
            return rc;
    }
    s->off->seqs_dropped++;
    return 0;
}

int kv_store_off_restore(kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    restore_t r = {0};
    int rc = kv_offload_list(o->file, NULL, 0, &r.n);
    if (rc == 0 && r.n && !(r.ents = kv_mem_alloc(r.n * sizeof *r.ents)))
        rc = KV_ENOMEM;
    uint64_t n = r.n;
    if (rc == 0 && n)
        rc = kv_offload_list(o->file, r.ents, n, &n);
    if (rc == 0 && !(r.claimed = kv_mem_calloc(o->capacity, 1)))
        rc = KV_ENOMEM;
    for (uint64_t i = 0; rc == 0 && i < r.n; i++)
        if (r.ents[i].generation >= o->next_gen)
            o->next_gen = r.ents[i].generation + 1;
    uint64_t i = 0;
    while (rc == 0 && i < r.n && !(r.ents[i].key & KV_REC_SEQ_KEY_BIT))
        i++;
    while (rc == 0 && i < r.n && !kv_pfx_file_key(r.ents[i].key)) {
        /* records sort after every page, the prefix cache's keys last */
        uint64_t j = i + 1;
        while (j < r.n && (r.ents[j].key >> 24) == (r.ents[i].key >> 24))
            j++;
        rc = restore_seq(s, &r, i, j);
        i = j;
    }
    if (rc == 0)
        rc = kv_pfx_file_restore(s, r.ents, r.n, r.claimed);
    for (uint64_t k = 0; rc == 0 && k < r.n; k++) /* orphans, stale records */
        if (!r.claimed[kv_alloc_page_index(r.ents[k].slot)])
            kv_offload_free(o->file, &r.ents[k].slot, 1);
    kv_mem_free(r.claimed, r.claimed ? o->capacity : 0);
    kv_mem_free(r.ents, r.ents ? r.n * sizeof *r.ents : 0);
    return rc;
}
