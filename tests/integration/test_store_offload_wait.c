/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_wait.c — non-resident pages met by calls, and I/O next
 * to attention on other threads:
 *   - without KV_OFFLOAD_WAIT: a completed prefetch is picked up by
 *     attention itself (no kv_seq_wait needed) — it answers KV_ENOTRES
 *     until then, then the exact result;
 *   - with KV_OFFLOAD_WAIT: attention, kv_read and kv_append page the
 *     sequence back in and give the exact result; several threads running
 *     attention on the same offloaded sequences at once all get it; a pool
 *     too small for the page-in gives KV_ENOMEM and changes nothing; a page
 *     whose read fails (100% injected EIO) is reported (attention's error,
 *     kv_seq_wait, residency.lost) and comes back once reads work again;
 *   - prefetch/offload/wait of some sequences while other threads run
 *     attention on other (resident) sequences: every attention result is
 *     exact, every round trip bit-exact.
 */
#include <pthread.h>

#include "test_store_offload_util.h"

enum { NS = 4 };

typedef struct job {
    kv_store_t *st;
    const kv_seq_id_t *seqs; /* [n] */
    uint32_t n;
    const float (*ref)[KVS_ATTN_N];
    int *stop;   /* set (atomically) to end the loop */
    int rounds;   /* stop after this many when > 0, else until *stop */
    long done, bad, err;
} job_t;

static void *attn_loop(void *arg)
{
    job_t *j = arg;
    float *out = malloc(sizeof(float) * KVS_ATTN_N);
    for (int r = 0;
         j->rounds ? r < j->rounds : !__atomic_load_n(j->stop, __ATOMIC_ACQUIRE); r++)
        for (uint32_t i = 0; i < j->n; i++) {
            int rc = kvs_attn(j->st, j->seqs[i], out);
            if (rc)
                j->err++;
            else if (memcmp(out, j->ref[i], sizeof(float) * KVS_ATTN_N))
                j->bad++;
            j->done++;
        }
    free(out);
    return NULL;
}

static void fill_all(kv_store_t *st, kv_seq_id_t *seq, kv_test_seq_t *ref,
                     float (*att)[KVS_ATTN_N], int n)
{
    for (int i = 0; i < n; i++) {
        CHECK_OK(kv_seq_create(st, &seq[i]));
        CHECK_OK(kvs_fill(st, seq[i], 60 + 7 * (uint32_t)i, 100 + (uint64_t)i,
                          i % 3 == 0 ? KVS_FP16 : i % 3 == 1 ? KVS_INT4 : KVS_INT2));
        CHECK_OK(kv_test_seq_take(st, seq[i], &ref[i]));
        CHECK_OK(kvs_attn(st, seq[i], att[i]));
    }
}

static void out_all(kv_store_t *st, const kv_seq_id_t *seq, int n)
{
    for (int i = 0; i < n; i++)
        CHECK_OK(kv_seq_offload(st, seq[i]));
    for (int i = 0; i < n; i++) {
        CHECK_OK(kv_seq_wait(st, seq[i]));
        CHECK_EQ(kvs_res(st, seq[i]).resident, 0);
    }
}

static void test_nowait(const kvt_dir_t *d)
{
    char p[4096];
    kvt_path(d, "nw.kvp", p);
    kv_config_t c = kvs_config(p, 0, 256, 512);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t seq[1];
    kv_test_seq_t ref[1];
    float att[1][KVS_ATTN_N], out[KVS_ATTN_N];
    fill_all(st, seq, ref, att, 1);
    out_all(st, seq, 1);
    CHECK_EQ(kvs_attn(st, seq[0], out), KV_ENOTRES);
    CHECK_OK(kv_seq_prefetch(st, seq[0]));
    int rc = KV_ENOTRES, tries = 0;
    while (rc == KV_ENOTRES && tries++ < 100000)
        rc = kvs_attn(st, seq[0], out); /* attention reaps the page-in */
    CHECK_OK(rc);
    CHECK(memcmp(out, att[0], sizeof out) == 0);
    CHECK_EQ(kvs_res(st, seq[0]).resident, kvs_res(st, seq[0]).pages);
    CHECK_OK(kv_store_check(st));
    kv_test_seq_free(&ref[0]);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

static void test_wait(const kvt_dir_t *d)
{
    char p[4096];
    kvt_path(d, "w.kvp", p);
    kv_config_t c = kvs_config(p, KV_OFFLOAD_WAIT, 512, 256);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t seq[NS];
    kv_test_seq_t ref[NS];
    float (*att)[KVS_ATTN_N] = malloc(sizeof(float) * NS * KVS_ATTN_N);
    float out[KVS_ATTN_N];
    fill_all(st, seq, ref, att, NS);

    /* attention pages in by itself */
    out_all(st, seq, NS);
    CHECK_OK(kvs_attn(st, seq[0], out));
    CHECK(memcmp(out, att[0], sizeof out) == 0);
    CHECK_EQ(kvs_res(st, seq[0]).on_file, 0);
    /* kv_read too */
    float k[KVS_D];
    CHECK_OK(kv_read(st, seq[1], 3, 1, 5, 1, k, NULL, NULL));
    CHECK(memcmp(k, ref[1].l[3 * KVS_KVH + 1].k + 5 * KVS_D, sizeof k) == 0);
    /* kv_append: pages in, then appends */
    float kv[KVS_KVH * KVS_D];
    for (uint32_t i = 0; i < KVS_KVH * KVS_D; i++)
        kv[i] = 0.25f * (float)(i % 7);
    CHECK_OK(kv_append(st, seq[2], 0, 1, KV_DTYPE_F32, kv, kv, NULL));
    kv_test_seq_t now;
    CHECK_OK(kv_test_seq_take(st, seq[2], &now));
    CHECK_EQ(now.l[0].n, ref[2].l[0].n + 1);
    CHECK(memcmp(now.l[1].k, ref[2].l[1].k, sizeof(float) * ref[2].l[1].n * KVS_D) == 0);
    kv_test_seq_free(&now);
    CHECK_OK(kv_store_check(st));

    /* several threads, same offloaded sequences, all at once */
    out_all(st, seq, 2);
    enum { T = 4 };
    pthread_t th[T];
    job_t jobs[T];
    int stop = 0;
    for (int t = 0; t < T; t++) {
        jobs[t] = (job_t){.st = st, .seqs = seq, .n = 2, .ref = (const float (*)[KVS_ATTN_N])att,
                          .stop = &stop, .rounds = 20};
        pthread_create(&th[t], NULL, attn_loop, &jobs[t]);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK_EQ(jobs[t].bad, 0);
        CHECK_EQ(jobs[t].err, 0);
        CHECK_EQ(jobs[t].done, 40);
    }
    CHECK_OK(kv_store_check(st));

    /* pool too small for the page-in: KV_ENOMEM, nothing changes */
    out_all(st, seq, 1);
    kv_residency_t r0 = kvs_res(st, seq[0]);
    kv_stats_t s0 = kvs_stats(st);
    kv_seq_id_t hog;
    CHECK_OK(kv_seq_create(st, &hog));
    float *big = calloc(16 * KVS_KVH * KVS_D, sizeof(float));
    for (uint32_t l = 0; kvs_stats(st).pages_free >= r0.pages; l = (l + 1) % KVS_LAYERS)
        if (kv_append(st, hog, l, 16, KV_DTYPE_F32, big, big, NULL))
            break;
    free(big);
    CHECK(kvs_stats(st).pages_free < r0.pages);
    int rc;
    CHECK_EQ(kvs_attn(st, seq[0], out), KV_ENOMEM);
    kv_residency_t r1 = kvs_res(st, seq[0]);
    CHECK(r1.on_file == r0.on_file && r1.resident == 0 && r1.in_flight == 0);
    CHECK_EQ(kvs_stats(st).pages_on_file, s0.pages_on_file);
    CHECK_OK(kv_seq_free(st, hog));
    CHECK_OK(kv_store_check(st));

    /* every read fails: reported, then recovered */
    kv_offload_fault_t f = {.seed = 5};
    f.ppm[KV_OFFLOAD_FAULT_EIO] = 1000000;
    CHECK_OK(kv_store_off_set_fault(st, &f));
    rc = kvs_attn(st, seq[0], out);
    CHECK(rc == -EIO);
    kv_residency_t r2 = kvs_res(st, seq[0]);
    CHECK(r2.lost == r2.on_file && r2.lost == r0.on_file);
    CHECK_EQ(kv_seq_wait(st, seq[0]), -EIO);
    CHECK_EQ(kv_seq_wait(st, seq[0]), -EIO); /* for as long as pages are lost */
    CHECK(kvs_stats(st).pages_lost == r2.lost && kvs_stats(st).io_errors >= r2.lost);
    CHECK_EQ(kv_read(st, seq[0], 0, 0, 0, 1, k, NULL, NULL), -EIO);
    CHECK_OK(kv_store_check(st));
    memset(f.ppm, 0, sizeof f.ppm);
    CHECK_OK(kv_store_off_set_fault(st, &f));
    CHECK_OK(kvs_attn(st, seq[0], out));
    CHECK(memcmp(out, att[0], sizeof out) == 0);
    CHECK_OK(kv_seq_wait(st, seq[0]));
    CHECK_EQ(kvs_stats(st).pages_lost, 0);
    CHECK_OK(kv_test_seq_take(st, seq[0], &now));
    CHECK(kv_test_seq_same(&now, &ref[0]));
    kv_test_seq_free(&now);
    CHECK_OK(kv_store_check(st));

    for (int i = 0; i < NS; i++)
        kv_test_seq_free(&ref[i]);
    free(att);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

/* Page-outs and page-ins of seqs[2..] while threads attend seqs[0..2). */
static void test_prefetch_beside_attention(const kvt_dir_t *d)
{
    char p[4096];
    kvt_path(d, "pa.kvp", p);
    kv_config_t c = kvs_config(p, 0, 512, 512);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    enum { N = 6 };
    kv_seq_id_t seq[N];
    kv_test_seq_t ref[N];
    float (*att)[KVS_ATTN_N] = malloc(sizeof(float) * N * KVS_ATTN_N);
    fill_all(st, seq, ref, att, N);
    enum { T = 2 };
    pthread_t th[T];
    job_t jobs[T];
    int stop = 0;
    for (int t = 0; t < T; t++) {
        jobs[t] = (job_t){.st = st, .seqs = seq, .n = 2,
                          .ref = (const float (*)[KVS_ATTN_N])att, .stop = &stop};
        pthread_create(&th[t], NULL, attn_loop, &jobs[t]);
    }
    int rounds = 0, same = 0;
    for (; rounds < 30; rounds++) {
        for (int i = 2; i < N; i++)
            CHECK_OK(kv_seq_offload(st, seq[i]));
        for (int i = 2; i < N; i++)
            CHECK_OK(kv_seq_wait(st, seq[i]));
        for (int i = 2; i < N; i++)
            CHECK_OK(kv_seq_prefetch(st, seq[i]));
        for (int i = 2; i < N; i++) {
            CHECK_OK(kv_seq_wait(st, seq[i]));
            kv_test_seq_t now;
            CHECK_OK(kv_test_seq_take(st, seq[i], &now));
            same += kv_test_seq_same(&now, &ref[i]);
            kv_test_seq_free(&now);
        }
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    long done = 0;
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK_EQ(jobs[t].bad, 0);
        CHECK_EQ(jobs[t].err, 0);
        done += jobs[t].done;
    }
    CHECK_EQ(same, rounds * (N - 2));
    CHECK(done > 0);
    printf("%d offload/prefetch rounds of %d sequences beside %ld attention calls\n",
           rounds, N - 2, done);
    CHECK_OK(kv_store_check(st));
    for (int i = 0; i < N; i++)
        kv_test_seq_free(&ref[i]);
    free(att);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    test_nowait(&d);
    test_wait(&d);
    test_prefetch_beside_attention(&d);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
