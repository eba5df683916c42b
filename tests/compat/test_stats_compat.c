/* SPDX-License-Identifier: MIT */
/*
 * test_stats_compat.c — kv_store_stats serves a caller built against an
 * older header (kvpage.h, kv_stats_t). This program is compiled against
 * tests/compat/kvpage/kvpage.h, a frozen copy of the header of the first
 * kv_stats_t with struct_size, and linked with the current library:
 *   - its own kv_stats_t (struct_size = its sizeof) is filled, with the
 *     figures the store holds, and not one byte past it is written (a
 *     canary right behind the struct), however far the library's struct
 *     has grown since;
 *   - an even older, shorter struct (struct_size cut after any field) gets
 *     exactly its fields, equal to a full call's, and nothing beyond;
 *   - struct_size 0 (not set), 4 (struct_size alone) or larger than the
 *     library's kv_stats_t is KV_EVERSION with nothing written;
 *   - kv_config_t: the store is made from this header's kv_config_default
 *     (inline over kv_config_init with this header's size); kv_config_init
 *     writes exactly the size it is given (a canary behind it) and refuses
 *     (KV_EVERSION, nothing written) a size larger than the library's
 *     struct or smaller than the first one served by size; kv_store_config,
 *     an exported function in this header (an inline over
 *     kv_store_config_into today), writes this struct and nothing past it.
 */
#include <stddef.h>
#include <string.h>

#include "kv_test.h"

#ifndef KV_FROZEN_HEADER
#error "compiled against the live kvpage.h, not tests/compat/kvpage/kvpage.h"
#endif

#define CANARY 0xA5
#define TOKENS 40u

typedef struct {
    kv_stats_t st;
    unsigned char tail[256]; /* what a newer library must never write */
} padded_t;

static int untouched(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != CANARY)
            return 0;
    return 1;
}

static kv_store_t *make_store(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 2;
    c.n_q_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.host_pages = 64;
    c.n_threads = 1;
    kv_store_t *st = NULL;
    CHECK_OK(kv_store_create(&c, &st));
    kv_seq_id_t seq;
    static float kv[TOKENS * 2 * 64];
    CHECK_OK(kv_seq_create(st, &seq));
    for (uint32_t layer = 0; layer < 2; layer++)
        CHECK_OK(kv_append(st, seq, layer, TOKENS, KV_DTYPE_F32, kv, kv, NULL));
    return st;
}

/* This header's whole struct. */
static void test_own_struct(kv_store_t *st)
{
    padded_t p;
    memset(&p, CANARY, sizeof p);
    p.st.struct_size = sizeof p.st;
    CHECK_OK(kv_store_stats(st, &p.st));
    CHECK_EQ(p.st.struct_size, sizeof p.st);
    CHECK_EQ(p.st.page_bytes, 64u * 64u);
    CHECK_EQ(p.st.fp16_tokens_per_page, 16);
    CHECK_EQ(p.st.n_seqs, 1);
    CHECK_EQ(p.st.tokens, 2u * 2u * TOKENS);
    CHECK_EQ(p.st.pages_used, 2u * 2u * 3u); /* 40 tokens: 3 pages per list */
    CHECK_EQ(p.st.pages_capacity, 64);
    CHECK_EQ(p.st.pages_free, 64u - 12u);
    CHECK_EQ(p.st.prefix_file_restored, 0); /* the last field: written */
    CHECK(untouched(p.tail, sizeof p.tail));
}

/* A caller whose struct ends after the field that ends at `cut`. */
static void test_shorter(kv_store_t *st, size_t cut)
{
    kv_stats_t full = {.struct_size = sizeof full};
    CHECK_OK(kv_store_stats(st, &full));
    padded_t p;
    memset(&p, CANARY, sizeof p);
    p.st.struct_size = (uint32_t)cut;
    CHECK_OK(kv_store_stats(st, &p.st));
    CHECK_EQ(p.st.struct_size, cut);
    size_t skip = sizeof p.st.struct_size;
    CHECK(!memcmp((char *)&p.st + skip, (char *)&full + skip, cut - skip));
    CHECK(untouched((unsigned char *)&p + cut, sizeof p - cut));
}

static void test_refused(kv_store_t *st)
{
    const uint32_t bad[] = {0, 4, sizeof(kv_stats_t) + 1024u, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        padded_t p;
        memset(&p, CANARY, sizeof p);
        p.st.struct_size = bad[i];
        CHECK_EQ(kv_store_stats(st, &p.st), KV_EVERSION);
        CHECK_EQ(p.st.struct_size, bad[i]);
        CHECK(untouched((unsigned char *)&p + sizeof p.st.struct_size,
                        sizeof p - sizeof p.st.struct_size));
    }
    CHECK_EQ(kv_store_stats(st, NULL), KV_EINVAL);
    kv_stats_t s = {.struct_size = sizeof s};
    CHECK_EQ(kv_store_stats(NULL, &s), KV_EINVAL);
}

static void test_config_init(void)
{
    struct {
        kv_config_t c;
        unsigned char tail[256];
    } p;
    memset(&p, CANARY, sizeof p);
    CHECK_OK(kv_config_init(&p.c, (uint32_t)sizeof p.c));
    CHECK_EQ(p.c.struct_size, sizeof p.c);
    CHECK_EQ(p.c.version, KV_CONFIG_VERSION);
    CHECK(untouched(p.tail, sizeof p.tail));
    memset(&p, CANARY, sizeof p);
    CHECK_EQ(kv_config_init(&p.c, (uint32_t)sizeof p.c - 8), KV_EVERSION);
    CHECK_EQ(kv_config_init(&p.c, (uint32_t)sizeof p + 8), KV_EVERSION);
    CHECK_EQ(kv_config_init(NULL, (uint32_t)sizeof p.c), KV_EINVAL);
    CHECK(untouched((const unsigned char *)&p, sizeof p));
}

/* kv_store_config as this header declares it (an exported function): the
 * library's symbol for older programs writes this struct's fields, nothing
 * past it. */
static void test_store_config(kv_store_t *st)
{
    struct {
        kv_config_t c;
        unsigned char tail[256];
    } p;
    memset(&p, CANARY, sizeof p);
    CHECK_OK(kv_store_config(st, &p.c));
    CHECK_EQ(p.c.struct_size, sizeof p.c);
    CHECK_EQ(p.c.n_layers, 2);
    CHECK_EQ(p.c.n_kv_heads, 2);
    CHECK_EQ(p.c.head_dim, 64);
    CHECK_EQ(p.c.page_bytes, 64 * 64); /* the default resolved */
    CHECK_EQ(p.c.prefix_remote_mac_prev, NULL);
    CHECK(untouched(p.tail, sizeof p.tail));
    CHECK_EQ(kv_store_config(st, NULL), KV_EINVAL);
}

int main(void)
{
    test_config_init();
    kv_store_t *st = make_store();
    if (!st)
        return kv_test_end();
    test_own_struct(st);
    test_store_config(st);
    test_shorter(st, offsetof(kv_stats_t, pages_capacity));  /* the two uint32 */
    test_shorter(st, offsetof(kv_stats_t, kv_bytes));
    test_shorter(st, offsetof(kv_stats_t, prefix_nodes));    /* before the prefix cache */
    test_shorter(st, offsetof(kv_stats_t, prefix_file_nodes));
    test_shorter(st, sizeof(kv_stats_t) - 8);                /* all but the last field */
    test_refused(st);
    kv_store_destroy(st);
    return kv_test_end();
}
