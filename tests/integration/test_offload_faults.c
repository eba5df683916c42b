/* SPDX-License-Identifier: MIT */
/*
 * test_offload_faults.c — injected I/O faults never produce wrong data.
 *
 * For every I/O queue, one run per fault kind (EIO, ENOSPC, short transfers,
 * torn writes, bit flips, EAGAIN, EINTR; 25% of transfers) and one run with
 * all of them mixed, each a random workload of batched writes, reads and
 * frees over a page file (coalesced and scattered slots), until the run's
 * share of the fault budget has been injected. Then the faults stop, every
 * page whose write reported success is read back, the file is closed and
 * reopened, and everything is listed and read once more.
 *
 * Checks: 0 pages returned as good with wrong bytes (ever); 0 pages whose
 * write succeeded missing after the restart (silent loss) and nothing
 * listed that was not written; every failure is a reported error
 * (KV_ECORRUPT, -EIO, -ENOSPC, KV_EIO); the kinds that only delay (short,
 * EAGAIN, EINTR) cost no page at all; the kinds that damage data (torn,
 * flip) are caught as KV_ECORRUPT; after all is freed no slot, staging
 * buffer, io or batch is held and kv_mem is back to where it started.
 *
 * Budget: $KV_OFFLOAD_FAULTS injected faults per I/O queue (default 7000;
 * the acceptance run uses 100000). Prints one summary line per I/O queue.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

enum { PB = 4096, CAP = 1024, MAXB = 48 };

typedef struct tpage {
    uint64_t key, gen;
    uint32_t bytes;
    kv_offload_slot_t slot;
} tpage_t;

typedef struct tally {
    uint64_t faults, writes_ok, writes_err, reads_ok, reads_corrupt, reads_err;
    uint64_t silent, lost, extra, odd_err, final_corrupt;
} tally_t;

static uint8_t g_src[MAXB][PB], g_dst[MAXB][PB], g_scratch[PB];

static int reported(int st)
{
    return st == KV_ECORRUPT || st == -EIO || st == -ENOSPC || st == KV_EIO;
}

static uint64_t faults_of(kv_offload_file_t *f)
{
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    uint64_t n = 0;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        n += st.faults[k];
    return n;
}

/* Read pages (indices into p) in one batch; tally; returns statuses. */
static void read_batch(kv_offload_file_t *f, const tpage_t *p, const uint32_t *which,
                       uint32_t m, int *status, tally_t *t)
{
    kv_offload_rpage_t q[MAXB] = {{0}};
    for (uint32_t j = 0; j < m; j++)
        q[j] = (kv_offload_rpage_t){.slot = p[which[j]].slot, .key = p[which[j]].key,
                                    .generation = p[which[j]].gen, .data = g_dst[j]};
    memset(g_dst, 0, sizeof g_dst);
    int r = kv_offload_read(f, q, m, status);
    int first = 0;
    for (uint32_t j = 0; j < m; j++) {
        const tpage_t *pg = &p[which[j]];
        if (!first)
            first = status[j];
        if (status[j] == 0) {
            t->reads_ok++;
            t->silent += !kvt_same(g_dst[j], pg->bytes, pg->key, pg->gen, g_scratch);
        } else if (status[j] == KV_ECORRUPT) {
            t->reads_corrupt++;
        } else {
            t->reads_err++;
            t->odd_err += !reported(status[j]);
        }
    }
    t->odd_err += r != first;
}

static void one_run(const kvt_dir_t *dir, uint32_t ioq, const kv_offload_fault_t *fault,
                    uint64_t budget, uint64_t seed, tally_t *t)
{
    char path[4096];
    kvt_path(dir, "ft.kvp", path);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = CAP;
    c.ioq = ioq;
    c.queue_depth = 32;
    c.max_io_bytes = 64 << 10;
    kv_offload_file_t *f;
    CHECK_OK(kv_offload_create(path, &c, &f));
    CHECK_OK(kv_offload_set_fault(f, fault));
    static tpage_t p[CAP];
    uint32_t np = 0;
    uint64_t s = seed, next_key = 1;
    int status[MAXB];
    uint32_t which[MAXB];

    while (faults_of(f) < budget) {
        /* write a batch of new pages */
        uint32_t m = 1 + (uint32_t)(kv_test_rand(&s) % MAXB);
        if (m > CAP - np)
            m = CAP - np;
        kv_offload_wpage_t w[MAXB];
        kv_offload_slot_t slots[MAXB];
        tpage_t nw[MAXB];
        for (uint32_t j = 0; j < m; j++) {
            nw[j] = (tpage_t){.key = next_key++, .gen = kv_test_rand(&s) % 4,
                              .bytes = j % 4 ? PB : 1 + (uint32_t)(kv_test_rand(&s) % PB)};
            kvt_fill(g_src[j], nw[j].bytes, nw[j].key, nw[j].gen);
            w[j] = (kv_offload_wpage_t){.key = nw[j].key, .generation = nw[j].gen,
                                        .data = g_src[j], .bytes = nw[j].bytes,
                                        .tokens = j, .format = j % KV_FMT_COUNT};
        }
        if (m) {
            int r = kv_offload_write(f, w, m, slots, status);
            int first = 0;
            for (uint32_t j = 0; j < m; j++) {
                if (!first)
                    first = status[j];
                if (status[j] == 0) {
                    nw[j].slot = slots[j];
                    p[np++] = nw[j];
                    t->writes_ok++;
                } else {
                    t->writes_err++;
                    t->odd_err += !reported(status[j]) || slots[j] != KV_PAGE_ID_INVALID;
                }
            }
            t->odd_err += r != first;
        }
        /* read a random handful of stored pages */
        uint32_t k = np < MAXB ? np : 1 + (uint32_t)(kv_test_rand(&s) % MAXB);
        for (uint32_t j = 0; j < k; j++)
            which[j] = (uint32_t)(kv_test_rand(&s) % np);
        /* no duplicates within a batch, to keep the bookkeeping simple */
        for (uint32_t j = 1; j < k; j++)
            for (uint32_t i = 0; i < j; i++)
                if (which[i] == which[j]) {
                    which[j] = which[--k];
                    j--;
                    break;
                }
        if (k)
            read_batch(f, p, which, k, status, t);
        /* free some (the damaged ones and a random share) to make room */
        for (uint32_t j = 0; j < k; j++)
            if (status[j] == KV_ECORRUPT || (np > CAP / 2 && kv_test_rand(&s) % 2)) {
                uint32_t i = which[j];
                CHECK_OK(kv_offload_free(f, &p[i].slot, 1));
                p[i].slot = KV_PAGE_ID_INVALID;
            }
        uint32_t out = 0;
        for (uint32_t i = 0; i < np; i++)
            if (p[i].slot != KV_PAGE_ID_INVALID)
                p[out++] = p[i];
        np = out;
    }
    t->faults += faults_of(f);

    /* faults off: every page held reads right or is reported corrupt */
    kv_offload_fault_t none = {0};
    CHECK_OK(kv_offload_set_fault(f, &none));
    static int verdict[CAP];
    for (uint32_t i = 0; i < np; i += MAXB) {
        uint32_t m = np - i < MAXB ? np - i : MAXB;
        for (uint32_t j = 0; j < m; j++)
            which[j] = i + j;
        tally_t before = *t;
        read_batch(f, p, which, m, status, t);
        t->odd_err += t->reads_err != before.reads_err; /* no I/O errors now */
        for (uint32_t j = 0; j < m; j++)
            verdict[i + j] = status[j];
    }
    CHECK(kvt_idle(f));
    CHECK_OK(kv_offload_close(f));

    /* restart: the same pages, the same verdicts */
    kv_offload_config_t oc = c;
    oc.page_bytes = 0;
    CHECK_OK(kv_offload_open(path, &oc, &f));
    static kv_offload_entry_t e[CAP];
    uint64_t n = 0;
    CHECK_OK(kv_offload_list(f, e, CAP, &n));
    uint64_t found = 0;
    for (uint32_t i = 0; i < np; i++) {
        /* entries are sorted by key; keys are unique */
        uint64_t lo = 0, hi = n;
        while (lo < hi) {
            uint64_t mid = (lo + hi) / 2;
            if (e[mid].key < p[i].key)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < n && e[lo].key == p[i].key && e[lo].generation == p[i].gen &&
            e[lo].bytes == p[i].bytes) {
            p[i].slot = e[lo].slot;
            found++;
        } else {
            p[i].slot = KV_PAGE_ID_INVALID;
            t->lost++;
        }
    }
    t->extra += n - found; /* listed, but no page we wrote (keys are unique) */
    for (uint32_t i = 0; i < np; i += MAXB) {
        uint32_t m = 0;
        for (uint32_t j = i; j < np && j < i + MAXB; j++)
            if (p[j].slot != KV_PAGE_ID_INVALID)
                which[m++] = j;
        if (!m)
            continue;
        read_batch(f, p, which, m, status, t);
        for (uint32_t j = 0; j < m; j++) {
            t->odd_err += status[j] != verdict[which[j]];
            t->final_corrupt += status[j] == KV_ECORRUPT;
        }
    }
    kv_offload_slot_t ids[CAP];
    for (uint64_t i = 0; i < n; i++)
        ids[i] = e[i].slot;
    CHECK_OK(kv_offload_free(f, ids, (uint32_t)n));
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 0);
    CHECK(kvt_idle(f));
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
}

static void tally_add(tally_t *a, const tally_t *t)
{
    a->faults += t->faults;
    a->writes_ok += t->writes_ok;
    a->writes_err += t->writes_err;
    a->reads_ok += t->reads_ok;
    a->reads_corrupt += t->reads_corrupt;
    a->reads_err += t->reads_err;
    a->silent += t->silent;
    a->lost += t->lost;
    a->extra += t->extra;
    a->odd_err += t->odd_err;
    a->final_corrupt += t->final_corrupt;
}

static const char *const kind_name[KV_OFFLOAD_FAULT_COUNT] = {
    "eio", "enospc", "short", "torn", "flip", "eagain", "eintr"};

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    const char *env = getenv("KV_OFFLOAD_FAULTS");
    uint64_t budget = env && *env ? strtoull(env, NULL, 10) : 7000;
    if (budget < 2 * KV_OFFLOAD_FAULT_COUNT)
        budget = 2 * KV_OFFLOAD_FAULT_COUNT;
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    uint32_t ioqs[2];
    int ne = kvt_ioqs(&dir, ioqs);
    for (int e = 0; e < ne; e++) {
        tally_t all = {0};
        uint64_t per_kind = budget / (2 * KV_OFFLOAD_FAULT_COUNT);
        for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++) {
            kv_offload_fault_t fc = {.seed = 100 + (uint64_t)k};
            fc.ppm[k] = 250000;
            tally_t t = {0};
            one_run(&dir, ioqs[e], &fc, per_kind, 7 + (uint64_t)k, &t);
            printf("%s %-6s faults %6llu  writes ok %7llu err %6llu  reads ok %7llu "
                   "corrupt %5llu err %6llu  final corrupt %4llu\n",
                   kvt_ioq_name(ioqs[e]), kind_name[k], (unsigned long long)t.faults,
                   (unsigned long long)t.writes_ok, (unsigned long long)t.writes_err,
                   (unsigned long long)t.reads_ok, (unsigned long long)t.reads_corrupt,
                   (unsigned long long)t.reads_err, (unsigned long long)t.final_corrupt);
            int delay_only = k == KV_OFFLOAD_FAULT_SHORT || k == KV_OFFLOAD_FAULT_EAGAIN ||
                             k == KV_OFFLOAD_FAULT_EINTR;
            if (delay_only)
                CHECK_EQ(t.writes_err + t.reads_err + t.reads_corrupt, 0);
            if (k == KV_OFFLOAD_FAULT_TORN || k == KV_OFFLOAD_FAULT_FLIP)
                CHECK(t.reads_corrupt > 0);
            if (k == KV_OFFLOAD_FAULT_EIO || k == KV_OFFLOAD_FAULT_ENOSPC)
                CHECK(t.writes_err > 0 && t.reads_corrupt == 0);
            CHECK(t.faults >= per_kind);
            tally_add(&all, &t);
        }
        kv_offload_fault_t mix = {.seed = 4242};
        for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
            mix.ppm[k] = 40000;
        tally_t t = {0};
        one_run(&dir, ioqs[e], &mix, all.faults < budget ? budget - all.faults : 1, 99, &t);
        tally_add(&all, &t);
        printf("%s total: faults injected %llu, page writes ok %llu failed %llu, page reads "
               "ok %llu corrupt-reported %llu error-reported %llu; wrong data returned %llu, "
               "silently lost %llu, phantom %llu, unexpected status %llu\n",
               kvt_ioq_name(ioqs[e]), (unsigned long long)all.faults,
               (unsigned long long)all.writes_ok, (unsigned long long)all.writes_err,
               (unsigned long long)all.reads_ok, (unsigned long long)all.reads_corrupt,
               (unsigned long long)all.reads_err, (unsigned long long)all.silent,
               (unsigned long long)all.lost, (unsigned long long)all.extra,
               (unsigned long long)all.odd_err);
        CHECK(all.faults >= budget);
        CHECK_EQ(all.silent, 0);
        CHECK_EQ(all.lost, 0);
        CHECK_EQ(all.extra, 0);
        CHECK_EQ(all.odd_err, 0);
    }
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
