/* SPDX-License-Identifier: MIT */
/*
 * test_offload_roundtrip.c — pages through a page file and back, with every
 * I/O queue this machine runs (io_uring, pread), several page sizes (64 B to
 * 64 KiB, and one that is not a power of two), every format tag, partial
 * payloads, buffered and O_DIRECT files.
 *
 * Checks: every page reads back byte-exact and nothing past its payload is
 * written in the caller's buffer; slot metadata (info) is what was written;
 * adjacent slots are coalesced; scattered slots keep queue_depth I/Os in
 * flight; freed slots are reused; a free during a read waits for the read;
 * bad input is refused and changes nothing; when all is freed no slot,
 * staging buffer, io or batch is left and kv_mem is back where it started.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

typedef struct page_desc {
    uint64_t key, gen;
    uint32_t bytes, tokens, format;
    kv_offload_slot_t slot;
} page_desc_t;

static uint8_t *g_data;    /* [n][page_bytes] source pages      */
static uint8_t *g_out;     /* [n][page_bytes] read-back buffers */
static uint8_t *g_scratch; /* [page_bytes]                      */

static void make_pages(page_desc_t *p, uint32_t n, uint32_t page_bytes, uint64_t *s,
                       uint64_t key0)
{
    for (uint32_t i = 0; i < n; i++) {
        p[i].key = key0 + i * 7919u;
        p[i].gen = 1 + kv_test_rand(s) % 5;
        p[i].bytes = i % 3 ? page_bytes : 1 + (uint32_t)(kv_test_rand(s) % page_bytes);
        p[i].tokens = (uint32_t)(kv_test_rand(s) % 65);
        p[i].format = i % KV_FMT_COUNT;
        kvt_fill(g_data + (size_t)i * page_bytes, p[i].bytes, p[i].key, p[i].gen);
    }
}

/* Write pages [0, n) in batches of the given sizes (cycled). */
static int write_pages(kv_offload_file_t *f, page_desc_t *p, uint32_t n,
                       uint32_t page_bytes)
{
    static const uint32_t sizes[] = {1, 7, 64, 3, 200};
    kv_offload_wpage_t w[200];
    kv_offload_slot_t slots[200];
    int status[200];
    int bad = 0;
    for (uint32_t i = 0, k = 0; i < n; k++) {
        uint32_t m = sizes[k % 5];
        if (m > n - i)
            m = n - i;
        for (uint32_t j = 0; j < m; j++)
            w[j] = (kv_offload_wpage_t){.key = p[i + j].key, .generation = p[i + j].gen,
                                        .data = g_data + (size_t)(i + j) * page_bytes,
                                        .bytes = p[i + j].bytes, .tokens = p[i + j].tokens,
                                        .format = p[i + j].format};
        int r = kv_offload_write(f, w, m, slots, status);
        bad += r != 0;
        for (uint32_t j = 0; j < m; j++) {
            bad += status[j] != 0 || slots[j] == KV_PAGE_ID_INVALID;
            p[i + j].slot = slots[j];
        }
        i += m;
    }
    return bad;
}

/* Read pages back in a shuffled order, batches of 13; count mismatches. */
static int read_check(kv_offload_file_t *f, const page_desc_t *p, uint32_t n,
                      uint32_t page_bytes, uint64_t *s)
{
    uint32_t *perm = malloc(n * sizeof *perm);
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(kv_test_rand(s) % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    memset(g_out, 0xA5, (size_t)n * page_bytes);
    int bad = 0;
    kv_offload_rpage_t q[13];
    int status[13];
    for (uint32_t i = 0; i < n; i += 13) {
        uint32_t m = n - i < 13 ? n - i : 13;
        for (uint32_t j = 0; j < m; j++) {
            const page_desc_t *d = &p[perm[i + j]];
            q[j] = (kv_offload_rpage_t){.slot = d->slot, .key = d->key, .generation = d->gen,
                                        .data = g_out + (size_t)perm[i + j] * page_bytes};
        }
        bad += kv_offload_read(f, q, m, status) != 0;
        for (uint32_t j = 0; j < m; j++)
            bad += status[j] != 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *o = g_out + (size_t)i * page_bytes;
        bad += !kvt_same(o, p[i].bytes, p[i].key, p[i].gen, g_scratch);
        for (uint32_t b = p[i].bytes; b < page_bytes; b++)
            if (o[b] != 0xA5) {
                bad++;
                break;
            }
        kv_offload_entry_t e;
        bad += kv_offload_info(f, p[i].slot, &e) != 0 || e.key != p[i].key ||
               e.generation != p[i].gen || e.bytes != p[i].bytes ||
               e.tokens != p[i].tokens || e.format != p[i].format || e.slot != p[i].slot;
    }
    free(perm);
    return bad;
}

static void roundtrip(const kvt_dir_t *dir, uint32_t ioq, uint32_t page_bytes,
                      uint32_t flags)
{
    enum { N = 300 };
    char path[4096];
    kvt_path(dir, "rt.kvp", path);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = page_bytes;
    c.capacity = N + 20;
    c.ioq = ioq;
    c.queue_depth = 32;
    c.flags = flags;
    kv_offload_file_t *f;
    int r = kv_offload_create(path, &c, &f);
    CHECK_OK(r);
    if (r)
        return;
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK(!strcmp(st.ioq, kvt_ioq_name(ioq)));
    CHECK_EQ(st.page_bytes, page_bytes);
    CHECK(st.slot_bytes >= page_bytes + KV_REC_PF_SLOT_BYTES && st.slot_bytes % st.align == 0);
    if (flags & KV_OFFLOAD_BUFFERED)
        CHECK_EQ(st.direct, 0);
    else if (!st.direct)
        fprintf(stderr, "note: O_DIRECT refused in %s, buffered fallback\n", dir->path);

    uint64_t s = page_bytes * 31u + ioq;
    page_desc_t p[N];
    make_pages(p, N, page_bytes, &s, 1000);
    CHECK_EQ(write_pages(f, p, N, page_bytes), 0);
    kv_offload_stats(f, &st);
    CHECK_EQ(st.pages_written, N);
    CHECK_EQ(st.slots_used, N);
    if (st.max_run > 1)
        CHECK(st.ios_coalesced > 0);
    CHECK_EQ(read_check(f, p, N, page_bytes, &s), 0);
    kv_offload_stats(f, &st);
    CHECK_EQ(st.pages_read, N);
    CHECK_EQ(st.pages_corrupt + st.pages_failed, 0);

    /* free every other page: later writes reuse those slots */
    kv_offload_slot_t fr[N / 2];
    for (uint32_t i = 0; i < N / 2; i++)
        fr[i] = p[2 * i].slot;
    CHECK_OK(kv_offload_free(f, fr, N / 2));
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, N - N / 2);
    CHECK_EQ(kv_offload_free(f, fr, 1), KV_ESTATE); /* already free */
    kv_offload_rpage_t q = {.slot = fr[0], .key = p[0].key, .generation = p[0].gen,
                            .data = g_out};
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_ESTATE);
    page_desc_t p2[N / 2];
    make_pages(p2, N / 2, page_bytes, &s, 5000000);
    CHECK_EQ(write_pages(f, p2, N / 2, page_bytes), 0);
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, N);
    CHECK_EQ(read_check(f, p2, N / 2, page_bytes, &s), 0);
    /* the odd pages of the first set are untouched by the rewrite (their
     * contents derive from key and generation, so g_data may be reused) */
    page_desc_t odd[N / 2];
    for (uint32_t i = 0; i < N / 2; i++)
        odd[i] = p[2 * i + 1];
    CHECK_EQ(read_check(f, odd, N / 2, page_bytes, &s), 0);

    kv_offload_slot_t all[N];
    for (uint32_t i = 0; i < N / 2; i++) {
        all[i] = odd[i].slot;
        all[N / 2 + i] = p2[i].slot;
    }
    CHECK_OK(kv_offload_free(f, all, N));
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 0);
    CHECK(kvt_idle(f));
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
}

/* Non-adjacent slots: every I/O is one slot, so queue_depth are in flight. */
static void scattered(const kvt_dir_t *dir, uint32_t ioq)
{
    enum { N = 512, PB = 4096 };
    char path[4096];
    kvt_path(dir, "sc.kvp", path);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = N;
    c.ioq = ioq;
    c.queue_depth = 32;
    kv_offload_file_t *f;
    CHECK_OK(kv_offload_create(path, &c, &f));
    uint64_t s = 99;
    page_desc_t p[N];
    make_pages(p, N, PB, &s, 1);
    CHECK_EQ(write_pages(f, p, N, PB), 0);
    kv_offload_slot_t fr[N / 2];
    page_desc_t keep[N / 2];
    for (uint32_t i = 0; i < N / 2; i++) {
        fr[i] = p[2 * i].slot;
        keep[i] = p[2 * i + 1];
    }
    CHECK_OK(kv_offload_free(f, fr, N / 2));
    kv_offload_stats_t st0, st;
    kv_offload_stats(f, &st0);
    /* one batch of all kept pages */
    kv_offload_rpage_t *q = malloc(N / 2 * sizeof *q);
    int status[N / 2];
    for (uint32_t i = 0; i < N / 2; i++)
        q[i] = (kv_offload_rpage_t){.slot = keep[i].slot, .key = keep[i].key,
                                    .generation = keep[i].gen,
                                    .data = g_out + (size_t)i * PB};
    CHECK_OK(kv_offload_read(f, q, N / 2, status));
    kv_offload_stats(f, &st);
    CHECK_EQ(st.ios_peak, 32);
    CHECK_EQ(st.ios_coalesced, st0.ios_coalesced); /* nothing adjacent */
    long bad = 0;
    for (uint32_t i = 0; i < N / 2; i++)
        bad += status[i] != 0 ||
               !kvt_same(g_out + (size_t)i * PB, keep[i].bytes, keep[i].key, keep[i].gen,
                         g_scratch);
    CHECK_EQ(bad, 0);

    /* a free while the read is in flight takes effect after it */
    kv_offload_ticket_t t;
    CHECK_OK(kv_offload_read_submit(f, q, 4, status, &t));
    kv_offload_slot_t victim = q[0].slot;
    CHECK_OK(kv_offload_free(f, &victim, 1));
    CHECK_EQ(kv_offload_free(f, &victim, 1), KV_ESTATE); /* being freed */
    CHECK_EQ(kv_offload_read_submit(f, q, 1, status, &t), KV_ESTATE);
    CHECK_OK(kv_offload_wait(f, t));
    CHECK(kvt_same(g_out, keep[0].bytes, keep[0].key, keep[0].gen, g_scratch));
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, N / 2 - 1);
    CHECK_EQ(kv_offload_wait(f, t), KV_ENOENT); /* spent */

    uint64_t n = 0;
    CHECK_OK(kv_offload_list(f, NULL, 0, &n));
    CHECK_EQ(n, N / 2 - 1);
    kv_offload_entry_t *all = malloc(n * sizeof *all);
    CHECK_OK(kv_offload_list(f, all, n, &n));
    kv_offload_slot_t *ids = malloc(n * sizeof *ids);
    for (uint64_t i = 0; i < n; i++) {
        ids[i] = all[i].slot;
        if (i)
            CHECK(all[i - 1].key < all[i].key);
    }
    CHECK_OK(kv_offload_free(f, ids, (uint32_t)n));
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 0);
    CHECK(kvt_idle(f));
    free(ids);
    free(all);
    free(q);
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
}

/* Bad input: refused, nothing changes. */
static void bad_input(const kvt_dir_t *dir, uint32_t ioq)
{
    char path[4096], path2[4096];
    kvt_path(dir, "bad.kvp", path);
    kvt_path(dir, "bad2.kvp", path2);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = 4096;
    c.capacity = 8;
    c.ioq = ioq;
    kv_offload_file_t *f, *g;
    kv_offload_config_t b = c;
    b.page_bytes = 100;
    CHECK_EQ(kv_offload_create(path, &b, &f), KV_ERANGE);
    b = c;
    b.capacity = 0;
    CHECK_EQ(kv_offload_create(path, &b, &f), KV_ERANGE);
    b = c;
    b.ioq = 7;
    CHECK_EQ(kv_offload_create(path, &b, &f), KV_EINVAL);
    b = c;
    b.fault.ppm[0] = 2000000;
    CHECK_EQ(kv_offload_create(path, &b, &f), KV_EINVAL);
    CHECK(access(path, F_OK) != 0); /* nothing left behind */
    CHECK_OK(kv_offload_create(path, &c, &f));
    CHECK_EQ(kv_offload_create(path, &c, &g), -EEXIST);
    CHECK_OK(kv_offload_create(path2, &c, &g));

    uint8_t data[4096] = {1};
    kv_offload_wpage_t w = {.key = 1, .generation = 1, .data = data, .bytes = 4096};
    kv_offload_slot_t slot, other;
    int status = 99;
    kv_offload_ticket_t t;
    kv_offload_wpage_t bw = w;
    bw.bytes = 0;
    CHECK_EQ(kv_offload_write(f, &bw, 1, &slot, &status), KV_EINVAL);
    bw.bytes = 4097;
    CHECK_EQ(kv_offload_write(f, &bw, 1, &slot, &status), KV_EINVAL);
    bw = w;
    bw.format = 256;
    CHECK_EQ(kv_offload_write(f, &bw, 1, &slot, &status), KV_EINVAL);
    bw = w;
    bw.data = NULL;
    CHECK_EQ(kv_offload_write(f, &bw, 1, &slot, &status), KV_EINVAL);
    CHECK_EQ(kv_offload_write(f, &w, 0, &slot, &status), KV_ERANGE);
    CHECK_EQ(kv_offload_write(f, &w, 1, NULL, &status), KV_EINVAL);
    CHECK_EQ(status, 99);
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 0);
    CHECK_EQ(st.batches_open, 0);

    CHECK_OK(kv_offload_write(f, &w, 1, &slot, &status));
    CHECK_EQ(status, 0);
    CHECK_OK(kv_offload_write(g, &w, 1, &other, NULL));
    kv_offload_rpage_t q = {.slot = slot, .key = 1, .generation = 2, .data = data};
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_ESTATE); /* wrong generation */
    q.generation = 1;
    q.key = 2;
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_ESTATE); /* wrong key */
    q.key = 1;
    q.slot = 0;
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_EINVAL);
    q.slot = other; /* another file's slot */
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_EINVAL);
    q.slot = slot;
    q.data = NULL;
    CHECK_EQ(kv_offload_read(f, &q, 1, NULL), KV_EINVAL);
    CHECK_EQ(kv_offload_poll(f, 12345), KV_ENOENT);
    CHECK_EQ(kv_offload_read_submit(f, &q, 1, NULL, NULL), KV_EINVAL);
    /* a free list with one bad id frees nothing */
    kv_offload_slot_t two[2] = {slot, other};
    CHECK_EQ(kv_offload_free(f, two, 2), KV_EINVAL);
    two[1] = slot;
    CHECK_EQ(kv_offload_free(f, two, 2), KV_ESTATE); /* listed twice */
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_used, 1);
    kv_offload_entry_t e;
    CHECK_EQ(kv_offload_info(f, other, &e), KV_EINVAL);
    CHECK_OK(kv_offload_free(f, &slot, 1));
    CHECK_EQ(kv_offload_info(f, slot, &e), KV_ESTATE);
    (void)t;
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_close(g));
    CHECK_OK(kv_offload_unlink(path));
    CHECK_OK(kv_offload_unlink(path2));
    CHECK_EQ(kv_offload_unlink(path), -ENOENT);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    uint32_t ioqs[2];
    int ne = kvt_ioqs(&dir, ioqs);
    g_data = malloc(300u << 16);
    g_out = malloc(300u << 16);
    g_scratch = malloc(1u << 16);
    static const uint32_t sizes[] = {64, 1088, 4096, 16384, 65536};
    for (int e = 0; e < ne; e++) {
        for (int i = 0; i < 5; i++)
            roundtrip(&dir, ioqs[e], sizes[i], 0);
        roundtrip(&dir, ioqs[e], 4096, KV_OFFLOAD_BUFFERED);
        roundtrip(&dir, ioqs[e], 4096, KV_OFFLOAD_NO_FIXED);
        scattered(&dir, ioqs[e]);
        bad_input(&dir, ioqs[e]);
    }
    free(g_data);
    free(g_out);
    free(g_scratch);
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
