/* SPDX-License-Identifier: MIT */
/*
 * test_store_offload_util.h — helpers shared by the test_store_offload*.c
 * programs: a store with a page file in a scratch directory, sequences of
 * every format filled with reproducible data, snapshots of decode attention
 * over a sequence, compared bit for bit (of what it holds: kv_test_seq_t,
 * kv_test_snap.h), and a byte of a slot in the page file found and flipped.
 *
 * Scratch directory: as in test_offload_util.h ($KV_OFFLOAD_TEST_DIR or
 * the current directory, a mkdtemp() directory removed at the end).
 */
#ifndef TEST_STORE_OFFLOAD_UTIL_H
#define TEST_STORE_OFFLOAD_UTIL_H

#include <fcntl.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "store/kv_store_int.h"
#include "kv_test_snap.h"
#include "test_offload_util.h"

#define KVS_LAYERS 4u
#define KVS_QH     4u
#define KVS_KVH    2u
#define KVS_D      32u
#define KVS_LISTS  (KVS_LAYERS * KVS_KVH)

/* A config with the test shape; offload fields set when path != NULL. */
static inline kv_config_t kvs_config(const char *path, uint32_t flags, uint32_t slots,
                                     uint64_t host_pages)
{
    kv_config_t c = kv_config_default();
    c.n_layers = KVS_LAYERS;
    c.n_q_heads = KVS_QH;
    c.n_kv_heads = KVS_KVH;
    c.head_dim = KVS_D;
    c.host_pages = host_pages;
    c.max_seqs = 64;
    c.n_threads = 2;
    c.residual = 32;
    c.flags = KV_CONFIG_NO_TCACHE; /* exact pool counts */
    if (path) {
        c.offload_path = path;
        c.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : slots;
        c.offload_qd = 16;
        c.offload_flags = flags;
    }
    return c;
}

/* Kinds of test sequence. */
enum { KVS_FP16 = 0, KVS_INT4 = 1, KVS_INT2 = 2, KVS_MERGED = 3, KVS_COMPACT = 4,
       KVS_KINDS = 5 };

/* Append n tokens of reproducible data to every layer of seq, then shape it
 * by kind: INT4/INT2 convert all but the newest 16 tokens; MERGED merges
 * layers (0, 1) with retention (MERGED pages + RETAINED FP16 pages);
 * COMPACT drops every third token of list (1, 0) (positions kept). */
static inline int kvs_fill(kv_store_t *st, kv_seq_id_t seq, uint32_t n, uint64_t seed,
                           int kind)
{
    float *k = malloc(sizeof(float) * n * KVS_KVH * KVS_D);
    float *v = malloc(sizeof(float) * n * KVS_KVH * KVS_D);
    int rc = 0;
    for (uint32_t l = 0; l < KVS_LAYERS && rc == 0; l++) {
        uint64_t s = seed * 1000 + l;
        for (size_t i = 0; i < (size_t)n * KVS_KVH * KVS_D; i++) {
            k[i] = kv_test_randf(&s) * 3.0f;
            v[i] = kv_test_randf(&s);
        }
        if (kind == KVS_MERGED && l == 1) /* close to layer 0: merges well */
            for (size_t i = 0; i < (size_t)n * KVS_KVH * KVS_D; i++)
                k[i] *= 1.01f;
        rc = kv_append(st, seq, l, n, KV_DTYPE_F32, k, v, NULL);
    }
    free(k);
    free(v);
    if (rc)
        return rc;
    if (kind == KVS_INT4 || kind == KVS_INT2) {
        kv_format_t f = kind == KVS_INT4 ? KV_FMT_INT4 : KV_FMT_INT2;
        for (uint32_t l = 0; l < KVS_LAYERS && rc == 0; l++)
            if (!(rc = kv_seq_set_format(st, seq, l, f)))
                rc = kv_seq_quantize(st, seq, l, 16);
    } else if (kind == KVS_MERGED) {
        kv_merge_opts_t o = kv_merge_opts_default();
        o.gamma = 0.3f;
        rc = kv_seq_merge_layers(st, seq, 1, &o);
    } else if (kind == KVS_COMPACT) {
        uint32_t *keep = malloc(sizeof *keep * n), m = 0;
        for (uint32_t i = 0; i < n; i++)
            if (i % 3 != 1)
                keep[m++] = i;
        rc = kv_compact(st, seq, 1, 0, keep, m);
        free(keep);
    }
    return rc;
}

/* Decode attention of seq at every layer with a fixed query, into
 * out[KVS_LAYERS][KVS_QH][KVS_D]. */
static inline int kvs_attn(kv_store_t *st, kv_seq_id_t seq, float *out)
{
    float q[KVS_QH * KVS_D];
    uint64_t s = 77;
    for (uint32_t i = 0; i < KVS_QH * KVS_D; i++)
        q[i] = kv_test_randf(&s);
    for (uint32_t l = 0; l < KVS_LAYERS; l++) {
        kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = q,
                         .out = out + (size_t)l * KVS_QH * KVS_D};
        int rc = kv_attn_decode(st, &d);
        if (rc)
            return rc;
    }
    return 0;
}
#define KVS_ATTN_N (KVS_LAYERS * KVS_QH * KVS_D)

/* Residency of seq (asserts the call works). */
static inline kv_residency_t kvs_res(kv_store_t *st, kv_seq_id_t seq)
{
    kv_residency_t r;
    memset(&r, 0xFF, sizeof r);
    int rc = kv_seq_residency(st, seq, &r);
    CHECK_OK(rc);
    return r;
}

static inline kv_stats_t kvs_stats(kv_store_t *st)
{
    kv_stats_t s = {.struct_size = sizeof s};
    kv_store_stats(st, &s);
    return s;
}

/* Offset in the store's page file of slot `slot`'s payload byte `at`. */
static inline off_t kvs_slot_off(kv_store_t *st, kv_offload_slot_t slot, uint32_t at)
{
    kv_offload_stats_t fs;
    kv_offload_stats(kv_store_off_file(st), &fs);
    return (off_t)(fs.data_off + (uint64_t)kv_alloc_page_index(slot) * fs.slot_bytes +
                   KV_REC_PF_SLOT_BYTES + at);
}

/* Flip bit 4 of the byte at off of file p, on disk (fsync'd). */
static inline void kvs_flip(const char *p, off_t off)
{
    int fd = open(p, O_RDWR);
    uint8_t b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
    b ^= 0x10;
    CHECK(pwrite(fd, &b, 1, off) == 1 && fsync(fd) == 0);
    close(fd);
}

#endif /* TEST_STORE_OFFLOAD_UTIL_H */
