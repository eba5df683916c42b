/* SPDX-License-Identifier: MIT */
/*
 * test_api_errors.c — bad input through every public function.
 *
 * Each bad call must return its exact error code (where kvpage.h leaves two
 * codes equally defensible the test says so and accepts both), leave the
 * store exactly as it was (statistics, every tracked list's contents and
 * positions, kv_mem_live_bytes), pass kv_store_check(), and leave the store
 * usable: a valid append followed by a decode works right after.
 * Covered: NULL store / out pointers / buffers; every config field out of
 * range or inconsistent; layer, head, token index out of range; unknown,
 * freed and huge sequence ids; non-finite and out-of-FP16-range values (F32
 * and F16 input, anywhere in a multi-page append); bad compaction keep lists;
 * attention on empty lists, short stats strides, bad prefill row counts;
 * max_seqs and pool exhaustion; kv_strerror and kv_version.
 *
 * The store is owned by main(); test buffers use malloc.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_snap.h"

#define NL 2
#define NKV 2
#define NQ 4
#define HD 16
#define TPP 16
#define PAGE_BYTES (64 * HD)
#define POOL 40
#define MAX_SEQS 8
#define MAX_TRACK MAX_SEQS

/* ---- fixture and snapshots ------------------------------------------- */

static kv_store_t *S;
static kv_seq_id_t track[MAX_TRACK]; /* sequences whose contents are compared */
static int n_track;
static kv_seq_id_t USE; /* the untracked sequence the usability probe uses */
static uint64_t rng = 7;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

/* The store as the API shows it (kv_test_snap.h): statistics, live
 * metadata bytes, every tracked list. */
static void snap_take(kv_test_snap_t *sn)
{
    CHECK_OK(kv_test_snap_take(S, track, (uint32_t)n_track, kv_mem_live_bytes(), sn));
}

/* A valid append of one token to USE at layer 0, then a decode of it. USE
 * is compacted to its last 8 tokens now and then so it stays small. */
static void usable(int line)
{
    static const uint32_t last8[8] = {16, 17, 18, 19, 20, 21, 22, 23};
    float k[NKV * HD], v[NKV * HD], q[NQ * HD], out[NQ * HD];
    uint32_t len = 0;
    CHECK_OK(kv_seq_len(S, USE, 0, 0, &len));
    if (len == 24)
        for (uint32_t h = 0; h < NKV; h++)
            CHECK_OK(kv_compact(S, USE, 0, h, last8, 8));
    for (int i = 0; i < NKV * HD; i++) {
        k[i] = kv_test_randf(&rng);
        v[i] = kv_test_randf(&rng);
    }
    for (int i = 0; i < NQ * HD; i++)
        q[i] = kv_test_randf(&rng);
    int rc = kv_append(S, USE, 0, 1, KV_DTYPE_F32, k, v, NULL);
    kv_decode_t d = {.layer = 0, .batch = 1, .seqs = &USE, .q = q, .out = out};
    int rc2 = rc ? rc : kv_attn_decode(S, &d);
    if (rc || rc2)
        fprintf(stderr, "line %d: store not usable after the error: %d %d\n",
                line, rc, rc2);
    CHECK(rc == 0 && rc2 == 0 && isfinite(out[0]) && isfinite(out[NQ * HD - 1]));
}

/* rc must be want (or want2 when the header allows both; pass want twice
 * otherwise); the store must be unchanged and, if probe, still usable. */
static void expect_rc(int rc, int want, int want2, const kv_test_snap_t *before,
                      const char *call, int line, int probe)
{
    kv_test_snap_t after;
    if (rc == want || rc == want2) {
        kv_test_pass_++;
    } else {
        kv_test_fail_++;
        fprintf(stderr, "line %d: %s returned %d (%s), want %d (%s)\n", line,
                call, rc, kv_strerror(rc), want, kv_strerror(want));
    }
    snap_take(&after);
    if (kv_test_snap_diff(before, &after)) {
        kv_test_fail_++;
        fprintf(stderr, "line %d: %s changed the store\n", line, call);
    }
    kv_test_snap_free(&after);
    CHECK_OK(kv_store_check(S));
    if (probe)
        usable(line);
}

#define EXPECT2(want, want2, call)                                \
    do {                                                          \
        kv_test_snap_t b_;                                        \
        snap_take(&b_);                                           \
        int rc_ = (call);                                         \
        expect_rc(rc_, want, want2, &b_, #call, __LINE__, 1);     \
        kv_test_snap_free(&b_);                                   \
    } while (0)
#define EXPECT(want, call) EXPECT2(want, want, call)
/* Same, without the usability probe (the pool is full). */
#define EXPECT_NOPROBE(want, call)                                \
    do {                                                          \
        kv_test_snap_t b_;                                        \
        snap_take(&b_);                                           \
        int rc_ = (call);                                         \
        expect_rc(rc_, want, want, &b_, #call, __LINE__, 0);      \
        kv_test_snap_free(&b_);                                   \
    } while (0)

static kv_config_t good_config(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL;
    c.n_q_heads = NQ;
    c.n_kv_heads = NKV;
    c.head_dim = HD;
    c.page_bytes = PAGE_BYTES;
    c.host_pages = POOL;
    c.max_seqs = MAX_SEQS;
    c.n_threads = 1;
    return c;
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kv_test_randf(&rng);
}

/* ---- config ------------------------------------------------------------ */

/* kv_store_create(cfg) must fail with want (or want2), set nothing, leak
 * nothing. */
static void create_fails(const kv_config_t *cfg, int want, int want2, int line)
{
    kv_store_t *s = (kv_store_t *)&rng; /* sentinel */
    uint64_t live = kv_mem_live_bytes();
    int rc = kv_store_create(cfg, &s);
    if (rc != want && rc != want2) {
        kv_test_fail_++;
        fprintf(stderr, "line %d: kv_store_create returned %d (%s), want %d (%s)\n",
                line, rc, kv_strerror(rc), want, kv_strerror(want));
    } else {
        kv_test_pass_++;
    }
    CHECK(s == (kv_store_t *)&rng); /* *out set only on success */
    CHECK_EQ(kv_mem_live_bytes(), live);
    if (rc == 0 && s != (kv_store_t *)&rng)
        kv_store_destroy(s);
}

#define CREATE_FAILS(field, value, want)                                 \
    do {                                                                 \
        kv_config_t c_ = good_config();                                  \
        c_.field = value;                                                \
        create_fails(&c_, want, want, __LINE__);                         \
    } while (0)

static void test_config(void)
{
    kv_config_t d = kv_config_default();
    CHECK_EQ(d.struct_size, sizeof(kv_config_t));
    CHECK_EQ(d.version, KV_CONFIG_VERSION);
    CHECK(d.n_layers == 0 && d.n_q_heads == 0 && d.n_kv_heads == 0 &&
          d.head_dim == 0 && d.host_pages == 0);
    CHECK_EQ(d.backend, KV_BACKEND_CPU);

    kv_store_t *s = (kv_store_t *)&rng;
    kv_config_t c = good_config();
    create_fails(NULL, KV_EINVAL, KV_EINVAL, __LINE__);
    CHECK_EQ(kv_store_create(&c, NULL), KV_EINVAL);
    create_fails(&d, KV_ERANGE, KV_EINVAL, __LINE__); /* shape left zero */

    CREATE_FAILS(struct_size, 0, KV_EVERSION);
    CREATE_FAILS(struct_size, sizeof(kv_config_t) - 4, KV_EVERSION);
    CREATE_FAILS(struct_size, sizeof(kv_config_t) + 8, KV_EVERSION);
    CREATE_FAILS(version, 0, KV_EVERSION);
    CREATE_FAILS(version, KV_CONFIG_VERSION + 1, KV_EVERSION);
    CREATE_FAILS(n_layers, 0, KV_ERANGE);
    CREATE_FAILS(n_layers, 4097, KV_ERANGE);
    CREATE_FAILS(n_kv_heads, 0, KV_ERANGE);
    CREATE_FAILS(n_kv_heads, 1025, KV_ERANGE);
    CREATE_FAILS(n_q_heads, 3, KV_EINVAL); /* not a multiple of 2 */
    CREATE_FAILS(n_q_heads, 5, KV_EINVAL);
    CREATE_FAILS(head_dim, 0, KV_ERANGE);
    CREATE_FAILS(head_dim, 8, KV_ERANGE);
    CREATE_FAILS(head_dim, 24, KV_ERANGE); /* not a multiple of 16 */
    CREATE_FAILS(head_dim, 1040, KV_ERANGE);
    CREATE_FAILS(head_dim, 1u << 31, KV_ERANGE);
    CREATE_FAILS(page_bytes, 32, KV_ERANGE);        /* < one token (64 B) */
    CREATE_FAILS(page_bytes, 100, KV_ERANGE);       /* not a multiple of 64 */
    CREATE_FAILS(page_bytes, PAGE_BYTES + 1, KV_ERANGE);
    CREATE_FAILS(host_pages, 0, KV_ERANGE);
    CREATE_FAILS(host_pages, (1ull << 26) + 1, KV_ERANGE);
    CREATE_FAILS(host_pages, 1ull << 40, KV_ERANGE);
    CREATE_FAILS(max_seqs, (1u << 20) + 1, KV_ERANGE);
    CREATE_FAILS(backend, 7, KV_EINVAL); /* unknown enum */
    CREATE_FAILS(backend, KV_BACKEND_CUDA, KV_ENOTSUP);
    {   /* page_bytes one multiple of 64 short of one token at head_dim 64 */
        kv_config_t c2 = good_config();
        c2.head_dim = 64;
        c2.page_bytes = 192;
        create_fails(&c2, KV_ERANGE, KV_ERANGE, __LINE__);
        c2.page_bytes = 256; /* exactly one FP16 token: valid */
        s = NULL;
        CHECK_OK(kv_store_create(&c2, &s));
        kv_stats_t st = {.struct_size = sizeof st};
        if (s) {
            CHECK_OK(kv_store_stats(s, &st));
            CHECK_EQ(st.fp16_tokens_per_page, 1);
            kv_store_destroy(s);
        }
    }

    /* the smallest valid store, defaults resolved in kv_store_config */
    c = kv_config_default();
    c.n_layers = 1;
    c.n_q_heads = 1;
    c.n_kv_heads = 1;
    c.head_dim = 16;
    c.host_pages = 1;
    s = NULL;
    CHECK_OK(kv_store_create(&c, &s));
    if (s) {
        kv_config_t r;
        memset(&r, 0, sizeof r);
        CHECK_OK(kv_store_config(s, &r));
        CHECK_EQ(r.page_bytes, 64 * 16);
        CHECK_EQ(r.max_seqs, 1024);
        CHECK(r.n_threads >= 1);
        CHECK_EQ(r.host_pages, 1);
        CHECK_EQ(r.struct_size, sizeof(kv_config_t));
        kv_store_destroy(s);
    }
    kv_store_destroy(NULL); /* a no-op */
}

/* ---- kv_strerror / kv_version ----------------------------------------- */

static void test_strerror(void)
{
    static const int codes[] = {KV_OK,     KV_EINVAL,  KV_ENOMEM,   KV_ERANGE,
                                KV_ENOENT, KV_ESTATE,  KV_ENOTSUP,  KV_EVERSION,
                                KV_ECORRUPT, KV_EIO,   KV_ELIMIT};
    enum { NC = sizeof codes / sizeof codes[0] };
    char msg[NC][256];
    for (int i = 0; i < NC; i++) {
        const char *m = kv_strerror(codes[i]);
        CHECK(m != NULL && m[0] != '\0');
        snprintf(msg[i], sizeof msg[i], "%s", m ? m : "");
        for (int j = 0; j < i; j++)
            if (strcmp(msg[i], msg[j]) == 0) {
                kv_test_fail_++;
                fprintf(stderr, "kv_strerror(%d) == kv_strerror(%d): \"%s\"\n",
                        codes[i], codes[j], msg[i]);
            }
    }
    /* -errno passes through: sensible, distinct per errno, not a KV_E text */
    static const int errs[] = {ENOENT, EIO, ENOSPC, EAGAIN, EBADF};
    char em[5][256];
    for (int i = 0; i < 5; i++) {
        const char *m = kv_strerror(-errs[i]);
        CHECK(m != NULL && m[0] != '\0');
        snprintf(em[i], sizeof em[i], "%s", m ? m : "");
        for (int j = 0; j < i; j++)
            CHECK(strcmp(em[i], em[j]) != 0);
        for (int j = 1; j < NC; j++)
            CHECK(strcmp(em[i], msg[j]) != 0);
    }
    /* unknown codes: never NULL, never empty */
    static const int unknown[] = {-999, -1000, -1011, -5000, 1, 12345, INT_MIN,
                                  INT_MAX};
    for (int i = 0; i < 8; i++) {
        const char *m = kv_strerror(unknown[i]);
        CHECK(m != NULL && m[0] != '\0');
    }
    const char *v = kv_version();
    unsigned a, b, c;
    char tail;
    CHECK(v != NULL);
    CHECK(v && sscanf(v, "%u.%u.%u%c", &a, &b, &c, &tail) == 3);
}

/* ---- store-level errors ------------------------------------------------ */

static kv_seq_id_t A, E, P, DEAD; /* A: tokens in every list; E: empty;   */
                                  /* P: layer 0 only; DEAD: freed          */

/* Ids are reused after free: after creating sequences, take a fresh DEAD id
 * (created and freed again; the store ends as it was). */
static void refresh_dead(void)
{
    CHECK_OK(kv_seq_create(S, &DEAD));
    CHECK_OK(kv_seq_free(S, DEAD));
}

static void append_n(kv_seq_id_t seq, uint32_t layer, uint32_t n)
{
    float *k = xmalloc((size_t)n * NKV * HD * 4), *v = xmalloc((size_t)n * NKV * HD * 4);
    fill(k, (size_t)n * NKV * HD);
    fill(v, (size_t)n * NKV * HD);
    CHECK_OK(kv_append(S, seq, layer, n, KV_DTYPE_F32, k, v, NULL));
    free(k);
    free(v);
}

static void test_handles(void)
{
    kv_config_t c;
    kv_stats_t st = {.struct_size = sizeof st};
    kv_seq_id_t id;
    uint32_t len;
    const kv_seq_id_t huge = 0xFFFFFFFFu, never = MAX_SEQS + 17;

    EXPECT(KV_EINVAL, kv_store_config(NULL, &c));
    EXPECT(KV_EINVAL, kv_store_config(S, NULL));
    {   /* a size the library cannot serve: KV_EVERSION, nothing written */
        struct {
            kv_config_t c;
            unsigned char tail[64];
        } p;
        const uint32_t bad[] = {0, 8, (uint32_t)sizeof p.c - 8, (uint32_t)sizeof p};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            memset(&p, 0x5A, sizeof p);
            EXPECT(KV_EVERSION, kv_store_config_into(S, &p.c, bad[i]));
            const unsigned char *b = (const unsigned char *)&p;
            size_t changed = 0;
            for (size_t j = 0; j < sizeof p; j++)
                changed += b[j] != 0x5A;
            CHECK_EQ(changed, 0);
        }
        EXPECT(KV_EINVAL, kv_store_config_into(NULL, &p.c, (uint32_t)sizeof p.c));
    }
    EXPECT(KV_EINVAL, kv_store_stats(NULL, &st));
    EXPECT(KV_EINVAL, kv_store_stats(S, NULL));
    EXPECT(KV_EINVAL, kv_store_check(NULL));
    EXPECT(KV_EINVAL, kv_seq_create(NULL, &id));
    EXPECT(KV_EINVAL, kv_seq_create(S, NULL));
    EXPECT(KV_EINVAL, kv_seq_free(NULL, A));
    EXPECT(KV_ENOENT, kv_seq_free(S, DEAD));
    EXPECT(KV_ENOENT, kv_seq_free(S, never));
    EXPECT(KV_ENOENT, kv_seq_free(S, huge));
    EXPECT(KV_ENOENT, kv_seq_free(S, MAX_SEQS));
    EXPECT(KV_EINVAL, kv_seq_fork(NULL, A, &id));
    EXPECT(KV_EINVAL, kv_seq_fork(S, A, NULL));
    EXPECT(KV_ENOENT, kv_seq_fork(S, DEAD, &id));
    EXPECT(KV_ENOENT, kv_seq_fork(S, huge, &id));
    EXPECT(KV_EINVAL, kv_seq_len(NULL, A, 0, 0, &len));
    EXPECT(KV_EINVAL, kv_seq_len(S, A, 0, 0, NULL));
    EXPECT(KV_ENOENT, kv_seq_len(S, DEAD, 0, 0, &len));
    EXPECT(KV_ENOENT, kv_seq_len(S, never, 0, 0, &len));
    EXPECT(KV_ERANGE, kv_seq_len(S, A, NL, 0, &len));
    EXPECT(KV_ERANGE, kv_seq_len(S, A, 0, NKV, &len));
    EXPECT(KV_ERANGE, kv_seq_len(S, A, 0xFFFFFFFFu, 0, &len));

    /* max_seqs live: create and fork hit KV_ELIMIT */
    kv_stats_t s0 = {.struct_size = sizeof s0};
    CHECK_OK(kv_store_stats(S, &s0));
    kv_seq_id_t extra[MAX_SEQS];
    int n_extra = 0;
    while (s0.n_seqs + (uint64_t)n_extra < MAX_SEQS) {
        int rc = kv_seq_create(S, &extra[n_extra]);
        CHECK_OK(rc);
        if (rc)
            break;
        n_extra++;
    }
    EXPECT_NOPROBE(KV_ELIMIT, kv_seq_create(S, &id));
    EXPECT_NOPROBE(KV_ELIMIT, kv_seq_fork(S, A, &id));
    for (int i = 0; i < n_extra; i++)
        CHECK_OK(kv_seq_free(S, extra[i]));
    refresh_dead();
    usable(__LINE__);
}

static void test_append(void)
{
    enum { N = 20 }; /* crosses a page boundary */
    float k[N * NKV * HD], v[N * NKV * HD];
    uint16_t kh[N * NKV * HD], vh[N * NKV * HD];
    fill(k, N * NKV * HD);
    fill(v, N * NKV * HD);
    for (int i = 0; i < N * NKV * HD; i++)
        kh[i] = vh[i] = 0x3C00; /* 1.0 */

    EXPECT(KV_EINVAL, kv_append(NULL, A, 0, N, KV_DTYPE_F32, k, v, NULL));
    EXPECT(KV_EINVAL, kv_append(S, A, 0, N, KV_DTYPE_F32, NULL, v, NULL));
    EXPECT(KV_EINVAL, kv_append(S, A, 0, N, KV_DTYPE_F32, k, NULL, NULL));
    EXPECT(KV_EINVAL, kv_append(S, A, 0, N, (kv_dtype_t)2, k, v, NULL));
    EXPECT(KV_EINVAL, kv_append(S, A, 0, N, (kv_dtype_t)-1, k, v, NULL));
    EXPECT(KV_ERANGE, kv_append(S, A, NL, N, KV_DTYPE_F32, k, v, NULL));
    EXPECT(KV_ERANGE, kv_append(S, A, 0xFFFFFFFFu, N, KV_DTYPE_F32, k, v, NULL));
    EXPECT(KV_ENOENT, kv_append(S, DEAD, 0, N, KV_DTYPE_F32, k, v, NULL));
    EXPECT(KV_ENOENT, kv_append(S, 0xFFFFFFFFu, 0, N, KV_DTYPE_F32, k, v, NULL));
    /* n_tokens == 0 is a no-op (the snapshot check proves nothing changed) */
    EXPECT(0, kv_append(S, A, 0, 0, KV_DTYPE_F32, k, v, NULL));
    EXPECT(0, kv_append(S, E, 1, 0, KV_DTYPE_F16, kh, vh, NULL));
    /* header: "n_tokens == 0 is a no-op"; NULL buffers with nothing to read
     * could also be refused as bad arguments */
    EXPECT2(0, KV_EINVAL, kv_append(S, A, 0, 0, KV_DTYPE_F32, NULL, NULL, NULL));

    /* values: non-finite or |x| > 65504, anywhere, in K or V -> KV_ERANGE */
    static const float bad_f[] = {NAN, INFINITY, -INFINITY, 65505.0f,
                                  -65505.0f, 65504.5f, 65520.0f, 1e30f};
    static const size_t where[] = {0, NKV * HD - 1, (N - 1) * NKV * HD + HD + 3,
                                   N * NKV * HD - 1};
    for (int i = 0; i < 8; i++)
        for (int w = 0; w < 4; w++)
            for (int in_v = 0; in_v < 2; in_v++) {
                float *x = in_v ? v : k;
                float save = x[where[w]];
                x[where[w]] = bad_f[i];
                EXPECT(KV_ERANGE, kv_append(S, A, 1, N, KV_DTYPE_F32, k, v, NULL));
                EXPECT(KV_ERANGE, kv_append(S, E, 0, N, KV_DTYPE_F32, k, v, NULL));
                x[where[w]] = save;
            }
    static const uint16_t bad_h[] = {0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01};
    for (int i = 0; i < 5; i++)
        for (int w = 0; w < 4; w++)
            for (int in_v = 0; in_v < 2; in_v++) {
                uint16_t *x = in_v ? vh : kh;
                x[where[w]] = bad_h[i];
                EXPECT(KV_ERANGE, kv_append(S, A, 1, N, KV_DTYPE_F16, kh, vh, NULL));
                x[where[w]] = 0x3C00;
            }

    /* the largest finite FP16 values are accepted and stored exactly */
    float big_k[NKV * HD], big_v[NKV * HD], rk[HD], rv[HD];
    for (int i = 0; i < NKV * HD; i++) {
        big_k[i] = (i & 1) ? -65504.0f : 65504.0f;
        big_v[i] = (i & 1) ? 65504.0f : -65504.0f;
    }
    uint32_t len0;
    CHECK_OK(kv_seq_len(S, A, 1, 1, &len0));
    CHECK_OK(kv_append(S, A, 1, 1, KV_DTYPE_F32, big_k, big_v, NULL));
    CHECK_OK(kv_read(S, A, 1, 1, len0, 1, rk, rv, NULL));
    CHECK(memcmp(rk, big_k + HD, sizeof rk) == 0 &&
          memcmp(rv, big_v + HD, sizeof rv) == 0);
    uint16_t max_h[NKV * HD];
    for (int i = 0; i < NKV * HD; i++)
        max_h[i] = (i & 1) ? 0xFBFF : 0x7BFF; /* -+65504 */
    CHECK_OK(kv_append(S, A, 1, 1, KV_DTYPE_F16, max_h, max_h, NULL));
    CHECK_OK(kv_read(S, A, 1, 0, len0 + 1, 1, rk, NULL, NULL));
    CHECK(rk[0] == 65504.0f && rk[1] == -65504.0f);
}

static void test_read_compact(void)
{
    uint32_t len;
    float k[64 * HD], v[64 * HD];
    int32_t pos[64];
    CHECK_OK(kv_seq_len(S, A, 0, 1, &len));
    CHECK(len >= 20 && len < 64);

    EXPECT(KV_EINVAL, kv_read(NULL, A, 0, 0, 0, 1, k, v, pos));
    EXPECT(KV_ENOENT, kv_read(S, DEAD, 0, 0, 0, 1, k, v, pos));
    EXPECT(KV_ENOENT, kv_read(S, 0xFFFFFFFFu, 0, 0, 0, 1, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, NL, 0, 0, 1, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, 0, NKV, 0, 1, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, 0, 1, 0, len + 1, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, 0, 1, len, 1, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, 0, 1, len - 3, 4, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, A, 0, 1, 0xFFFFFFFFu, 2, k, v, pos)); /* wraps */
    EXPECT(KV_ERANGE, kv_read(S, A, 0, 1, 2, 0xFFFFFFFFu, k, v, pos));
    EXPECT(KV_ERANGE, kv_read(S, E, 0, 0, 0, 1, k, v, pos));
    /* valid reads with any output left NULL */
    EXPECT(0, kv_read(S, A, 0, 1, len - 4, 4, NULL, NULL, NULL));
    EXPECT(0, kv_read(S, A, 0, 1, 0, len, NULL, v, NULL));

    static const uint32_t ok_keep[] = {0, 1, 2};
    uint32_t keep[70];
    EXPECT(KV_EINVAL, kv_compact(NULL, A, 0, 1, ok_keep, 3));
    EXPECT(KV_EINVAL, kv_compact(S, A, 0, 1, NULL, 3));
    EXPECT(KV_ENOENT, kv_compact(S, DEAD, 0, 1, ok_keep, 3));
    EXPECT(KV_ERANGE, kv_compact(S, A, NL, 1, ok_keep, 3));
    EXPECT(KV_ERANGE, kv_compact(S, A, 0, NKV, ok_keep, 3));
    keep[0] = 0, keep[1] = 1, keep[2] = 1; /* repeated */
    EXPECT(KV_EINVAL, kv_compact(S, A, 0, 1, keep, 3));
    keep[0] = 3, keep[1] = 2; /* decreasing */
    EXPECT(KV_EINVAL, kv_compact(S, A, 0, 1, keep, 2));
    keep[0] = 0, keep[1] = len; /* one past the end */
    EXPECT(KV_ERANGE, kv_compact(S, A, 0, 1, keep, 2));
    keep[0] = 0xFFFFFFFFu;
    EXPECT(KV_ERANGE, kv_compact(S, A, 0, 1, keep, 1));
    for (uint32_t i = 0; i <= len; i++) /* more indices than tokens */
        keep[i] = i;
    EXPECT(KV_ERANGE, kv_compact(S, A, 0, 1, keep, len + 1));
    /* the index error is found before anything moves: valid prefix first */
    for (uint32_t i = 0; i < len - 1; i++)
        keep[i] = i + 1;
    keep[len - 1] = len + 5;
    EXPECT(KV_ERANGE, kv_compact(S, A, 0, 1, keep, len));
    keep[len - 2] = keep[len - 3];
    keep[len - 1] = len - 1;
    EXPECT(KV_EINVAL, kv_compact(S, A, 0, 1, keep, len));
}

static void test_attention(void)
{
    enum { MAXB = 3, MAXN = 64 };
    float q[MAXN * NQ * HD], out[MAXN * NQ * HD];
    float st0[NKV * 128], st1[NKV * 128], st2[NKV * 128];
    float *stats[MAXB] = {st0, st1, st2};
    kv_seq_id_t seqs[MAXB] = {A, P, A};
    uint32_t lenA0 = 0, lenA1 = 0, lenA;
    fill(q, sizeof q / sizeof q[0]);
    CHECK_OK(kv_seq_len(S, A, 0, 0, &lenA0));
    CHECK_OK(kv_seq_len(S, A, 0, 1, &lenA1));
    lenA = lenA0 > lenA1 ? lenA0 : lenA1;

    kv_decode_t d = {.layer = 0, .batch = 2, .seqs = seqs, .q = q, .out = out};
    kv_decode_t x;
    EXPECT(KV_EINVAL, kv_attn_decode(NULL, &d));
    EXPECT(KV_EINVAL, kv_attn_decode(S, NULL));
    x = d, x.batch = 0;
    EXPECT(KV_EINVAL, kv_attn_decode(S, &x));
    x = d, x.seqs = NULL;
    EXPECT(KV_EINVAL, kv_attn_decode(S, &x));
    x = d, x.q = NULL;
    EXPECT(KV_EINVAL, kv_attn_decode(S, &x));
    x = d, x.out = NULL;
    EXPECT(KV_EINVAL, kv_attn_decode(S, &x));
    x = d, x.layer = NL;
    EXPECT(KV_ERANGE, kv_attn_decode(S, &x));
    kv_seq_id_t bad[MAXB] = {A, DEAD, P};
    x = d, x.seqs = bad, x.batch = 3;
    EXPECT(KV_ENOENT, kv_attn_decode(S, &x));
    kv_seq_id_t empty[MAXB] = {A, E, A};
    x = d, x.seqs = empty, x.batch = 3;
    EXPECT(KV_ESTATE, kv_attn_decode(S, &x));
    x = d, x.layer = 1, x.seqs = seqs + 1, x.batch = 1; /* P has no layer 1 */
    EXPECT(KV_ESTATE, kv_attn_decode(S, &x));
    x = d, x.stats = stats, x.stats_stride = lenA - 1; /* too short for A */
    EXPECT(KV_ERANGE, kv_attn_decode(S, &x));
    x = d, x.stats = stats, x.stats_stride = 0;
    EXPECT(KV_ERANGE, kv_attn_decode(S, &x));
    x = d, x.stats = stats, x.stats_stride = lenA; /* exactly long enough */
    EXPECT(0, kv_attn_decode(S, &x));
    x = d, x.seqs = seqs, x.batch = 3; /* duplicates are allowed */
    EXPECT(0, kv_attn_decode(S, &x));

    /* one head of a sequence compacted to nothing: decode sees an empty list */
    kv_seq_id_t tmp;
    CHECK_OK(kv_seq_fork(S, A, &tmp));
    uint32_t none = 0;
    CHECK_OK(kv_compact(S, tmp, 0, 1, &none, 0));
    uint32_t tl = 99;
    CHECK_OK(kv_seq_len(S, tmp, 0, 1, &tl));
    CHECK_EQ(tl, 0);
    x = d, x.seqs = &tmp, x.batch = 1;
    EXPECT(KV_ESTATE, kv_attn_decode(S, &x));
    CHECK_OK(kv_seq_free(S, tmp));
    refresh_dead();

    uint32_t minA = lenA0 < lenA1 ? lenA0 : lenA1;
    kv_prefill_t p = {.layer = 0, .seq = A, .n_new = 4, .q = q, .out = out};
    kv_prefill_t y;
    EXPECT(KV_EINVAL, kv_attn_prefill(NULL, &p));
    EXPECT(KV_EINVAL, kv_attn_prefill(S, NULL));
    y = p, y.q = NULL;
    EXPECT(KV_EINVAL, kv_attn_prefill(S, &y));
    y = p, y.out = NULL;
    EXPECT(KV_EINVAL, kv_attn_prefill(S, &y));
    y = p, y.n_new = 0; /* "1..list length": zero size or out of range */
    EXPECT2(KV_EINVAL, KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.n_new = minA + 1;
    EXPECT(KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.n_new = 0xFFFFFFFFu;
    EXPECT(KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.layer = NL;
    EXPECT(KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.seq = DEAD;
    EXPECT(KV_ENOENT, kv_attn_prefill(S, &y));
    y = p, y.seq = E, y.n_new = 1; /* empty: 1 > length 0 (or wrong state) */
    EXPECT2(KV_ERANGE, KV_ESTATE, kv_attn_prefill(S, &y));
    y = p, y.stats = st0, y.stats_stride = lenA - 1;
    EXPECT(KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.stats = st0, y.stats_stride = lenA, y.stats_row0 = 5; /* > n_new */
    EXPECT(KV_ERANGE, kv_attn_prefill(S, &y));
    y = p, y.stats = st0, y.stats_stride = lenA, y.stats_row0 = 3;
    EXPECT(0, kv_attn_prefill(S, &y));
    y = p, y.n_new = minA; /* the whole list is new */
    EXPECT(0, kv_attn_prefill(S, &y));
}

/* Keep the first n tokens of one list (drops whole pages or one token). */
static void truncate_list(kv_seq_id_t seq, uint32_t layer, uint32_t head,
                          uint32_t n)
{
    uint32_t *keep = xmalloc((size_t)n * 4);
    for (uint32_t i = 0; i < n; i++)
        keep[i] = i;
    CHECK_OK(kv_compact(S, seq, layer, head, keep, n));
    free(keep);
}

/* Run the pool dry: appends fail with KV_ENOMEM and change nothing, also
 * when one head could get its page and the next could not, and for
 * copy-on-write and shared compaction. */
static void test_exhaustion(void)
{
    kv_seq_id_t X, F, G;
    kv_stats_t st = {.struct_size = sizeof st};
    uint32_t len;
    float k[TPP * NKV * HD], v[TPP * NKV * HD];
    fill(k, TPP * NKV * HD);
    fill(v, TPP * NKV * HD);
    CHECK_OK(kv_seq_create(S, &X));
    track[n_track++] = X;
    CHECK_OK(kv_store_stats(S, &st));
    while (st.pages_free >= NKV) { /* whole pages: NKV per 16 tokens */
        int rc = kv_append(S, X, 0, TPP, KV_DTYPE_F32, k, v, NULL);
        CHECK_OK(rc);
        CHECK_OK(kv_store_stats(S, &st));
        if (rc)
            return;
    }
    CHECK(st.pages_free < NKV);
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 0, TPP, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_seq_len(S, X, 0, 0, &len));
    if (st.pages_free == 0) { /* drop head 0's last page */
        truncate_list(X, 0, 0, len - TPP);
        CHECK_OK(kv_store_stats(S, &st));
    }
    CHECK_EQ(st.pages_free, 1);
    /* one free page, two heads needing one each: all or nothing */
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 1, 1, KV_DTYPE_F32, k, v, NULL));
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 1, TPP, KV_DTYPE_F32, k, v, NULL));
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 0, 1, KV_DTYPE_F32, k, v, NULL));
    /* head 0 of layer 0 keeps one token less: room in its tail page; head 1
     * takes the last free page */
    CHECK_OK(kv_seq_len(S, X, 0, 0, &len));
    truncate_list(X, 0, 0, len - 1);
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_free, 1);
    CHECK_OK(kv_append(S, X, 0, 1, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_free, 0);
    /* now head 0 is full and head 1 has room: head 0 cannot get a page */
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 0, 1, KV_DTYPE_F32, k, v, NULL));
    /* a fork takes no page, even now; its first append must copy the shared
     * partly filled tail of head 1, for which there is no page */
    CHECK_OK(kv_seq_fork(S, X, &F));
    track[n_track++] = F;
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_free, 0);
    CHECK_OK(kv_seq_len(S, F, 0, 1, &len));
    CHECK(len % TPP != 0);
    CHECK_OK(kv_seq_len(S, F, 0, 0, &len));
    CHECK(len % TPP == 0);
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, F, 0, 1, KV_DTYPE_F32, k, v, NULL));
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, X, 0, 1, KV_DTYPE_F32, k, v, NULL));
    /* compaction of shared pages needs a fresh page: none */
    static const uint32_t keep2[] = {1, 2, 3};
    EXPECT_NOPROBE(KV_ENOMEM, kv_compact(S, F, 0, 1, keep2, 3));
    EXPECT_NOPROBE(KV_ENOMEM, kv_compact(S, X, 0, 0, keep2, 3));
    /* a new sequence needs no page, its first token does */
    CHECK_OK(kv_seq_create(S, &G));
    EXPECT_NOPROBE(KV_ENOMEM, kv_append(S, G, 1, 1, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_seq_free(S, G));
    /* freeing gives the pages back: usable again */
    CHECK_OK(kv_seq_free(S, F));
    CHECK_OK(kv_seq_free(S, X));
    n_track -= 2;
    CHECK_OK(kv_store_check(S));
    usable(__LINE__);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    test_strerror();
    test_config();
    CHECK_EQ(kv_mem_live_bytes(), live0);

    kv_config_t cfg = good_config();
    CHECK_OK(kv_store_create(&cfg, &S));
    if (!S)
        return kv_test_end();
    CHECK_OK(kv_seq_create(S, &A));
    CHECK_OK(kv_seq_create(S, &E));
    CHECK_OK(kv_seq_create(S, &P));
    CHECK_OK(kv_seq_create(S, &USE));
    refresh_dead();
    append_n(A, 0, 21);
    append_n(A, 1, 18);
    append_n(P, 0, 5);
    track[n_track++] = A;
    track[n_track++] = E;
    track[n_track++] = P;

    test_handles();
    test_append();
    test_read_compact();
    test_attention();
    test_exhaustion();

    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_seq_free(S, A));
    CHECK_OK(kv_seq_free(S, E));
    CHECK_OK(kv_seq_free(S, P));
    CHECK_OK(kv_seq_free(S, USE));
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_used, 0);
    CHECK_EQ(st.n_seqs, 0);
    kv_store_destroy(S);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
