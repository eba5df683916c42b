/* SPDX-License-Identifier: MIT */
/*
 * test_page.c — the page table: creation, sequences, append (FP32 and FP16
 * input, across page boundaries, one token at a time and in chunks),
 * read-back, positions, value validation, index errors, pool exhaustion
 * (all-or-nothing), totals and metadata accounting, with
 * kv_page_table_check() after every step. A reference model (page_ref.h)
 * holds what every list must read back.
 */
#include "page_ref.h"

enum { L = 2, H = 3, D = 16 };

static void test_create_errors(void)
{
    kv_alloc_config_t ac = {.page_bytes = 256, .capacity = 8,
                            .tier = KV_TIER_HOST, .flags = KV_ALLOC_NO_TCACHE};
    kv_alloc_pool_t *pool;
    CHECK_OK(kv_alloc_pool_create(&ac, &pool));
    uint64_t mem0 = kv_mem_live_bytes();
    kv_page_table_config_t ok = {.geom = {.head_dim = 16, .page_bytes = 256},
                                 .n_layers = 1, .n_kv_heads = 1, .max_seqs = 1};
    kv_page_table_t *pt = NULL;
    CHECK_EQ(kv_page_table_create(NULL, pool, &pt), KV_EINVAL);
    CHECK_EQ(kv_page_table_create(&ok, NULL, &pt), KV_EINVAL);
    CHECK_EQ(kv_page_table_create(&ok, pool, NULL), KV_EINVAL);
    kv_page_table_config_t c = ok;
    c.n_layers = 0;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_EINVAL);
    c = ok, c.n_kv_heads = 0;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_EINVAL);
    c = ok, c.max_seqs = 0;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_EINVAL);
    c = ok, c.geom.page_bytes = 512; /* differs from the pool's */
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c = ok, c.geom.head_dim = 128; /* 256 bytes hold no 4*128-byte token */
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c = ok, c.geom.head_dim = 0;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    CHECK(pt == NULL);
    CHECK_EQ(kv_mem_live_bytes(), mem0);
    /* Injected metadata failure at create: KV_ENOMEM, nothing leaked. */
    int failures = 0;
    for (uint64_t n = 1; n < 10; n++) {
        kv_fault_arm(n);
        int rc = kv_page_table_create(&ok, pool, &pt);
        kv_fault_arm(0);
        if (rc == 0)
            break;
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK_EQ(kv_mem_live_bytes(), mem0);
        failures++;
    }
    CHECK(failures >= 1);
    CHECK(pt != NULL);
    kv_page_totals_t t;
    kv_page_table_totals(pt, &t);
    CHECK_EQ(t.meta_bytes, kv_mem_live_bytes() - mem0);
    CHECK_EQ(t.tokens, 0);
    CHECK(kv_page_table_pool(pt) == pool);
    CHECK_EQ(kv_page_table_geom(pt)->head_dim, 16);
    CHECK_OK(kv_page_table_check(pt));
    kv_page_table_destroy(pt);
    kv_page_table_destroy(NULL);
    CHECK_EQ(kv_mem_live_bytes(), mem0);
    kv_alloc_pool_destroy(pool);
}

static void test_seqs(void)
{
    fix_t f;
    fix_open(&f, L, H, D, 4, 5, 64);
    uint32_t ids[5], extra;
    uint8_t seen[5] = {0};
    for (int i = 0; i < 5; i++) {
        CHECK_OK(kv_page_seq_create(f.pt, &ids[i]));
        CHECK(ids[i] < 5);
        if (ids[i] < 5) {
            CHECK(!seen[ids[i]]);
            seen[ids[i]] = 1;
        }
        CHECK_EQ(kv_page_seq_live(f.pt, ids[i]), 1);
        CHECK_EQ(kv_page_seq_count(f.pt), i + 1);
        CHECK_OK(kv_page_table_check(f.pt));
        CHECK(meta_exact(&f));
    }
    CHECK_EQ(kv_page_seq_create(f.pt, &extra), KV_ELIMIT);
    CHECK_EQ(kv_page_seq_create(f.pt, NULL), KV_EINVAL);
    CHECK_OK(kv_page_seq_free(f.pt, ids[2]));
    CHECK_EQ(kv_page_seq_live(f.pt, ids[2]), 0);
    CHECK_EQ(kv_page_seq_free(f.pt, ids[2]), KV_ENOENT);
    CHECK_EQ(kv_page_seq_free(f.pt, 5), KV_ENOENT);
    CHECK_EQ(kv_page_seq_free(f.pt, UINT32_MAX), KV_ENOENT);
    CHECK_EQ(kv_page_seq_live(f.pt, 99), 0);
    CHECK_EQ(kv_page_seq_count(f.pt), 4);
    CHECK_OK(kv_page_table_check(f.pt));
    /* The freed id is the only one available, so it is reused. */
    CHECK_OK(kv_page_seq_create(f.pt, &extra));
    CHECK_EQ(extra, ids[2]);
    CHECK(kv_page_list_get(f.pt, extra, 0, 0) != NULL);
    CHECK_EQ(kv_page_list_get(f.pt, extra, 0, 0)->n_tokens, 0);
    CHECK(kv_page_list_get(f.pt, extra, L, 0) == NULL);
    CHECK(kv_page_list_get(f.pt, extra, 0, H) == NULL);
    CHECK(kv_page_list_get(f.pt, 77, 0, 0) == NULL);
    /* Injected failure at seq create: KV_ENOMEM, nothing changed. */
    CHECK_OK(kv_page_seq_free(f.pt, extra));
    uint64_t live = kv_mem_live_bytes();
    kv_fault_arm(1);
    CHECK_EQ(kv_page_seq_create(f.pt, &extra), KV_ENOMEM);
    kv_fault_arm(0);
    CHECK_EQ(kv_mem_live_bytes(), live);
    CHECK_EQ(kv_page_seq_count(f.pt), 4);
    CHECK_OK(kv_page_seq_create(f.pt, &extra));
    CHECK_EQ(kv_page_seq_count(f.pt), 5);
    CHECK_OK(kv_page_table_check(f.pt));
    fix_close(&f);
}

/* FP32 input, one token at a time and in chunks, lengths not multiples of
 * T; read-back equals FP16 rounding; entry structure is dense. */
static void test_fix_append(void)
{
    const uint32_t T = 3;
    fix_t f;
    fix_open(&f, L, H, D, T, 2, 256);
    uint64_t seed = 1;
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    for (int i = 0; i < 11; i++) { /* layer 0: 1 token at a time */
        CHECK_OK(fix_append(&f, &seed, s, 0, 1, NULL));
        CHECK_OK(kv_page_table_check(f.pt));
        CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    }
    uint32_t chunks[] = {13, 1, 2, 7, 6};
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        CHECK_OK(fix_append(&f, &seed, s, 1, chunks[i], NULL));
        CHECK_OK(kv_page_table_check(f.pt));
        CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
        CHECK(meta_exact(&f));
    }
    for (uint32_t h = 0; h < H; h++) {
        const kv_page_list_t *l0 = kv_page_list_get(f.pt, s, 0, h);
        const kv_page_list_t *l1 = kv_page_list_get(f.pt, s, 1, h);
        CHECK_EQ(l0->n_tokens, 11);
        CHECK_EQ(l0->n_ents, 4); /* ceil(11/3) */
        CHECK_EQ(l0->ents[3].n_tokens, 2);
        CHECK(l0->pos == NULL);
        CHECK_EQ(l1->n_tokens, 29);
        CHECK_EQ(l1->n_ents, 10); /* dense: 9 full pages + 2 tokens */
        for (uint32_t e = 0; e < l1->n_ents; e++)
            CHECK_EQ(l1->ents[e].format, KV_FMT_FP16);
        CHECK(l1->pos == NULL);
    }
    kv_page_totals_t t;
    kv_page_table_totals(f.pt, &t);
    CHECK_EQ(t.tokens, (11 + 29) * H);
    CHECK_EQ(t.pages_by_format[KV_FMT_FP16], (4 + 10) * H);
    CHECK_EQ(t.pages_by_format[KV_FMT_INT2], 0);
    CHECK_EQ(pool_used(&f), (4 + 10) * H);
    CHECK(meta_exact(&f));

    /* Partial reads at page boundaries, K only / V only / pos only. */
    float k[4 * D], v[4 * D];
    int32_t pos[4];
    ref_list_t *x = ref_at(&f.ref, s, 1, 2);
    CHECK_OK(kv_page_read(f.pt, s, 1, 2, 2, 4, k, NULL, pos));
    CHECK(memcmp(k, x->k + 2 * D, sizeof k) == 0);
    CHECK_EQ(pos[0], 2);
    CHECK_EQ(pos[3], 5);
    CHECK_OK(kv_page_read(f.pt, s, 1, 2, 25, 4, NULL, v, NULL));
    CHECK(memcmp(v, x->v + 25 * D, sizeof v) == 0);
    CHECK_OK(kv_page_read(f.pt, s, 1, 2, 29, 0, k, v, pos));
    CHECK_EQ(kv_page_read(f.pt, s, 1, 2, 26, 4, k, v, pos), KV_ERANGE);
    CHECK_EQ(kv_page_read(f.pt, s, 1, 2, UINT32_MAX, 2, k, v, pos), KV_ERANGE);
    CHECK_EQ(kv_page_read(f.pt, s, 1, H, 0, 1, k, v, pos), KV_ERANGE);
    CHECK_EQ(kv_page_read(f.pt, s, L, 0, 0, 1, k, v, pos), KV_ERANGE);
    CHECK_EQ(kv_page_read(f.pt, s + 1, 0, 0, 0, 1, k, v, pos), KV_ENOENT);
    /* kv_page_addr: the page bytes are the FP16 layout of kv_fmt_fp16.h. */
    const kv_page_list_t *l = kv_page_list_get(f.pt, s, 1, 2);
    const kv_half_t *pg = kv_page_addr(f.pt, l->ents[1].id);
    CHECK(pg != NULL);
    if (pg) {
        CHECK(kv_half_to_float(pg[1 * D + 5]) == x->k[(3 + 1) * D + 5]);
        CHECK(kv_half_to_float(pg[(T + 2) * D + 7]) == x->v[(3 + 2) * D + 7]);
    }
    fix_close(&f);
}

/* FP16 input is stored bit-exactly; mixing dtypes in one list. */
static void test_append_f16(void)
{
    const uint32_t T = 4;
    fix_t f;
    fix_open(&f, L, H, D, T, 2, 256);
    uint64_t seed = 7;
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    uint32_t chunks[] = {1, 5, 1, 1, 9, 3};
    size_t total = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        uint32_t n = chunks[c];
        size_t cnt = (size_t)n * H * D;
        kv_half_t *k = malloc(cnt * 2), *v = malloc(cnt * 2);
        float *kr = malloc(cnt * 4), *vr = malloc(cnt * 4);
        gen_f16(&seed, cnt, 1000.0f, k, kr);
        gen_f16(&seed, cnt, 1000.0f, v, vr);
        k[0] = 0x8000;  /* -0 */
        kr[0] = -0.0f;
        v[cnt - 1] = 0x0001; /* smallest subnormal */
        vr[cnt - 1] = kv_half_to_float(0x0001);
        CHECK_OK(kv_page_append(f.pt, s, 0, n, KV_DTYPE_F16, k, v, NULL));
        ref_append(&f.ref, s, 0, n, kr, vr, NULL);
        /* Bits in the page equal the input bits (token total+i, head h). */
        const kv_page_list_t *l = kv_page_list_get(f.pt, s, 0, 1);
        int same = 1;
        for (uint32_t i = 0; i < n; i++) {
            size_t t = total + i;
            kv_half_t *pg = (kv_half_t *)kv_page_addr(f.pt, l->ents[t / T].id);
            same &= memcmp(kv_fp16_k(pg, kv_page_table_geom(f.pt), T, t % T),
                           k + ((size_t)i * H + 1) * D, D * 2) == 0;
            same &= memcmp(kv_fp16_v(pg, kv_page_table_geom(f.pt), T, t % T),
                           v + ((size_t)i * H + 1) * D, D * 2) == 0;
        }
        CHECK(same);
        total += n;
        free(k), free(v), free(kr), free(vr);
        CHECK_OK(kv_page_table_check(f.pt));
        CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    }
    /* FP32 tokens after FP16 ones in the same list. */
    CHECK_OK(fix_append(&f, &seed, s, 0, 6, NULL));
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    /* Value 65504 (the FP16 max) is accepted, F32 and F16. */
    float big[H * D], bigr[H * D];
    for (int i = 0; i < H * D; i++)
        big[i] = bigr[i] = i % 2 ? 65504.0f : -65504.0f;
    CHECK_OK(kv_page_append(f.pt, s, 1, 1, KV_DTYPE_F32, big, big, NULL));
    ref_append(&f.ref, s, 1, 1, bigr, bigr, NULL);
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    fix_close(&f);
}

static void test_positions(void)
{
    const uint32_t T = 4;
    fix_t f;
    fix_open(&f, L, H, D, T, 2, 256);
    uint64_t seed = 3;
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    /* Explicit positions equal to the identity keep pos NULL. */
    int32_t id_pos[5] = {0, 1, 2, 3, 4};
    CHECK_OK(fix_append(&f, &seed, s, 0, 5, id_pos));
    CHECK(kv_page_list_get(f.pt, s, 0, 0)->pos == NULL);
    CHECK_OK(fix_append(&f, &seed, s, 0, 2, NULL)); /* continues 5, 6 */
    CHECK(kv_page_list_get(f.pt, s, 0, 0)->pos == NULL);
    CHECK(meta_exact(&f));
    /* A non-identity position materializes the array. */
    int32_t p2[3] = {100, 50, 51};
    CHECK_OK(fix_append(&f, &seed, s, 0, 3, p2));
    const kv_page_list_t *l = kv_page_list_get(f.pt, s, 0, 2);
    CHECK(l->pos != NULL);
    CHECK_EQ(kv_page_list_pos(l, 6), 6);
    CHECK_EQ(kv_page_list_pos(l, 7), 100);
    CHECK(meta_exact(&f));
    /* Continuation from one past the largest position: 101, 102, ... */
    CHECK_OK(fix_append(&f, &seed, s, 0, 9, NULL));
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, s, 0, 1), 10), 101);
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, s, 0, 1), 18), 109);
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    /* A list's first explicit positions (other layer). */
    int32_t p3[2] = {-5, 1000};
    CHECK_OK(fix_append(&f, &seed, s, 1, 2, p3));
    CHECK_OK(fix_append(&f, &seed, s, 1, 1, NULL)); /* 1001 */
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, s, 1, 0), 2), 1001);
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    /* Continuation past INT32_MAX is refused, nothing changes. */
    int32_t p4[1] = {INT32_MAX - 1};
    CHECK_OK(fix_append(&f, &seed, s, 1, 1, p4));
    snap_t a = {0}, b = {0};
    snap_take(&f, &a);
    CHECK_EQ(fix_append(&f, &seed, s, 1, 2, NULL), KV_ERANGE);
    snap_take(&f, &b);
    CHECK(snap_same(&a, &b));
    CHECK_OK(fix_append(&f, &seed, s, 1, 1, NULL)); /* INT32_MAX itself */
    CHECK_EQ(kv_page_list_pos(kv_page_list_get(f.pt, s, 1, 2), 4), INT32_MAX);
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    snap_free(&a), snap_free(&b);
    fix_close(&f);
}

/* Bad values and bad indices: an error and nothing stored. */
static void test_rejects(void)
{
    fix_t f;
    fix_open(&f, L, H, D, 4, 2, 64);
    uint64_t seed = 11;
    uint32_t s, dead;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    CHECK_OK(kv_page_seq_create(f.pt, &dead));
    CHECK_OK(kv_page_seq_free(f.pt, dead));
    f.ref.live[s] = 1;
    CHECK_OK(fix_append(&f, &seed, s, 0, 2, NULL)); /* partly filled tail */
    snap_t a = {0}, b = {0};
    snap_take(&f, &a);
    enum { N = 5 };
    float k[N * H * D], v[N * H * D];
    kv_half_t hk[N * H * D], hv[N * H * D];
    for (int i = 0; i < N * H * D; i++) {
        k[i] = v[i] = 0.5f;
        hk[i] = hv[i] = 0x3800; /* 0.5 */
    }
    float bad_f[] = {NAN, INFINITY, -INFINITY, 65505.0f, -70000.0f, 1e30f};
    for (size_t b_i = 0; b_i < sizeof bad_f / sizeof *bad_f; b_i++) {
        size_t at = (size_t)(b_i * 37) % (N * H * D);
        float keep = v[at];
        v[at] = bad_f[b_i]; /* one bad value anywhere rejects the call */
        CHECK_EQ(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F32, k, v, NULL),
                 KV_ERANGE);
        v[at] = keep;
        k[N * H * D - 1] = bad_f[b_i];
        CHECK_EQ(kv_page_append(f.pt, s, 1, N, KV_DTYPE_F32, k, v, NULL),
                 KV_ERANGE);
        k[N * H * D - 1] = 0.5f;
    }
    kv_half_t bad_h[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff};
    for (size_t b_i = 0; b_i < sizeof bad_h / sizeof *bad_h; b_i++) {
        hk[b_i * 11] = bad_h[b_i];
        CHECK_EQ(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F16, hk, hv, NULL),
                 KV_ERANGE);
        hk[b_i * 11] = 0x3800;
        hv[N * H * D - 1] = bad_h[b_i];
        CHECK_EQ(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F16, hk, hv, NULL),
                 KV_ERANGE);
        hv[N * H * D - 1] = 0x3800;
    }
    /* Indices, dtype, NULL buffers. */
    CHECK_EQ(kv_page_append(f.pt, s, L, N, KV_DTYPE_F32, k, v, NULL),
             KV_ERANGE);
    CHECK_EQ(kv_page_append(f.pt, dead, 0, N, KV_DTYPE_F32, k, v, NULL),
             KV_ENOENT);
    CHECK_EQ(kv_page_append(f.pt, 2, 0, N, KV_DTYPE_F32, k, v, NULL),
             KV_ENOENT);
    CHECK_EQ(kv_page_append(f.pt, s, 0, N, (kv_dtype_t)7, k, v, NULL),
             KV_EINVAL);
    CHECK_EQ(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F32, NULL, v, NULL),
             KV_EINVAL);
    CHECK_EQ(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F32, k, NULL, NULL),
             KV_EINVAL);
    CHECK_EQ(kv_page_append(NULL, s, 0, N, KV_DTYPE_F32, k, v, NULL),
             KV_EINVAL);
    CHECK_OK(kv_page_append(f.pt, s, 0, 0, KV_DTYPE_F32, NULL, NULL, NULL));
    snap_take(&f, &b);
    CHECK(snap_same(&a, &b));
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    /* The same buffers with good values go in. */
    CHECK_OK(kv_page_append(f.pt, s, 0, N, KV_DTYPE_F16, hk, hv, NULL));
    CHECK_EQ(kv_page_list_get(f.pt, s, 0, 0)->n_tokens, 2 + N);
    snap_free(&a), snap_free(&b);
    fix_close(&f);
}

/* A small pool runs out mid-append: KV_ENOMEM and nothing changed, for
 * every head (the pages of all heads are taken at once). */
static void test_exhaustion(void)
{
    const uint32_t T = 4;
    fix_t f;
    fix_open(&f, 1, H, D, T, 2, 10); /* 10 pages, 3 heads */
    uint64_t seed = 5;
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    CHECK_OK(fix_append(&f, &seed, s, 0, 5, NULL)); /* 2 pages/head = 6 */
    CHECK_EQ(pool_used(&f), 6);
    snap_t a = {0}, b = {0};
    snap_take(&f, &a);
    /* 8 more tokens: fill 3 in the tail, then 2 pages/head = 6 > 4 free. */
    CHECK_EQ(fix_append(&f, &seed, s, 0, 8, NULL), KV_ENOMEM);
    snap_take(&f, &b);
    CHECK(snap_same(&a, &b));
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    /* 7 more: fill 3, then 1 page/head = 3 <= 4 free. */
    CHECK_OK(fix_append(&f, &seed, s, 0, 7, NULL));
    CHECK_EQ(pool_used(&f), 9);
    /* Tokens that fit in the tails need no page: 12 tokens, tails full. */
    CHECK_EQ(kv_page_list_get(f.pt, s, 0, 0)->n_tokens, 12);
    CHECK_EQ(fix_append(&f, &seed, s, 0, 1, NULL), KV_ENOMEM);
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    kv_alloc_stats_t st;
    kv_alloc_stats(f.pool, &st);
    CHECK(st.failed >= 2);
    /* Freeing the sequence returns every page. */
    CHECK_OK(kv_page_seq_free(f.pt, s));
    ref_clear(&f.ref, s);
    CHECK_EQ(pool_used(&f), 0);
    kv_page_totals_t t;
    kv_page_table_totals(f.pt, &t);
    CHECK_EQ(t.tokens, 0);
    CHECK_EQ(t.pages_by_format[KV_FMT_FP16], 0);
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK(meta_exact(&f));
    snap_free(&a), snap_free(&b);
    fix_close(&f);
}

/* Injected allocation failures at every point of an append. */
typedef struct append_ctx {
    uint64_t seed;
    uint32_t s, layer, n;
    const int32_t *pos;
} append_ctx_t;

static int append_op(fix_t *f, void *ctx)
{
    append_ctx_t *c = ctx;
    uint64_t seed = c->seed; /* same data on every try */
    return fix_append(f, &seed, c->s, c->layer, c->n, c->pos);
}

static void test_append_faults(void)
{
    fix_t f;
    fix_open(&f, L, 20, D, 4, 2, 4096); /* 20 heads: heap scratch too */
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    int32_t pos[40];
    for (int i = 0; i < 40; i++)
        pos[i] = 1000 + 3 * i;
    append_ctx_t c1 = {.seed = 21, .s = s, .layer = 0, .n = 6, .pos = NULL};
    CHECK(fault_sweep(&f, append_op, &c1, 200) >= 1);
    append_ctx_t c2 = {.seed = 22, .s = s, .layer = 0, .n = 40, .pos = pos};
    CHECK(fault_sweep(&f, append_op, &c2, 200) >= 2);
    append_ctx_t c3 = {.seed = 23, .s = s, .layer = 0, .n = 1, .pos = NULL};
    int fails = fault_sweep(&f, append_op, &c3, 200);
    CHECK(fails >= 0);
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    CHECK(meta_exact(&f));
    fix_close(&f);
}

/* check() must catch what it promises to: each corruption below is made
 * by hand, detected, then undone. */
static void test_check_detects(void)
{
    fix_t f;
    fix_open(&f, 1, 1, D, 4, 2, 16);
    uint64_t seed = 13;
    uint32_t s;
    CHECK_OK(kv_page_seq_create(f.pt, &s));
    f.ref.live[s] = 1;
    CHECK_OK(fix_append(&f, &seed, s, 0, 6, NULL));
    CHECK_OK(kv_page_table_check(f.pt));
    fprintf(stderr, "(the kv_page_table_check lines below are expected)\n");
    kv_page_list_t *l = (kv_page_list_t *)kv_page_list_get(f.pt, s, 0, 0);
    /* A reference the table does not hold. */
    CHECK_OK(kv_alloc_retain(f.pool, l->ents[0].id));
    CHECK_EQ(kv_page_table_check(f.pt), KV_ECORRUPT);
    CHECK_EQ(kv_alloc_release(f.pool, l->ents[0].id), 0);
    CHECK_OK(kv_page_table_check(f.pt));
    /* A page held in the pool that no list names. */
    kv_page_id_t stray;
    CHECK_OK(kv_alloc_page(f.pool, &stray));
    CHECK_EQ(kv_page_table_check(f.pt), KV_ECORRUPT);
    CHECK_EQ(kv_alloc_release(f.pool, stray), 1);
    CHECK_OK(kv_page_table_check(f.pt));
    /* List length differs from its entries. */
    l->n_tokens++;
    CHECK_EQ(kv_page_table_check(f.pt), KV_ECORRUPT);
    l->n_tokens--;
    /* A partly filled entry that is not the last. */
    l->ents[0].n_tokens--;
    l->ents[1].n_tokens++;
    CHECK_EQ(kv_page_table_check(f.pt), KV_ECORRUPT);
    l->ents[0].n_tokens++;
    l->ents[1].n_tokens--;
    /* An entry naming a format that does not exist. */
    l->ents[1].format = 9;
    CHECK_EQ(kv_page_table_check(f.pt), KV_ECORRUPT);
    l->ents[1].format = KV_FMT_FP16;
    CHECK_OK(kv_page_table_check(f.pt));
    CHECK_EQ(ref_diff(f.pt, &f.ref), 0);
    fix_close(&f);
}

int main(void)
{
    test_create_errors();
    test_seqs();
    test_fix_append();
    test_append_f16();
    test_positions();
    test_rejects();
    test_exhaustion();
    test_append_faults();
    test_check_detects();
    return kv_test_end();
}
