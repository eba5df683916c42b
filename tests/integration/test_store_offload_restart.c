/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_restart.c — a page file outlives its store:
 *   - sequences of every restorable kind (FP16, INT4, INT2, compacted with
 *     positions) wholly on the file, one with MERGED pages (partly on the
 *     file) and one resident: sync, destroy, reopen with KV_OFFLOAD_OPEN:
 *     exactly the wholly-offloaded ones come back under their old ids, all
 *     pages on the file, every list bit-exact and attention identical after
 *     prefetch; slots of the others were freed; new sequences get other ids;
 *     a later reopen of a file whose sequences were all read back restores
 *     nothing and holds no slot;
 *   - a reopen with another model shape fails (KV_EINVAL) and leaves the
 *     file as it was;
 *   - allocation failure injection on the reopen: every failure returns an
 *     error, leaks nothing, and leaves the file restorable;
 *   - a record chunk damaged on disk: that sequence is dropped (counted in
 *     seqs_dropped), the others come back; a damaged data page: its
 *     sequence comes back, the page is reported lost on prefetch
 *     (KV_ECORRUPT) and never read as data, the other pages are exact.
 */
#include <fcntl.h>

#include "test_store_offload_util.h"

enum { NK = 6 }; /* FP16, INT4, INT2, MERGED, COMPACT, resident FP16 */

typedef struct world {
    kv_seq_id_t seq[NK];
    kv_test_seq_t ref[NK];
    float att[NK][KVS_ATTN_N];
} world_t;

static kv_store_t *open_store(const char *p, int *rc)
{
    kv_config_t c = kvs_config(p, KV_OFFLOAD_OPEN, 0, 1024);
    kv_store_t *st = NULL;
    *rc = kv_store_create(&c, &st);
    return st;
}

/* Build the sequences, put all but the last on the file, sync, destroy. */
static void build(const char *p, world_t *w)
{
    kv_config_t c = kvs_config(p, 0, 1024, 1024);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t pad;
    CHECK_OK(kv_seq_create(st, &pad)); /* ids do not start at 0 */
    for (int i = 0; i < NK; i++) {
        CHECK_OK(kv_seq_create(st, &w->seq[i]));
        CHECK_OK(kvs_fill(st, w->seq[i], 50 + 11 * (uint32_t)i, 40 + (uint64_t)i,
                          i < KVS_KINDS ? i : KVS_FP16));
        CHECK_OK(kv_test_seq_take(st, w->seq[i], &w->ref[i]));
        CHECK_OK(kvs_attn(st, w->seq[i], w->att[i]));
    }
    CHECK_OK(kv_seq_free(st, pad));
    for (int i = 0; i < NK - 1; i++)
        CHECK_OK(kv_seq_offload(st, w->seq[i]));
    for (int i = 0; i < NK - 1; i++)
        CHECK_OK(kv_seq_wait(st, w->seq[i]));
    CHECK_OK(kv_store_offload_sync(st));
    kv_stats_t s = kvs_stats(st);
    CHECK(s.offload_slots_used > s.pages_on_file); /* records too */
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
}

/* The restored store holds exactly the four wholly-offloaded sequences. */
static void verify(kv_store_t *st, const world_t *w, int damaged_page)
{
    kv_seq_id_t ids[8];
    uint32_t n = 0;
    CHECK_OK(kv_store_seqs(st, ids, 8, &n));
    const int want[] = {KVS_FP16, KVS_INT4, KVS_INT2, KVS_COMPACT};
    CHECK_EQ(n, 4);
    for (uint32_t i = 0; i < 4 && i < n; i++)
        CHECK_EQ(ids[i], w->seq[want[i]]);
    CHECK_OK(kv_store_check(st));
    float out[KVS_ATTN_N];
    for (int j = 0; j < 4; j++) {
        kv_seq_id_t q = w->seq[want[j]];
        kv_residency_t r = kvs_res(st, q);
        CHECK(r.pages > 0 && r.on_file == r.pages);
        CHECK_EQ(kvs_attn(st, q, out), KV_ENOTRES);
        CHECK_OK(kv_seq_prefetch(st, q));
        int rc = kv_seq_wait(st, q);
        if (j == damaged_page) {
            CHECK_EQ(rc, KV_ECORRUPT);
            r = kvs_res(st, q);
            CHECK(r.lost == 1 && r.on_file == 1 && r.resident == r.pages - 1);
            kv_test_seq_t now;
            CHECK_EQ(kv_test_seq_take(st, q, &now), KV_ENOTRES); /* never as data */
            kv_test_seq_free(&now);
            for (uint32_t li = 0; li < KVS_LISTS; li++) { /* the rest is exact */
                const kv_test_list_t *rl = &w->ref[want[j]].l[li];
                float *k = malloc(sizeof(float) * (rl->n + 1) * KVS_D);
                int rr = kv_read(st, q, li / KVS_KVH, li % KVS_KVH, 0, rl->n, k, NULL, NULL);
                CHECK(rr == KV_ENOTRES ||
                      (rr == 0 && !memcmp(k, rl->k, sizeof(float) * rl->n * KVS_D)));
                free(k);
            }
            continue;
        }
        CHECK_OK(rc);
        kv_test_seq_t now;
        CHECK_OK(kv_test_seq_take(st, q, &now));
        CHECK(kv_test_seq_same(&now, &w->ref[want[j]]));
        kv_test_seq_free(&now);
        CHECK_OK(kvs_attn(st, q, out));
        CHECK(memcmp(out, w->att[want[j]], sizeof out) == 0);
    }
    CHECK_OK(kv_store_check(st));
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    char p[4096];
    kvt_path(&d, "rs.kvp", p);
    world_t *w = calloc(1, sizeof *w);
    build(p, w);

    /* another shape: refused, file untouched */
    kv_config_t c = kvs_config(p, KV_OFFLOAD_OPEN, 0, 1024);
    c.n_layers = KVS_LAYERS + 1;
    kv_store_t *st = NULL;
    CHECK_EQ(kv_store_create(&c, &st), KV_EINVAL);
    CHECK_EQ(kv_mem_live_bytes(), live0);

    /* allocation failures on the reopen */
    int rc = -1, fails = 0;
    for (uint64_t n = 1; rc != 0 && n < 100000; n++) {
        kv_fault_arm(n);
        st = open_store(p, &rc);
        kv_fault_arm(0);
        if (rc) {
            fails++;
            CHECK(rc == KV_ENOMEM || rc == -ENOSPC);
            CHECK_EQ(kv_mem_live_bytes(), live0);
        }
    }
    CHECK_OK(rc);
    CHECK(fails > 10);
    printf("reopen: %d injected allocation failures, then restored\n", fails);
    kv_stats_t s = kvs_stats(st);
    CHECK_EQ(s.seqs_dropped, 0);
    CHECK_EQ(s.n_seqs, 4);

    /* damage for the next reopen: a record chunk of INT2, a page of COMPACT */
    off_t rec_at = kvs_slot_off(st, st->off->seqs[w->seq[KVS_INT2]].rec[0], 100);
    const kv_page_list_t *l = kv_page_list_get(st->pt, w->seq[KVS_COMPACT], 1, 0);
    off_t page_at = kvs_slot_off(st, l->ents[1].id, 7);
    verify(st, w, -1);
    kv_seq_id_t fresh;
    CHECK_OK(kv_seq_create(st, &fresh));
    for (int i = 0; i < NK; i++)
        if (i != KVS_MERGED && i != NK - 1)
            CHECK(fresh != w->seq[i]);
    kv_store_destroy(st);

    /* everything was read back: a reopen restores nothing, holds nothing */
    st = open_store(p, &rc);
    CHECK_OK(rc);
    s = kvs_stats(st);
    CHECK_EQ(s.n_seqs, 0);
    CHECK_EQ(s.offload_slots_used, 0);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));

    /* again, with the damage */
    for (int i = 0; i < NK; i++)
        kv_test_seq_free(&w->ref[i]);
    build(p, w);
    st = open_store(p, &rc);
    CHECK_OK(rc);
    rec_at = kvs_slot_off(st, st->off->seqs[w->seq[KVS_INT2]].rec[0], 100);
    l = kv_page_list_get(st->pt, w->seq[KVS_COMPACT], 1, 0);
    page_at = kvs_slot_off(st, l->ents[1].id, 7);
    kv_store_destroy(st); /* nothing changed: the same slots on disk */
    kvs_flip(p, rec_at);
    kvs_flip(p, page_at);
    st = open_store(p, &rc);
    CHECK_OK(rc);
    s = kvs_stats(st);
    CHECK_EQ(s.seqs_dropped, 1);
    CHECK_EQ(s.n_seqs, 3);
    kv_seq_id_t ids[8];
    uint32_t n = 0;
    CHECK_OK(kv_store_seqs(st, ids, 8, &n));
    CHECK(n == 3 && ids[0] == w->seq[KVS_FP16] && ids[1] == w->seq[KVS_INT4] &&
          ids[2] == w->seq[KVS_COMPACT]);
    float out[KVS_ATTN_N];
    CHECK_OK(kv_seq_prefetch(st, ids[0]));
    CHECK_OK(kv_seq_wait(st, ids[0]));
    CHECK_OK(kvs_attn(st, ids[0], out));
    CHECK(memcmp(out, w->att[KVS_FP16], sizeof out) == 0);
    CHECK_OK(kv_seq_prefetch(st, ids[2]));
    CHECK_EQ(kv_seq_wait(st, ids[2]), KV_ECORRUPT);
    kv_residency_t r = kvs_res(st, ids[2]);
    CHECK(r.lost == 1 && r.resident == r.pages - 1);
    CHECK_EQ(kvs_stats(st).pages_lost, 1);
    l = kv_page_list_get(st->pt, ids[2], 1, 0); /* entry 1 is the damaged page */
    uint32_t t1 = l->ents[0].n_tokens;
    CHECK_EQ(kv_read(st, ids[2], 1, 0, t1, 1, out, NULL, NULL), KV_ENOTRES);
    CHECK_OK(kv_read(st, ids[2], 1, 0, t1 - 1, 1, out, NULL, NULL));
    CHECK(memcmp(out, w->ref[KVS_COMPACT].l[KVS_KVH].k + (size_t)(t1 - 1) * KVS_D,
                 sizeof(float) * KVS_D) == 0);
    CHECK_OK(kv_store_check(st));
    CHECK_OK(kv_seq_free(st, ids[2]));
    CHECK_EQ(kvs_stats(st).pages_lost, 0);
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));

    for (int i = 0; i < NK; i++)
        kv_test_seq_free(&w->ref[i]);
    free(w);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
