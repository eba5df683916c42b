/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_alloc.c — allocation failure injection (kv_fault_arm:
 * the Nth metadata or page allocation from now fails, N = 1, 2, ... until
 * the call succeeds) on the calls of the page-file tier:
 *   - kv_seq_offload, kv_seq_prefetch, kv_store_offload_sync: every failure
 *     returns KV_ENOMEM (or -ENOSPC: the file's slot pool refused) and leaves
 *     the store exactly as it was: residency, every stats counter, metadata
 *     bytes (kv_mem_live_bytes), kv_store_check;
 *   - attention and kv_append with KV_OFFLOAD_WAIT (they page in first):
 *     every failure returns KV_ENOMEM, contents unchanged, nothing leaked
 *     (residency may have changed: documented), and the call succeeds in
 *     the end with the exact result;
 *   - kv_store_offload_balance under injection: consistent after every
 *     failure (kv_store_check), nothing leaked.
 */
#include "test_store_offload_util.h"

typedef struct state {
    kv_stats_t st;
    kv_residency_t r;
    uint64_t live;
} state_t;

static state_t state_of(kv_store_t *st, kv_seq_id_t q)
{
    state_t s;
    memset(&s, 0, sizeof s);
    s.st = kvs_stats(st);
    s.st.alloc_failures = 0; /* counts the injected refusals themselves */
    s.r = kvs_res(st, q);
    s.live = kv_mem_live_bytes();
    return s;
}

static int same_state(const state_t *a, const state_t *b)
{
    return !memcmp(&a->st, &b->st, sizeof a->st) && !memcmp(&a->r, &b->r, sizeof a->r) &&
           a->live == b->live;
}

enum { OP_OFFLOAD, OP_PREFETCH, OP_SYNC };

/* Run op under injection until it succeeds; returns the failures seen. */
static int inject(kv_store_t *st, kv_seq_id_t q, int op)
{
    int fails = 0, rc = -1;
    for (uint64_t n = 1; rc != 0 && n < 100000; n++) {
        state_t before = state_of(st, q);
        kv_fault_arm(n);
        rc = op == OP_OFFLOAD ? kv_seq_offload(st, q)
             : op == OP_PREFETCH ? kv_seq_prefetch(st, q)
                                 : kv_store_offload_sync(st);
        kv_fault_arm(0);
        if (rc == 0)
            break;
        fails++;
        CHECK(rc == KV_ENOMEM || rc == -ENOSPC);
        state_t after = state_of(st, q);
        CHECK(same_state(&before, &after));
        CHECK_OK(kv_store_check(st));
    }
    CHECK_OK(rc);
    return fails;
}

int main(void)
{
    kvt_dir_t d;
    kvt_dir_make(&d);
    uint64_t live0 = kv_mem_live_bytes();
    char p[4096];
    kvt_path(&d, "al.kvp", p);
    kv_config_t c = kvs_config(p, KV_OFFLOAD_WAIT, 512, 512);
    kv_store_t *st;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t q[3];
    kv_test_seq_t ref[3];
    float att[3][KVS_ATTN_N], out[KVS_ATTN_N];
    for (int i = 0; i < 3; i++) {
        CHECK_OK(kv_seq_create(st, &q[i]));
        CHECK_OK(kvs_fill(st, q[i], 70, 7 + (uint64_t)i, i == 1 ? KVS_INT4 : KVS_FP16));
        CHECK_OK(kv_test_seq_take(st, q[i], &ref[i]));
        CHECK_OK(kvs_attn(st, q[i], att[i]));
    }

    int f1 = inject(st, q[0], OP_OFFLOAD);
    CHECK_OK(kv_seq_wait(st, q[0]));
    CHECK_EQ(kvs_res(st, q[0]).resident, 0);
    int f2 = inject(st, q[0], OP_SYNC); /* writes q[0]'s record */
    CHECK_EQ(kvs_stats(st).offload_slots_used, kvs_stats(st).pages_on_file + 1);
    int f3 = inject(st, q[0], OP_PREFETCH);
    CHECK_OK(kv_seq_wait(st, q[0]));
    kv_test_seq_t now;
    CHECK_OK(kv_test_seq_take(st, q[0], &now));
    CHECK(kv_test_seq_same(&now, &ref[0]));
    kv_test_seq_free(&now);
    printf("failures injected: offload %d, sync %d, prefetch %d\n", f1, f2, f3);
    CHECK(f1 >= 2 && f2 >= 2 && f3 >= 2);

    /* WAIT: attention and append page in under injection */
    for (int i = 1; i < 3; i++) {
        CHECK_OK(kv_seq_offload(st, q[i]));
        CHECK_OK(kv_seq_wait(st, q[i]));
    }
    int rc = -1, fa = 0;
    for (uint64_t n = 1; rc != 0 && n < 100000; n++) {
        uint64_t live = kv_mem_live_bytes();
        kv_fault_arm(n);
        rc = kvs_attn(st, q[1], out);
        kv_fault_arm(0);
        if (rc) {
            fa++;
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK_EQ(kv_mem_live_bytes(), live);
            CHECK_OK(kv_store_check(st));
        }
    }
    CHECK_OK(rc);
    CHECK(memcmp(out, att[1], sizeof out) == 0);
    float kv[KVS_KVH * KVS_D] = {0};
    rc = -1;
    int fb = 0;
    for (uint64_t n = 1; rc != 0 && n < 100000; n++) {
        kv_fault_arm(n);
        rc = kv_append(st, q[2], 1, 1, KV_DTYPE_F32, kv, kv, NULL);
        kv_fault_arm(0);
        if (rc) {
            fb++;
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK_OK(kv_store_check(st));
            uint32_t len;
            CHECK_OK(kv_seq_len(st, q[2], 1, 0, &len));
            CHECK_EQ(len, ref[2].l[KVS_KVH].n);
        }
    }
    CHECK_OK(rc);
    CHECK(fa >= 1 && fb >= 1);
    CHECK_OK(kv_test_seq_take(st, q[2], &now));
    CHECK(!memcmp(now.l[0].k, ref[2].l[0].k, sizeof(float) * ref[2].l[0].n * KVS_D));
    CHECK_EQ(now.l[KVS_KVH].n, ref[2].l[KVS_KVH].n + 1);
    kv_test_seq_free(&now);

    /* balance under injection: consistent, nothing leaked */
    kv_seq_id_t hog;
    CHECK_OK(kv_seq_create(st, &hog));
    float *big = calloc(16 * KVS_KVH * KVS_D, sizeof(float));
    for (uint32_t l = 0; kvs_stats(st).pages_used * 1000 <= 910 * 512; l = (l + 1) % KVS_LAYERS)
        CHECK_OK(kv_append(st, hog, l, 16, KV_DTYPE_F32, big, big, NULL));
    free(big);
    for (int i = 0; i < 3; i++)
        CHECK_OK(kvs_attn(st, q[i], out)); /* hog is the coldest */
    rc = -1;
    for (uint64_t n = 1; rc <= 0 && n < 100000; n++) {
        kv_fault_arm(n);
        rc = kv_store_offload_balance(st);
        kv_fault_arm(0);
        CHECK(rc > 0 || rc == KV_ENOMEM || rc == -ENOSPC);
        CHECK_OK(kv_store_check(st));
    }
    CHECK(rc > 0);
    CHECK(kvs_stats(st).pages_used * 1000 <= 750 * 512);
    CHECK_OK(kv_store_check(st));

    for (int i = 0; i < 3; i++)
        kv_test_seq_free(&ref[i]);
    kv_store_destroy(st);
    CHECK_OK(kv_offload_unlink(p));
    CHECK_EQ(kv_mem_live_bytes(), live0);
    kvt_dir_remove(&d);
    return kv_test_end();
}
