/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_faults.c — injected I/O faults through the store: no
 * corrupt page returned, no silent loss, no leak.
 *
 *   test_store_offload_faults [MIN_FAULTS [SEED]]
 *
 * For every I/O queue that runs here, sequences of every kind (FP16, INT4,
 * INT2, compacted, MERGED pair) go to the page file and back, round after
 * round, with the file's fault shim injecting EIO, ENOSPC, short
 * transfers, torn writes, bit flips, EAGAIN and EINTR on about a third of
 * all transfers (2% that lose or damage the page, the rest recoverable;
 * one slot per I/O, so every page meets the shim), until at
 * least MIN_FAULTS faults (default 4000 per I/O queue) were injected. After
 * every page-out and every page-in, every page of every sequence is read
 * (kv_read of its token range) and must be either bit-exact with the
 * reference, or not readable (KV_ENOTRES) with the page marked lost and
 * kv_seq_wait of its sequence having returned an error: a page read back
 * with other bits is "corrupt", a page neither exact nor reported lost is a
 * "silent loss" — both must be 0. Attention over every fully resident
 * sequence must equal its reference. A sequence that keeps a lost page for
 * 3 prefetches (its bytes on disk are damaged: torn or flipped write) is
 * freed and built anew. At the end, with faults off, everything comes back
 * or is freed: no slot held, no pool page used, no metadata byte left
 * (kv_mem_live_bytes), kv_store_check clean throughout; ASan sees the rest.
 * Prints one JSON line per I/O queue with the counts.
 */
#include "test_store_offload_util.h"

enum { NSEQ = 8, RETRIES = 3 };

typedef struct tally {
    uint64_t rounds, pages_checked, lost_seen, corrupt, silent, unexpected, replaced;
    uint64_t wait_errors, attn_checked;
} tally_t;

typedef struct fleet {
    kv_seq_id_t seq[NSEQ];
    kv_test_seq_t ref[NSEQ];
    float att[NSEQ][KVS_ATTN_N];
    int lost_rounds[NSEQ];
    uint64_t gen;
} fleet_t;

static void build(kv_store_t *st, fleet_t *f, int i)
{
    CHECK_OK(kv_seq_create(st, &f->seq[i]));
    CHECK_OK(kvs_fill(st, f->seq[i], 40 + 9 * (uint32_t)(f->gen % 5), 1000 + f->gen,
                      i % KVS_KINDS));
    f->gen++;
    CHECK_OK(kv_test_seq_take(st, f->seq[i], &f->ref[i]));
    CHECK_OK(kvs_attn(st, f->seq[i], f->att[i]));
    f->lost_rounds[i] = 0;
}

/* Every page of seq i: exact; or not readable because it is on the file
 * (only before a prefetch: after one, a page on the file must be lost),
 * or lost and reported (wait_rc != 0). Returns the lost pages seen. */
static uint32_t verify_seq(kv_store_t *st, fleet_t *f, int i, int wait_rc, int prefetched,
                           tally_t *t)
{
    const kv_test_seq_t *ref = &f->ref[i];
    float k[16 * 4 * KVS_D], v[16 * 4 * KVS_D];
    int32_t pos[16 * 4];
    uint32_t lost = 0;
    for (uint32_t li = 0; li < KVS_LISTS; li++) {
        const kv_page_list_t *l = kv_page_list_get(st->pt, f->seq[i], li / KVS_KVH,
                                                   li % KVS_KVH);
        uint32_t t0 = 0;
        for (uint32_t e = 0; e < l->n_ents; e++) {
            uint32_t n = l->ents[e].n_tokens;
            int rc = kv_read(st, f->seq[i], li / KVS_KVH, li % KVS_KVH, t0, n, k, v, pos);
            t->pages_checked++;
            if (rc == 0) {
                const kv_test_list_t *rl = &ref->l[li];
                if (memcmp(k, rl->k + (size_t)t0 * KVS_D, sizeof(float) * n * KVS_D) ||
                    memcmp(v, rl->v + (size_t)t0 * KVS_D, sizeof(float) * n * KVS_D) ||
                    memcmp(pos, rl->pos + t0, sizeof(int32_t) * n))
                    t->corrupt++;
            } else if (rc == KV_ENOTRES) {
                uint8_t fl = l->ents[e].flags;
                if (fl & KV_PAGE_ENT_LOST) {
                    lost++;
                    if (wait_rc == 0)
                        t->silent++; /* lost but not reported */
                } else if (prefetched || fl != (fl | KV_PAGE_ENT_OFFLOADED)) {
                    t->silent++; /* neither back nor reported lost */
                }
            } else {
                t->unexpected++;
            }
            t0 += n;
        }
    }
    t->lost_seen += lost;
    kv_residency_t r = kvs_res(st, f->seq[i]);
    if (r.resident == r.pages) {
        float out[KVS_ATTN_N];
        int rc = kvs_attn(st, f->seq[i], out);
        t->attn_checked++;
        if (rc)
            t->unexpected++;
        else if (memcmp(out, f->att[i], sizeof out))
            t->corrupt++;
    }
    return lost;
}

static uint64_t faults_of(kv_store_t *st, uint64_t *by_kind)
{
    kv_offload_stats_t fs;
    kv_offload_stats(kv_store_off_file(st), &fs);
    uint64_t n = 0;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++) {
        n += fs.faults[k];
        if (by_kind)
            by_kind[k] = fs.faults[k];
    }
    return n;
}

static void run(const kvt_dir_t *d, uint32_t flags, uint64_t min_faults, uint64_t seed)
{
    char p[4096];
    kvt_path(d, "flt.kvp", p);
    uint64_t live0 = kv_mem_live_bytes();
    kv_config_t c = kvs_config(p, flags, 2048, 1024);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    CHECK_OK(kv_offload_set_max_io(kv_store_off_file(st), 1));
    fleet_t *f = calloc(1, sizeof *f);
    f->gen = seed;
    for (int i = 0; i < NSEQ; i++)
        build(st, f, i);
    kv_offload_fault_t fault = {.seed = seed};
    /* ~2% of transfers lose or damage their page, ~30% recover (retried) */
    fault.ppm[KV_OFFLOAD_FAULT_EIO] = 6000;
    fault.ppm[KV_OFFLOAD_FAULT_ENOSPC] = 4000;
    fault.ppm[KV_OFFLOAD_FAULT_SHORT] = 100000;
    fault.ppm[KV_OFFLOAD_FAULT_TORN] = 4000;
    fault.ppm[KV_OFFLOAD_FAULT_FLIP] = 6000;
    fault.ppm[KV_OFFLOAD_FAULT_EAGAIN] = 100000;
    fault.ppm[KV_OFFLOAD_FAULT_EINTR] = 100000;
    CHECK_OK(kv_store_off_set_fault(st, &fault));
    tally_t t = {0};
    while (faults_of(st, NULL) < min_faults && t.rounds < 1000000) {
        t.rounds++;
        for (int i = 0; i < NSEQ; i++) {
            int rc = kv_seq_offload(st, f->seq[i]);
            CHECK(rc == 0 || rc == -ENOSPC);
        }
        for (int i = 0; i < NSEQ; i++) { /* failed writes: still resident, exact */
            int rc = kv_seq_wait(st, f->seq[i]);
            t.wait_errors += rc != 0;
            verify_seq(st, f, i, rc, 0, &t);
        }
        for (int i = 0; i < NSEQ; i++)
            CHECK_OK(kv_seq_prefetch(st, f->seq[i]));
        for (int i = 0; i < NSEQ; i++) {
            int rc = kv_seq_wait(st, f->seq[i]);
            t.wait_errors += rc != 0;
            uint32_t lost = verify_seq(st, f, i, rc, 1, &t);
            kv_residency_t r = kvs_res(st, f->seq[i]);
            if (r.lost != lost || r.on_file != lost || r.in_flight)
                t.silent++; /* residency disagrees with what reads showed */
            if (!lost)
                f->lost_rounds[i] = 0;
            else if (++f->lost_rounds[i] >= RETRIES) { /* damaged on disk */
                CHECK_OK(kv_seq_free(st, f->seq[i]));
                kv_test_seq_free(&f->ref[i]);
                build(st, f, i);
                t.replaced++;
            }
        }
        if (t.rounds % 16 == 0)
            CHECK_OK(kv_store_check(st));
    }
    uint64_t by_kind[KV_OFFLOAD_FAULT_COUNT];
    uint64_t faults = faults_of(st, by_kind);
    CHECK(faults >= min_faults);
    CHECK_OK(kv_store_check(st));

    /* faults off: everything comes back or is freed */
    memset(fault.ppm, 0, sizeof fault.ppm);
    CHECK_OK(kv_store_off_set_fault(st, &fault));
    for (int i = 0; i < NSEQ; i++) {
        CHECK_OK(kv_seq_prefetch(st, f->seq[i]));
        int rc = kv_seq_wait(st, f->seq[i]);
        uint32_t lost = verify_seq(st, f, i, rc, 1, &t);
        CHECK((rc == 0) == (lost == 0));
    }
    kv_stats_t s = kvs_stats(st);
    CHECK_OK(kv_store_check(st));
    for (int i = 0; i < NSEQ; i++) {
        CHECK_OK(kv_seq_free(st, f->seq[i]));
        kv_test_seq_free(&f->ref[i]);
    }
    kv_stats_t e = kvs_stats(st);
    kv_offload_stats_t fs;
    kv_offload_stats(kv_store_off_file(st), &fs);
    CHECK_EQ(e.offload_slots_used, 0);
    CHECK_EQ(e.pages_used, 0);
    CHECK_EQ(e.pages_on_file + e.pages_in_flight + e.pages_lost, 0);
    CHECK(fs.staging_used == 0 && fs.ios_inflight == 0 && fs.batches_open == 0);
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
    uint64_t leaked = kv_mem_live_bytes() - live0;
    CHECK_EQ(leaked, 0);
    CHECK_EQ(t.corrupt, 0);
    CHECK_EQ(t.silent, 0);
    CHECK_EQ(t.unexpected, 0);
    CHECK(t.lost_seen > 0 && t.wait_errors > 0); /* the faults did bite */
    printf("{\"engine\":\"%s\",\"rounds\":%llu,\"faults\":%llu,\"eio\":%llu,\"enospc\":%llu,"
           "\"short\":%llu,\"torn\":%llu,\"flip\":%llu,\"eagain\":%llu,\"eintr\":%llu,"
           "\"pages_out\":%llu,\"pages_in\":%llu,\"io_errors\":%llu,\"pages_checked\":%llu,"
           "\"lost_reported\":%llu,\"seqs_rebuilt\":%llu,\"attn_checked\":%llu,"
           "\"corrupt_returned\":%llu,\"silent_losses\":%llu,\"leaked_slots\":%llu,"
           "\"leaked_pages\":%llu,\"leaked_meta_bytes\":%llu}\n",
           fs.ioq, (unsigned long long)t.rounds, (unsigned long long)faults,
           (unsigned long long)by_kind[0], (unsigned long long)by_kind[1],
           (unsigned long long)by_kind[2], (unsigned long long)by_kind[3],
           (unsigned long long)by_kind[4], (unsigned long long)by_kind[5],
           (unsigned long long)by_kind[6], (unsigned long long)s.pages_out,
           (unsigned long long)s.pages_in, (unsigned long long)s.io_errors,
           (unsigned long long)t.pages_checked, (unsigned long long)t.lost_seen,
           (unsigned long long)t.replaced, (unsigned long long)t.attn_checked,
           (unsigned long long)t.corrupt, (unsigned long long)t.silent,
           (unsigned long long)e.offload_slots_used, (unsigned long long)e.pages_used,
           (unsigned long long)leaked);
    free(f);
}

int main(int argc, char **argv)
{
    uint64_t min_faults = argc > 1 ? strtoull(argv[1], NULL, 10) : 4000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint32_t eng[2];
    int n = kvt_ioqs(&d, eng);
    for (int i = 0; i < n; i++)
        run(&d, eng[i] == KV_OFFLOAD_IOQ_PREAD ? KV_OFFLOAD_PREAD : 0, min_faults, seed);
    kvt_dir_remove(&d);
    return kv_test_end();
}
