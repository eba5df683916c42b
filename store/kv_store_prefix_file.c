/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_file.c — the prefix cache's page-file tier (docs/prefix.md,
 * "The page-file tier"): nodes evicted from the pool are kept on the page
 * file, read back when a match reaches them, and found again after a
 * restart (KV_OFFLOAD_OPEN).
 *
 * A node's copy is its pages plus a record, written in one batch: page e
 * (entries in node order, list by list) under key page_key(id, e) with
 * generation gen + e, and the record's chunks under rec_key(id, c) with
 * generation gen + n_ents. Keys of this tier have bits 63 and 62 set (a
 * sequence's page keys have bit 63 clear, its record keys bits 48..62
 * clear), so the sequence records' restore leaves them to this file. A copy
 * is immutable (a node's KV is a function of its key) and kept until the
 * node goes: a node read back keeps it, so demoting it again costs no I/O.
 *
 * Record: the prefix node record "KVPN" (util/kv_rec.h: its bytes, and the
 * keys of this tier), cut into page_bytes chunks of format tag
 * KV_REC_CHUNK_FORMAT; its first 40 bytes are a sequence record's head
 * (kv_store_off_rec_head_put).
 * Restore checks every field against the store and the file (shape, sizes,
 * each page's slot, key, generation, format and tokens, full unflagged
 * pages of FP16/INT4/INT2, tokens per list) and links a node only under a
 * restored parent ending at its start (nodes are linked by start); a
 * record that fails is not used and its slots become orphans (freed).
 *
 * When: a host node leaves the pool's LRU (kv_store_prefix_evict) with a
 * page file -> demote (write the copy unless it has one, wait, drop the
 * pool references). kv_store_offload_sync and destroy write copies of the
 * host nodes that have none, hottest first, a node's ancestors before it
 * (best effort: a full file stops it; never a copy under a parent without
 * one, which no restore could link). A match
 * that reaches nodes on the file reads them back in one batch (as many as
 * the pool has free pages for: never a refused page) and makes them host
 * nodes; the first that fails (a page's crc, key or generation check, an
 * I/O error) is dropped with its subtree, counted, and the match stops
 * before it: never wrong data. A full file drops the node being demoted
 * (counted); a sequence's page-out that finds the file full first frees
 * host nodes' copies, then the coldest nodes on the file (kv_pfx_file_room).
 *
 * Invariants (kv_pfx_file_check): an on_file node has a copy and its
 * entries' ids are the copy's page slots; every copy's slots are held with
 * its keys and generations; f_slots = slots of all copies; f_nodes = nodes
 * on the file. Nothing here touches a sequence's slots or counters.
 * Ownership: a copy (one kv_mem block, in p->bytes) belongs to its node;
 * batch scratch belongs to the file from submit until it is reported.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "formats/kv_fmt_layout.h"
#include "formats/kv_format.h"
#include "kv_store_int.h"
#include "kv_store_prefix_int.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"

#define PF_MAX_IDX (1u << 23)    /* pages / chunks of one copy, at most    */
#define PF_WAITS   1000 /* waits for a batch to be reported               */
#define PF_WINDOW  16   /* copies in flight at a sync                     */

typedef struct kv_pfx_copy {
    uint32_t id;              /* key id                                    */
    uint32_t n_rec;           /* record chunks                             */
    uint64_t gen;             /* page e: gen + e; record: gen + n_ents      */
    size_t bytes;             /* this kv_mem block                          */
    kv_offload_slot_t *slots; /* [n_ents + n_rec]: pages, then the record   */
} kv_pfx_copy_t;

int kv_pfx_file_key(uint64_t key)
{
    return (key & KV_REC_PFX_KEY_NS) == KV_REC_PFX_KEY_NS;
}

static uint64_t page_key(uint32_t id, uint32_t e)
{
    return KV_REC_PFX_KEY_NS | (uint64_t)id << 24 | e;
}

static uint64_t rec_key(uint32_t id, uint32_t c)
{
    return KV_REC_PFX_KEY_NS | (uint64_t)id << 24 | KV_REC_PFX_KEY_REC | c;
}

static uint32_t n_lists(const kv_store_t *s)
{
    return s->cfg.n_layers * s->cfg.n_kv_heads;
}

static uint64_t rec_bytes(const kv_store_t *s, uint32_t n_ents)
{
    return KV_REC_PFX_HDR_BYTES + KV_REC_PFX_NODE_BYTES +
           (uint64_t)n_lists(s) * KV_REC_PFX_LIST_BYTES + (uint64_t)n_ents * KV_REC_PFX_ENT_BYTES;
}

static kv_pfx_copy_t *copy_alloc(uint32_t n)
{
    size_t bytes = sizeof(kv_pfx_copy_t) + (size_t)n * sizeof(kv_offload_slot_t);
    kv_pfx_copy_t *c = kv_mem_calloc(1, bytes);
    if (c) {
        c->bytes = bytes;
        c->slots = (kv_offload_slot_t *)(c + 1);
    }
    return c;
}

/* ---- write -------------------------------------------------------------------- */

static void rec_encode(const kv_store_t *s, const kv_pfx_node_t *x, const kv_pfx_copy_t *c,
                       uint8_t *p, uint64_t bytes)
{
    const kv_config_t *cf = &s->cfg;
    memset(p, 0, KV_REC_PFX_HDR_BYTES + KV_REC_PFX_NODE_BYTES);
    kv_store_off_rec_head_put(p, KV_REC_PFX_MAGIC, KV_REC_PFX_VERSION, c->id, cf, c->n_rec, bytes);
    kv_le_put64(p + 40, c->gen);
    kv_le_put32(p + 48, x->start);
    kv_le_put32(p + 52, x->end);
    kv_le_put32(p + 56, x->parent != NULL);
    memcpy(p + KV_REC_PFX_HDR_BYTES, x->key.b, 32);
    if (x->parent)
        memcpy(p + KV_REC_PFX_HDR_BYTES + 32, x->parent->key.b, 32);
    p += KV_REC_PFX_HDR_BYTES + KV_REC_PFX_NODE_BYTES;
    for (uint32_t li = 0; li < n_lists(s); li++, p += KV_REC_PFX_LIST_BYTES) {
        const uint32_t m = x->off[li + 1] - x->off[li];
        kv_le_put32(p, m);
        kv_le_put32(p + 4, x->end - x->start);
        kv_le_put32(p + 8, m ? x->ents[x->off[li]].format : 0);
        kv_le_put32(p + 12, 0);
    }
    for (uint32_t e = 0; e < x->n_ents; e++, p += KV_REC_PFX_ENT_BYTES) {
        kv_le_put64(p, c->gen + e);
        kv_le_put16(p + 8, x->ents[e].n_tokens);
        p[10] = x->ents[e].format;
        p[11] = 0;
        kv_le_put32(p + 12, 0);
    }
}

typedef struct pf_pending { /* one copy being written                        */
    kv_pfx_node_t *x;
    kv_pfx_copy_t *c;
    kv_offload_ticket_t t;
    int *status;            /* [n]                                           */
    uint32_t n;             /* pages + record chunks                         */
    void *scratch;          /* record buffer, wpages, status                 */
    size_t scratch_n;
} pf_pending_t;

/* Submit x's copy (off->lock held): 0, -ENOSPC, KV_ENOMEM, KV_ELIMIT... */
static int copy_submit(kv_store_t *s, kv_pfx_node_t *x, pf_pending_t *pd)
{
    kv_store_off_t *o = s->off;
    const uint32_t pb = s->cfg.page_bytes;
    const uint64_t bytes = rec_bytes(s, x->n_ents), chunks = (bytes + pb - 1) / pb;
    if (x->n_ents >= PF_MAX_IDX || chunks >= PF_MAX_IDX)
        return KV_ELIMIT;
    const uint32_t n = x->n_ents + (uint32_t)chunks;
    kv_offload_wpage_t *w;
    memset(pd, 0, sizeof *pd);
    pd->scratch_n = (size_t)chunks * pb + (size_t)n * (sizeof *w + sizeof(int));
    pd->scratch = kv_mem_alloc(pd->scratch_n);
    pd->c = copy_alloc(n);
    if (!pd->scratch || !pd->c) {
        kv_mem_free(pd->scratch, pd->scratch ? pd->scratch_n : 0);
        kv_mem_free(pd->c, pd->c ? pd->c->bytes : 0);
        return KV_ENOMEM;
    }
    uint8_t *buf = pd->scratch;
    w = (kv_offload_wpage_t *)(buf + (size_t)chunks * pb);
    pd->status = (int *)(w + n);
    pd->x = x;
    pd->n = n;
    kv_pfx_copy_t *c = pd->c;
    c->id = s->pfx->f_next_id;
    c->n_rec = (uint32_t)chunks;
    c->gen = o->next_gen;
    memset(buf + bytes, 0, (size_t)(chunks * pb - bytes));
    rec_encode(s, x, c, buf, bytes);
    for (uint32_t e = 0; e < x->n_ents; e++)
        w[e] = (kv_offload_wpage_t){.key = page_key(c->id, e), .generation = c->gen + e,
                                    .data = kv_page_addr(s->pt, x->ents[e].id),
                                    .bytes = pb,
                                    .tokens = x->ents[e].n_tokens,
                                    .format = x->ents[e].format};
    for (uint32_t k = 0; k < chunks; k++) {
        uint64_t left = bytes - (uint64_t)k * pb;
        w[x->n_ents + k] = (kv_offload_wpage_t){.key = rec_key(c->id, k),
                                                .generation = c->gen + x->n_ents,
                                                .data = buf + (size_t)k * pb,
                                                .bytes = left < pb ? (uint32_t)left : pb,
                                                .format = KV_REC_CHUNK_FORMAT};
    }
    for (uint32_t i = 0; i < n; i++)
        pd->status[i] = KV_STORE_OFF_PENDING;
    int rc = kv_offload_write_submit(o->file, w, n, c->slots, pd->status, &pd->t);
    if (rc) {
        kv_mem_free(pd->scratch, pd->scratch_n);
        kv_mem_free(c, c->bytes);
        return rc;
    }
    o->next_gen += (uint64_t)x->n_ents + 1;
    s->pfx->f_next_id++;
    return 0;
}

/* Wait for a batch until every status is reported (bounded). */
static int batch_wait(kv_offload_file_t *f, kv_offload_ticket_t t, const int *status,
                      uint32_t n)
{
    for (int waits = 0; waits < PF_WAITS; waits++) {
        (void)kv_offload_wait(f, t);
        uint32_t i = 0;
        while (i < n && status[i] != KV_STORE_OFF_PENDING)
            i++;
        if (i == n)
            return 0;
    }
    return KV_EIO;
}

/* Finish a submitted copy: attached to its node (0), or undone (error). */
static int copy_finish(kv_store_t *s, pf_pending_t *pd)
{
    kv_store_off_t *o = s->off;
    kv_pfx_t *p = s->pfx;
    kv_pfx_copy_t *c = pd->c;
    if (batch_wait(o->file, pd->t, pd->status, pd->n))
        return KV_EIO; /* never reported: its memory stays the file's */
    int rc = 0;
    for (uint32_t i = 0; i < pd->n && rc == 0; i++)
        rc = pd->status[i];
    if (rc == 0) {
        pd->x->copy = c;
        p->f_slots += pd->n;
        p->f_mem += c->bytes;
        p->f_bytes_out += (uint64_t)pd->x->n_ents * s->cfg.page_bytes;
    } else {
        o->io_errors++;
        for (uint32_t i = 0; i < pd->n; i++)
            if (c->slots[i] != KV_PAGE_ID_INVALID)
                kv_offload_free(o->file, &c->slots[i], 1);
        kv_mem_free(c, c->bytes);
    }
    kv_mem_free(pd->scratch, pd->scratch_n);
    return rc;
}

int kv_pfx_file_demote(kv_store_t *s, kv_pfx_node_t *x)
{
    kv_store_off_t *o = s->off;
    kv_pfx_t *p = s->pfx;
    if (!o || !o->file || x->pol) /* compressed contexts stay in the pool */
        return 0;
    if (!x->copy) {
        pf_pending_t pd;
        pthread_mutex_lock(&o->lock);
        int rc = copy_submit(s, x, &pd);
        if (rc == 0)
            rc = copy_finish(s, &pd);
        pthread_mutex_unlock(&o->lock);
        if (rc) {
            p->f_dropped++;
            return 0;
        }
    }
    for (uint32_t e = 0; e < x->n_ents; e++) {
        kv_page_ref_drop(s->pt, x->ents[e].id, x->ents[e].format);
        x->ents[e].id = x->copy->slots[e];
    }
    p->n_refs -= x->n_ents;
    x->on_file = 1;
    p->f_nodes++;
    if (x->parent)
        x->parent->file_kids++;
    p->f_demoted++;
    return 1;
}

/* 1 if x's copy is among the `used` submitted from win[head]. */
static int in_window(const pf_pending_t *win, uint32_t head, uint32_t used,
                     const kv_pfx_node_t *x)
{
    for (uint32_t i = 0; i < used; i++)
        if (win[(head + i) % PF_WINDOW].x == x)
            return 1;
    return 0;
}

/* Hottest nodes first, and for each the nodes of its chain without a copy
 * from the top down: a restore links a node only under its restored
 * parent, so a copy whose parent has none would be written in vain (and
 * restored as bad); when the file fills, the copies written form chains
 * from their roots. */
void kv_pfx_file_sync(kv_store_t *s)
{
    kv_store_off_t *o = s->off;
    kv_pfx_t *p = s->pfx;
    if (!p || !o || !o->file)
        return;
    pf_pending_t win[PF_WINDOW];
    uint32_t head = 0, used = 0;
    int full = 0;
    for (kv_pfx_node_t *x = p->hot; x && !full; x = x->prev) {
        if (x->copy || x->pol) /* compressed contexts: pool only */
            continue;
        uint32_t depth = 0;
        for (const kv_pfx_node_t *a = x; a; a = a->parent)
            depth++;
        /* one submission per round: the topmost node still without one */
        for (uint32_t k = 0; k < depth && !full; k++) {
            kv_pfx_node_t *top = NULL;
            for (kv_pfx_node_t *a = x; a && !a->copy && !in_window(win, head, used, a);
                 a = a->parent)
                top = a;
            if (!top || top->pol) /* done (or under a context: none) */
                break;
            if (used == PF_WINDOW) {
                (void)copy_finish(s, &win[head]);
                head = (head + 1) % PF_WINDOW;
                used--;
            }
            int rc = copy_submit(s, top, &win[(head + used) % PF_WINDOW]);
            if (rc) { /* full: the rest stays in the pool only; else skip x */
                full = rc == -ENOSPC;
                break;
            }
            used++;
        }
    }
    for (; used; used--, head = (head + 1) % PF_WINDOW)
        (void)copy_finish(s, &win[head]);
}

/* ---- read back ------------------------------------------------------------------ */

/* The match ends before x (x's parent, or nothing). */
static void cut_before(const kv_pfx_node_t *x, uint32_t *got, kv_pfx_node_t **last)
{
    *last = x->parent;
    *got = x->start;
}

void kv_pfx_file_load(kv_store_t *s, uint32_t *got, kv_pfx_node_t **last)
{
    kv_pfx_t *p = s->pfx;
    kv_store_off_t *o = s->off;
    uint32_t nc = 0;
    kv_pfx_node_t *first = NULL; /* the chain's first node on the file */
    for (kv_pfx_node_t *x = *last; x; x = x->parent, nc++)
        if (x->on_file)
            first = x;
    if (!first)
        return;
    kv_pfx_node_t **chain = kv_mem_alloc((size_t)nc * sizeof *chain);
    if (!chain || !o || !o->file) {
        kv_mem_free(chain, chain ? (size_t)nc * sizeof *chain : 0);
        cut_before(first, got, last);
        return;
    }
    uint32_t k = nc;
    for (kv_pfx_node_t *x = *last; x; x = x->parent)
        chain[--k] = x;
    uint32_t i0 = 0;
    while (chain[i0] != first)
        i0++;
    /* the nodes to read: from i0 up to the first the pool has no room for */
    uint64_t room = kv_store_pool_free(s), tot = 0;
    uint32_t end = i0;
    for (; end < nc; end++) {
        uint64_t m = chain[end]->on_file ? chain[end]->n_ents : 0;
        if (tot + m > room)
            break;
        tot += m;
    }
    kv_offload_rpage_t *r = NULL;
    size_t mem_n = (size_t)tot * (sizeof *r + sizeof(int) + sizeof(kv_page_id_t));
    r = tot ? kv_mem_alloc(mem_n) : NULL;
    if (!r)
        end = i0;
    int *status = r ? (int *)(r + tot) : NULL;
    kv_page_id_t *pages = r ? (kv_page_id_t *)(status + tot) : NULL;
    uint64_t at = 0;
    for (uint32_t j = i0; j < end; j++) { /* pool pages, node by node */
        kv_pfx_node_t *x = chain[j];
        const uint64_t at0 = at;
        for (uint32_t e = 0; x->on_file && e < x->n_ents; e++, at++) {
            if (kv_page_ref_new(s->pt, x->ents[e].format, &pages[at]) == 0)
                continue;
            while (at-- > at0)
                kv_page_ref_drop(s->pt, pages[at], x->ents[at - at0].format);
            at = at0;
            end = j; /* refused: read what fits */
            break;
        }
    }
    tot = at;
    at = 0;
    for (uint32_t j = i0; j < end; j++) {
        const kv_pfx_node_t *x = chain[j];
        for (uint32_t e = 0; x->on_file && e < x->n_ents; e++, at++) {
            r[at] = (kv_offload_rpage_t){.slot = x->copy->slots[e],
                                         .key = page_key(x->copy->id, e),
                                         .generation = x->copy->gen + e,
                                         .data = kv_page_addr(s->pt, pages[at])};
            status[at] = KV_STORE_OFF_PENDING;
        }
    }
    if (tot) { /* one batch: the file pipelines and coalesces it */
        kv_offload_ticket_t t;
        pthread_mutex_lock(&o->lock);
        int rc = kv_offload_read_submit(o->file, r, (uint32_t)tot, status, &t);
        if (rc == 0 && batch_wait(o->file, t, status, (uint32_t)tot)) {
            pthread_mutex_unlock(&o->lock);
            cut_before(first, got, last); /* never reported: the file keeps them */
            kv_mem_free(chain, (size_t)nc * sizeof *chain);
            return;
        }
        for (uint64_t i = 0; i < tot; i++) {
            if (rc)
                status[i] = rc;
            o->io_errors += status[i] != 0; /* (off->lock: attention counts too) */
        }
        pthread_mutex_unlock(&o->lock);
    }
    /* install root first; the first node that failed ends the match */
    at = 0;
    uint32_t j = i0;
    for (; j < end; j++) {
        kv_pfx_node_t *x = chain[j];
        if (!x->on_file)
            continue;
        int bad = 0;
        for (uint32_t e = 0; e < x->n_ents; e++)
            bad |= status[at + e] != 0;
        if (bad)
            break;
        for (uint32_t e = 0; e < x->n_ents; e++, at++)
            x->ents[e].id = pages[at];
        x->on_file = 0;
        p->f_nodes--;
        if (x->parent)
            x->parent->file_kids--;
        p->n_refs += x->n_ents;
        p->f_hits++;
        p->f_tokens += x->end - x->start;
        p->f_bytes_in += (uint64_t)x->n_ents * s->cfg.page_bytes;
    }
    if (j < end) { /* chain[j] failed: its pages and the rest's go back */
        for (uint32_t i = j; i < end; i++)
            for (uint32_t e = 0; chain[i]->on_file && e < chain[i]->n_ents; e++, at++)
                kv_page_ref_drop(s->pt, pages[at], chain[i]->ents[e].format);
        p->f_bad++;
        cut_before(chain[j], got, last);
        kv_pfx_drop(s, chain[j]); /* with its subtree: the rest of the chain */
    } else if (end < nc) {
        cut_before(chain[end], got, last);
    }
    kv_mem_free(r, r ? mem_n : 0);
    kv_mem_free(chain, (size_t)nc * sizeof *chain);
}

void kv_pfx_file_release(kv_store_t *s, kv_pfx_node_t *x)
{
    kv_pfx_copy_t *c = x->copy;
    if (!c)
        return;
    const uint32_t n = x->n_ents + c->n_rec;
    if (s->off && s->off->file)
        kv_offload_free(s->off->file, c->slots, n);
    s->pfx->f_slots -= n;
    s->pfx->f_mem -= c->bytes;
    kv_mem_free(c, c->bytes);
    x->copy = NULL;
}

int kv_pfx_file_room(kv_store_t *s, uint32_t need)
{
    kv_pfx_t *p = s->pfx;
    if (!p || !p->f_slots)
        return 0;
    kv_offload_stats_t st;
    kv_offload_stats(s->off->file, &st);
    uint64_t free0 = st.capacity - st.slots_used, freed = 0;
    /* copies of host nodes first (nothing is lost), coldest first: those of
     * childless nodes before the others (a child's copy is restored only
     * under its parent's: it waits for the next sync to write that again) */
    for (int pass = 0; pass < 2; pass++)
        for (kv_pfx_node_t *x = p->cold; x && free0 + freed < need; x = x->next)
            if (x->copy && !x->on_file && (pass || !x->children)) {
                freed += x->n_ents + x->copy->n_rec;
                kv_pfx_file_release(s, x);
            }
    /* then nodes on the file, coldest leaves first */
    while (free0 + freed < need) {
        kv_pfx_node_t *x = p->cold;
        while (x && !(x->on_file && !x->children))
            x = x->next;
        if (!x)
            break;
        freed += x->n_ents + x->copy->n_rec;
        p->f_dropped++;
        kv_pfx_drop(s, x);
    }
    return freed > 0 && free0 + freed >= need;
}

uint64_t kv_pfx_file_slots(const kv_store_t *s)
{
    return s->pfx ? s->pfx->f_slots : 0;
}

/* ---- restore -------------------------------------------------------------------- */

typedef struct pf_cand {        /* a parsed record, not linked yet            */
    kv_pfx_node_t *x;
    kv_prefix_hash_t parent;
    uint32_t has_parent;
} pf_cand_t;

/* Parse the record whose chunk 0 is ents[c0] into a node on the file (its
 * slots claimed): 0, KV_ECORRUPT (not usable: nothing claimed), KV_ENOMEM. */
static int rec_parse(kv_store_t *s, const kv_offload_entry_t *ents, uint64_t n, uint64_t c0,
                     uint8_t *claimed, pf_cand_t *out)
{
    const kv_config_t *cf = &s->cfg;
    const uint32_t pb = cf->page_bytes, L = n_lists(s);
    const uint32_t B = kv_fmt_fp16_tpp(cf->head_dim, pb);
    const uint32_t id = (uint32_t)(ents[c0].key >> 24);
    const uint64_t rgen = ents[c0].generation;
    uint8_t *hdr = kv_mem_alloc(pb), *blob = NULL;
    size_t blob_n = 0;
    if (!hdr)
        return KV_ENOMEM;
    int rc = ents[c0].bytes < KV_REC_PFX_HDR_BYTES + KV_REC_PFX_NODE_BYTES ||
                     ents[c0].format != KV_REC_CHUNK_FORMAT ||
                     kv_store_off_rec_read(s, &ents[c0], hdr)
                 ? KV_ECORRUPT
                 : 0;
    uint32_t chunks = 0, start = 0, end = 0, hasp = 0;
    uint64_t bytes = 0, gen = 0, n_ents = 0;
    if (rc == 0) {
        chunks = kv_le_get32(hdr + 28);
        bytes = kv_le_get64(hdr + 32);
        gen = kv_le_get64(hdr + 40);
        start = kv_le_get32(hdr + 48);
        end = kv_le_get32(hdr + 52);
        hasp = kv_le_get32(hdr + 56);
        const uint64_t fixed = rec_bytes(s, 0);
        n_ents = bytes >= fixed ? (bytes - fixed) / KV_REC_PFX_ENT_BYTES : 0;
        if (kv_store_off_rec_head_check(hdr, KV_REC_PFX_MAGIC, KV_REC_PFX_VERSION, id, cf) ||
            kv_le_get32(hdr + 60) != 0 || bytes < fixed || (bytes - fixed) % KV_REC_PFX_ENT_BYTES ||
            n_ents == 0 || n_ents >= PF_MAX_IDX || n_ents > n || chunks == 0 ||
            chunks > n || bytes <= (uint64_t)(chunks - 1) * pb ||
            bytes > (uint64_t)chunks * pb || rgen != gen + n_ents || start >= end ||
            start % B || end % B || hasp != (start != 0))
            rc = KV_ECORRUPT;
    }
    if (rc == 0) {
        blob_n = (size_t)chunks * pb;
        if (!(blob = kv_mem_alloc(blob_n)))
            rc = KV_ENOMEM;
    }
    for (uint32_t k = 0; rc == 0 && k < chunks; k++) {
        uint64_t i = k ? kv_store_off_rec_find(ents, n, rec_key(id, k), rgen) : c0;
        uint64_t left = bytes - (uint64_t)k * pb;
        if (i == n || ents[i].bytes != (left < pb ? left : pb) ||
            ents[i].format != KV_REC_CHUNK_FORMAT || claimed[kv_alloc_page_index(ents[i].slot)])
            rc = KV_ECORRUPT;
        else if (k == 0)
            memcpy(blob, hdr, pb);
        else if (kv_store_off_rec_read(s, &ents[i], blob + (size_t)k * pb))
            rc = KV_ECORRUPT;
    }
    kv_mem_free(hdr, pb);
    kv_pfx_node_t *x = NULL;
    kv_pfx_copy_t *c = NULL;
    if (rc == 0) {
        x = kv_pfx_node_alloc(L, (uint32_t)n_ents, 0);
        c = copy_alloc((uint32_t)n_ents + chunks);
        if (!x || !c)
            rc = KV_ENOMEM;
    }
    const uint8_t *q = NULL, *qe = NULL;
    if (rc == 0) {
        q = blob + KV_REC_PFX_HDR_BYTES + KV_REC_PFX_NODE_BYTES;
        qe = q + (size_t)L * KV_REC_PFX_LIST_BYTES;
    }
    uint32_t e = 0;
    for (uint32_t li = 0; rc == 0 && li < L; li++, q += KV_REC_PFX_LIST_BYTES) {
        const uint32_t m = kv_le_get32(q), fmt = kv_le_get32(q + 8);
        uint64_t t = 0;
        if (m > n_ents - e || kv_le_get32(q + 4) != end - start ||
            kv_le_get32(q + 12) != 0) {
            rc = KV_ECORRUPT;
            break;
        }
        x->off[li] = e;
        for (uint32_t j = 0; j < m && rc == 0; j++, e++, qe += KV_REC_PFX_ENT_BYTES) {
            const uint32_t tok = kv_le_get16(qe + 8), f = qe[10];
            uint64_t i = kv_store_off_rec_find(ents, n, page_key(id, e), gen + e);
            if (kv_le_get64(qe) != gen + e || f != fmt || qe[11] != 0 ||
                kv_le_get32(qe + 12) != 0 || !kv_store_off_page_ok(s->pt, f, 0, tok) ||
                tok != kv_format_get(f)->tokens_per_page(kv_page_table_geom(s->pt)) ||
                i == n || ents[i].format != f || ents[i].tokens != tok || ents[i].bytes != pb ||
                claimed[kv_alloc_page_index(ents[i].slot)]) {
                rc = KV_ECORRUPT;
                break;
            }
            x->ents[e] = (kv_page_ent_t){.id = ents[i].slot, .format = (uint8_t)f,
                                         .n_tokens = (uint16_t)tok};
            c->slots[e] = ents[i].slot;
            t += tok;
        }
        if (rc == 0 && t != end - start)
            rc = KV_ECORRUPT;
    }
    if (rc == 0 && e != n_ents)
        rc = KV_ECORRUPT;
    if (rc == 0) {
        x->off[L] = e;
        x->start = start;
        x->end = end;
        x->on_file = 1;
        memcpy(x->key.b, blob + KV_REC_PFX_HDR_BYTES, 32);
        memcpy(out->parent.b, blob + KV_REC_PFX_HDR_BYTES + 32, 32);
        out->has_parent = hasp;
        c->id = id;
        c->n_rec = chunks;
        c->gen = gen;
        for (uint32_t k = 0; k < chunks; k++)
            c->slots[n_ents + k] =
                ents[k ? kv_store_off_rec_find(ents, n, rec_key(id, k), rgen) : c0].slot;
        for (uint64_t k = 0; k < n_ents + chunks; k++)
            claimed[kv_alloc_page_index(c->slots[k])] = 1;
        x->copy = c;
        out->x = x;
    } else {
        kv_mem_free(x, x ? x->bytes : 0);
        kv_mem_free(c, c ? c->bytes : 0);
    }
    kv_mem_free(blob, blob ? blob_n : 0);
    return rc;
}

static int cand_cmp(const void *a, const void *b)
{
    const pf_cand_t *x = a, *y = b;
    return x->x->start < y->x->start ? -1 : x->x->start > y->x->start;
}

static void cand_free(kv_store_t *s, pf_cand_t *cd, uint8_t *claimed)
{
    kv_pfx_node_t *x = cd->x;
    for (uint32_t k = 0; k < x->n_ents + x->copy->n_rec; k++)
        claimed[kv_alloc_page_index(x->copy->slots[k])] = 0; /* orphans now */
    kv_mem_free(x->copy, x->copy->bytes);
    kv_mem_free(x, x->bytes);
    cd->x = NULL;
    (void)s;
}

int kv_pfx_file_restore(kv_store_t *s, const kv_offload_entry_t *ents, uint64_t n,
                        uint8_t *claimed)
{
    kv_pfx_t *p = s->pfx;
    if (!p)
        return 0; /* without the cache its slots are orphans */
    uint64_t i0 = n;
    while (i0 > 0 && kv_pfx_file_key(ents[i0 - 1].key))
        i0--;
    uint64_t n_rec = 0;
    for (uint64_t i = i0; i < n; i++)
        n_rec += (ents[i].key & (KV_REC_PFX_KEY_REC | (KV_REC_PFX_KEY_REC - 1))) ==
                 KV_REC_PFX_KEY_REC;
    if (!n_rec)
        return 0;
    const size_t cd_n = (size_t)n_rec * sizeof(pf_cand_t);
    pf_cand_t *cd = kv_mem_calloc(n_rec, sizeof *cd);
    if (!cd)
        return KV_ENOMEM;
    int rc = 0;
    uint64_t got = 0;
    for (uint64_t i = i0; i < n && rc == 0; i++) {
        if ((ents[i].key & (KV_REC_PFX_KEY_REC | (KV_REC_PFX_KEY_REC - 1))) != KV_REC_PFX_KEY_REC)
            continue;
        const uint32_t id = (uint32_t)(ents[i].key >> 24);
        if (id >= p->f_next_id)
            p->f_next_id = id + 1;
        rc = rec_parse(s, ents, n, i, claimed, &cd[got]);
        if (rc == KV_ECORRUPT) {
            p->f_bad++;
            rc = 0;
        } else if (rc == 0) {
            got++;
        }
    }
    qsort(cd, got, sizeof *cd, cand_cmp); /* parents before their children */
    for (uint64_t i = 0; i < got; i++) {
        kv_pfx_node_t *x = cd[i].x, *par = NULL;
        if (rc == 0 && cd[i].has_parent)
            par = kv_pfx_lookup(p, &cd[i].parent);
        if (rc || kv_pfx_lookup(p, &x->key) ||
            (cd[i].has_parent && (!par || par->end != x->start))) {
            p->f_bad += rc == 0;
            cand_free(s, &cd[i], claimed);
            continue;
        }
        if ((rc = kv_pfx_reserve(p, 1))) {
            cand_free(s, &cd[i], claimed);
            continue;
        }
        x->parent = par;
        p->f_slots += x->n_ents + x->copy->n_rec;
        p->f_mem += x->copy->bytes;
        kv_pfx_link(s, x, 0);
        p->f_restored++;
    }
    kv_mem_free(cd, cd_n);
    return rc;
}

/* ---- stats and check --------------------------------------------------------------- */

void kv_pfx_file_stats(const kv_store_t *s, kv_stats_t *out)
{
    const kv_pfx_t *p = s->pfx;
    out->meta_bytes += p->f_mem;
    out->prefix_file_nodes = p->f_nodes;
    out->prefix_file_slots = p->f_slots;
    out->prefix_file_hits = p->f_hits;
    out->prefix_file_tokens = p->f_tokens;
    out->prefix_file_bytes_in = p->f_bytes_in;
    out->prefix_file_bytes_out = p->f_bytes_out;
    out->prefix_file_demoted = p->f_demoted;
    out->prefix_file_dropped = p->f_dropped;
    out->prefix_file_bad = p->f_bad;
    out->prefix_file_restored = p->f_restored;
}

#define PF_FAIL(...)                                                    \
    do {                                                                \
        fprintf(stderr, "kv_store_check (prefix file): " __VA_ARGS__);  \
        fputc('\n', stderr);                                            \
        return KV_ECORRUPT;                                             \
    } while (0)

int kv_pfx_file_check(const kv_store_t *s)
{
    const kv_pfx_t *p = s->pfx;
    kv_offload_file_t *f = s->off ? s->off->file : NULL;
    uint64_t nodes = 0, slots = 0, mem = 0;
    for (const kv_pfx_node_t *x = p->cold; x; x = x->next) {
        const kv_pfx_copy_t *c = x->copy;
        nodes += x->on_file;
        if (!c) {
            if (x->on_file)
                PF_FAIL("node [%u, %u) on the file without a copy", x->start, x->end);
            continue;
        }
        if (!f)
            PF_FAIL("node [%u, %u): a copy without a page file", x->start, x->end);
        slots += x->n_ents + c->n_rec;
        mem += c->bytes;
        for (uint32_t i = 0; i < x->n_ents + c->n_rec; i++) {
            const int page = i < x->n_ents;
            kv_offload_entry_t fe;
            if (kv_offload_info(f, c->slots[i], &fe) != 0 ||
                fe.key != (page ? page_key(c->id, i) : rec_key(c->id, i - x->n_ents)) ||
                fe.generation != c->gen + (page ? i : x->n_ents) ||
                fe.format != (page ? x->ents[i].format : KV_REC_CHUNK_FORMAT) ||
                (page && (fe.tokens != x->ents[i].n_tokens ||
                          (x->on_file && x->ents[i].id != c->slots[i]))))
                PF_FAIL("node [%u, %u): slot %u of its copy", x->start, x->end, i);
        }
    }
    if (nodes != p->f_nodes || slots != p->f_slots || mem != p->f_mem)
        PF_FAIL("nodes on the file %llu/%llu, slots %llu/%llu, bytes %llu/%llu",
                (unsigned long long)nodes, (unsigned long long)p->f_nodes,
                (unsigned long long)slots, (unsigned long long)p->f_slots,
                (unsigned long long)mem, (unsigned long long)p->f_mem);
    return 0;
}
