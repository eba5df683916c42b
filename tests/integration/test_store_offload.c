/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload.c — the page-file tier through the public API, with
 * every I/O queue that runs here (io_uring when it initialises, pread):
 *   - config: offload fields without a path, bad flags, ranges, an existing
 *     file without KV_OFFLOAD_OPEN, a missing one with it; no page file:
 *     KV_ENOTSUP, every page resident;
 *   - round trip of every kind of sequence (FP16, INT4, INT2, MERGED pair
 *     with retained pages, compacted list with positions, a fork sharing
 *     pages): offload, wait, residency and stats (shared and MERGED pages
 *     stay, the rest leave the pool), KV_ENOTRES from attention, kv_read
 *     and every mutating call, prefetch, wait, then every list bit-exact
 *     and attention output identical; kv_store_check all along;
 *   - kv_seq_free with writes and with reads in flight (the free waits; no
 *     slot or page leaks), and of a sequence on the file (its slots return);
 *   - the testing knob kv_config_t.offload_fault_ppm/_seed: refused without
 *     a path or above 1e6; at 1e6 (pread: reproducible) faults are injected
 *     and counted (kv_stats.offload_faults), a sequence sent out and back
 *     either reads bit-exact or reports its lost pages, and nothing leaks;
 *     at 0 nothing is injected.
 */
#include "test_store_offload_util.h"

static void test_config(const kvt_dir_t *d)
{
    char p[4096];
    kvt_path(d, "cfg.kvp", p);
    kv_store_t *st = NULL;
    kv_config_t c = kvs_config(NULL, 0, 0, 64);
    c.offload_pages = 8; /* without a path */
    CHECK_EQ(kv_store_create(&c, &st), KV_EINVAL);
    c = kvs_config(p, 0x80, 8, 64);
    CHECK_EQ(kv_store_create(&c, &st), KV_EINVAL);
    c = kvs_config(p, 0, 0, 64);
    CHECK_EQ(kv_store_create(&c, &st), KV_ERANGE);
    c = kvs_config(p, 0, 8, 64);
    c.offload_low = 800;
    c.offload_high = 700;
    CHECK_EQ(kv_store_create(&c, &st), KV_ERANGE);
    c.offload_high = 1001;
    CHECK_EQ(kv_store_create(&c, &st), KV_ERANGE);
    c = kvs_config(p, 0, 8, 64);
    c.offload_qd = KV_OFFLOAD_MAX_QD + 1;
    CHECK_EQ(kv_store_create(&c, &st), KV_ERANGE);
    c = kvs_config(NULL, 0, 0, 64);
    c.offload_fault_ppm = 10; /* the testing knob needs a page file */
    CHECK_EQ(kv_store_create(&c, &st), KV_EINVAL);
    c.offload_fault_ppm = 0;
    c.offload_fault_seed = 1;
    CHECK_EQ(kv_store_create(&c, &st), KV_EINVAL);
    c = kvs_config(p, 0, 8, 64);
    c.offload_fault_ppm = 1000001;
    CHECK_EQ(kv_store_create(&c, &st), KV_ERANGE);
    c = kvs_config(p, KV_OFFLOAD_OPEN, 8, 64);
    CHECK_EQ(kv_store_create(&c, &st), -ENOENT);
    CHECK(access(p, F_OK) != 0);

    c = kvs_config(p, 0, 8, 64);
    CHECK_OK(kv_store_create(&c, &st));
    kv_config_t back;
    CHECK_OK(kv_store_config(st, &back));
    CHECK(back.offload_path && back.offload_path != p && !strcmp(back.offload_path, p));
    CHECK_EQ(back.offload_qd, 16);
    CHECK_EQ(back.offload_high, 900);
    CHECK_EQ(back.offload_low, 750);
    kv_store_t *st2 = NULL;
    CHECK_EQ(kv_store_create(&c, &st2), -EEXIST);
    kv_stats_t s = kvs_stats(st);
    CHECK_EQ(s.offload_slots, 8);
    CHECK_EQ(s.offload_slots_used, 0);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
    CHECK(!strcmp(kv_strerror(KV_ENOTRES), "page not resident (it is on the page file)"));

    /* no page file */
    c = kvs_config(NULL, 0, 0, 64);
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(st, &q));
    CHECK_OK(kvs_fill(st, q, 20, 1, KVS_FP16));
    CHECK_EQ(kv_seq_offload(st, q), KV_ENOTSUP);
    CHECK_EQ(kv_seq_prefetch(st, q), KV_ENOTSUP);
    CHECK_EQ(kv_seq_wait(st, q), KV_ENOTSUP);
    CHECK_EQ(kv_store_offload_balance(st), KV_ENOTSUP);
    CHECK_EQ(kv_store_offload_sync(st), KV_ENOTSUP);
    kv_residency_t r = kvs_res(st, q);
    CHECK(r.pages > 0 && r.resident == r.pages && r.on_file == 0 && r.in_flight == 0);
    CHECK_EQ(kv_seq_residency(st, q + 1, &r), KV_ENOENT);
    CHECK_EQ(kv_seq_residency(st, q, NULL), KV_EINVAL);
    kv_store_destroy(st);
}

/* Offloads every kind, checks non-residency everywhere, brings it back. */
static void test_roundtrip(const kvt_dir_t *d, uint32_t flags)
{
    char p[4096];
    kvt_path(d, "rt.kvp", p);
    kv_config_t c = kvs_config(p, flags, 512, 1024);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    enum { N = KVS_KINDS + 1 };
    kv_seq_id_t seq[N];
    kv_test_seq_t ref[N];
    float (*att)[KVS_ATTN_N] = malloc(sizeof(float) * N * KVS_ATTN_N);
    float out[KVS_ATTN_N];
    for (int i = 0; i < KVS_KINDS; i++) {
        CHECK_OK(kv_seq_create(st, &seq[i]));
        CHECK_OK(kvs_fill(st, seq[i], 70 + 13 * (uint32_t)i, (uint64_t)i + 1, i));
    }
    CHECK_OK(kv_seq_fork(st, seq[KVS_FP16], &seq[KVS_KINDS])); /* shares pages */
    for (int i = 0; i < N; i++) {
        CHECK_OK(kv_test_seq_take(st, seq[i], &ref[i]));
        CHECK_OK(kvs_attn(st, seq[i], att[i]));
    }

    /* the fork shares everything with FP16: nothing of those two moves */
    CHECK_OK(kv_seq_offload(st, seq[KVS_KINDS]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_KINDS]));
    CHECK_EQ(kvs_res(st, seq[KVS_KINDS]).on_file, 0);
    CHECK_OK(kv_seq_free(st, seq[KVS_KINDS])); /* now FP16's pages are its own */
    kv_stats_t s0 = kvs_stats(st);
    CHECK(s0.pages_by_format[KV_FMT_INT4] > 0 && s0.pages_by_format[KV_FMT_INT2] > 0 &&
          s0.pages_by_format[KV_FMT_MERGED] > 0);

    for (int i = 0; i < KVS_KINDS; i++)
        CHECK_OK(kv_seq_offload(st, seq[i]));
    for (int i = 0; i < KVS_KINDS; i++) {
        kv_residency_t r = kvs_res(st, seq[i]);
        CHECK(r.in_flight + r.on_file > 0); /* some pages left or are leaving */
        CHECK_OK(kv_seq_wait(st, seq[i]));
        r = kvs_res(st, seq[i]);
        CHECK_EQ(r.in_flight, 0);
        CHECK_EQ(r.lost, 0);
        CHECK_EQ(r.resident + r.on_file, r.pages);
        if (i == KVS_MERGED) /* the MERGED pages (refcount 2) stay */
            CHECK(r.resident == 2 * s0.pages_by_format[KV_FMT_MERGED] && r.on_file > 0);
        else
            CHECK(r.resident == 0 && r.on_file == r.pages);
    }
    CHECK_OK(kv_store_check(st));
    kv_stats_t s1 = kvs_stats(st);
    CHECK_EQ(s1.pages_used, s0.pages_by_format[KV_FMT_MERGED]);
    CHECK_EQ(s1.pages_by_format[KV_FMT_INT4], 0);
    CHECK_EQ(s1.pages_on_file, s0.pages_used - s1.pages_used);
    CHECK_EQ(s1.offload_slots_used, s1.pages_on_file);
    CHECK_EQ(s1.pages_out, s1.pages_on_file);
    CHECK_EQ(s1.bytes_out, s1.pages_out * s1.page_bytes);
    CHECK_EQ(s1.tokens, s0.tokens);
    CHECK_EQ(s1.io_errors, 0);

    /* not resident: every reader and every mutating call says so */
    for (int i = 0; i < KVS_KINDS; i++) {
        kv_seq_id_t q = seq[i], ch;
        float k[KVS_D];
        CHECK_EQ(kvs_attn(st, q, out), KV_ENOTRES);
        CHECK_EQ(kv_read(st, q, 2, 1, 0, 1, k, NULL, NULL), KV_ENOTRES);
        CHECK_EQ(kv_append(st, q, 2, 1, KV_DTYPE_F32, k, k, NULL), KV_ENOTRES);
        uint32_t keep = 0;
        CHECK_EQ(kv_compact(st, q, 2, 0, &keep, 1), KV_ENOTRES);
        CHECK_EQ(kv_seq_fork(st, q, &ch), KV_ENOTRES);
        CHECK_EQ(kv_seq_quantize(st, q, 2, 0), KV_ENOTRES);
        CHECK_EQ(kv_seq_set_format(st, q, 2, KV_FMT_INT4), KV_ENOTRES);
        CHECK_EQ(kv_seq_merge_layers(st, q, 3, NULL), KV_ENOTRES);
    }
    CHECK_OK(kv_store_check(st));
    kv_stats_t s2 = kvs_stats(st);
    CHECK_EQ(s2.pages_used, s1.pages_used);
    CHECK_EQ(s2.n_seqs, s1.n_seqs);

    for (int i = 0; i < KVS_KINDS; i++)
        CHECK_OK(kv_seq_prefetch(st, seq[i]));
    for (int i = 0; i < KVS_KINDS; i++) {
        CHECK_OK(kv_seq_wait(st, seq[i]));
        kv_residency_t r = kvs_res(st, seq[i]);
        CHECK(r.resident == r.pages && r.on_file == 0 && r.in_flight == 0);
        kv_test_seq_t now;
        CHECK_OK(kv_test_seq_take(st, seq[i], &now));
        CHECK(kv_test_seq_same(&ref[i], &now));
        kv_test_seq_free(&now);
        CHECK_OK(kvs_attn(st, seq[i], out));
        CHECK(memcmp(out, att[i], sizeof out) == 0);
    }
    kv_stats_t s3 = kvs_stats(st);
    CHECK_EQ(s3.pages_used, s0.pages_used); /* the fork shared all it had */
    CHECK_EQ(s3.pages_in, s1.pages_on_file);
    CHECK_EQ(s3.pages_on_file, 0);
    CHECK_EQ(s3.offload_slots_used, 0);
    CHECK_OK(kv_store_check(st));
    /* mutating calls work again */
    float k[KVS_D * KVS_KVH] = {0};
    CHECK_OK(kv_append(st, seq[KVS_INT4], 0, 1, KV_DTYPE_F32, k, k, NULL));

    /* prefetch right after offload (its writes unseen yet): everything back;
     * offload right after prefetch: everything out */
    kv_test_seq_t before, now;
    CHECK_OK(kv_test_seq_take(st, seq[KVS_INT4], &before));
    CHECK_OK(kv_seq_offload(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_prefetch(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_INT4]));
    kv_residency_t rr = kvs_res(st, seq[KVS_INT4]);
    CHECK(rr.pages > 0 && rr.resident == rr.pages);
    CHECK_OK(kv_seq_offload(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_prefetch(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_offload(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_INT4]));
    CHECK_EQ(kvs_res(st, seq[KVS_INT4]).on_file, rr.pages);
    CHECK_OK(kv_seq_prefetch(st, seq[KVS_INT4]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_INT4]));
    CHECK_OK(kv_test_seq_take(st, seq[KVS_INT4], &now));
    CHECK(kv_test_seq_same(&before, &now));
    kv_test_seq_free(&before);
    kv_test_seq_free(&now);

    /* free with writes in flight, then with reads in flight */
    CHECK_OK(kv_seq_offload(st, seq[KVS_INT2]));
    CHECK_OK(kv_seq_free(st, seq[KVS_INT2]));
    CHECK_OK(kv_seq_offload(st, seq[KVS_COMPACT]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_COMPACT]));
    CHECK_OK(kv_seq_prefetch(st, seq[KVS_COMPACT]));
    CHECK_OK(kv_seq_free(st, seq[KVS_COMPACT]));
    /* free of a sequence on the file */
    CHECK_OK(kv_seq_offload(st, seq[KVS_FP16]));
    CHECK_OK(kv_seq_wait(st, seq[KVS_FP16]));
    CHECK(kvs_stats(st).offload_slots_used > 0);
    CHECK_OK(kv_seq_free(st, seq[KVS_FP16]));
    kv_stats_t s4 = kvs_stats(st);
    CHECK_EQ(s4.offload_slots_used, 0);
    CHECK_EQ(s4.pages_on_file, 0);
    CHECK_EQ(s4.pages_in_flight, 0);
    CHECK_OK(kv_store_check(st));
    kv_offload_stats_t fs;
    kv_offload_stats(kv_store_off_file(st), &fs);
    CHECK(fs.staging_used == 0 && fs.ios_inflight == 0 && fs.batches_open == 0);
    printf("engine %s: %llu pages out, %llu in\n", fs.ioq,
           (unsigned long long)s4.pages_out, (unsigned long long)s4.pages_in);
    for (int i = 0; i < N; i++)
        kv_test_seq_free(&ref[i]);
    free(att);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

/* kv_config_t.offload_fault_ppm: every transfer faulted at 1e6, none at 0;
 * out and back, a sequence is bit-exact or reports lost pages. */
static void test_fault_knob(const kvt_dir_t *d)
{
    char p[4096];
    kvt_path(d, "faults.kvp", p);
    for (int on = 0; on < 2; on++) {
        kv_config_t c = kvs_config(p, KV_OFFLOAD_PREAD, 256, 256);
        c.offload_fault_ppm = on ? 1000000 : 0;
        c.offload_fault_seed = 5;
        kv_store_t *st = NULL;
        CHECK_OK(kv_store_create(&c, &st));
        kv_config_t back;
        CHECK_OK(kv_store_config(st, &back));
        CHECK_EQ(back.offload_fault_ppm, c.offload_fault_ppm);
        kv_seq_id_t q;
        kv_test_seq_t before, after;
        CHECK_OK(kv_seq_create(st, &q));
        CHECK_OK(kvs_fill(st, q, 200, 3, KVS_FP16));
        CHECK_OK(kv_test_seq_take(st, q, &before));
        CHECK_OK(kv_seq_offload(st, q));
        int wrc = kv_seq_wait(st, q);
        kv_residency_t r = kvs_res(st, q);
        CHECK(on ? wrc != 0 && r.on_file > 0 && r.resident > 0 /* some writes failed */
                 : wrc == 0 && r.on_file == r.pages);
        CHECK_OK(kv_seq_prefetch(st, q));
        int rrc = kv_seq_wait(st, q);
        r = kvs_res(st, q);
        kv_stats_t s = kvs_stats(st);
        if (on) {
            CHECK(s.offload_faults > 0 && s.io_errors > 0);
            CHECK(r.lost > 0 && rrc != 0); /* reported, never silent */
            CHECK_EQ(kv_test_seq_take(st, q, &after), KV_ENOTRES);
        } else {
            CHECK(s.offload_faults == 0 && s.io_errors == 0 && rrc == 0 && r.on_file == 0);
            CHECK_OK(kv_test_seq_take(st, q, &after));
            CHECK(kv_test_seq_same(&before, &after));
        }
        CHECK_OK(kv_store_check(st));
        CHECK_OK(kv_seq_free(st, q));
        s = kvs_stats(st);
        CHECK(s.offload_slots_used == 0 && s.pages_used == 0 && s.pages_lost == 0);
        kv_test_seq_free(&before);
        kv_test_seq_free(&after);
        kv_store_destroy(st);
        CHECK_OK(kv_offload_unlink(p));
    }
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    test_config(&d);
    test_fault_knob(&d);
    uint32_t eng[2];
    int n = kvt_ioqs(&d, eng);
    for (int i = 0; i < n; i++)
        test_roundtrip(&d, eng[i] == KV_OFFLOAD_IOQ_PREAD ? KV_OFFLOAD_PREAD : 0);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
