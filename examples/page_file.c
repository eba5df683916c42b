/* SPDX-License-Identifier: MIT */
/*
 * page_file.c — a page file round trip: sequences go to an NVMe page file,
 * the store is destroyed, and a new store (as after a restart) reopens the
 * file and reads them back, bit for bit.
 *
 *   1. create a store with offload_path (a new page file), fill sequences
 *      of several lengths, keep a copy of what each holds (kv_read) and of
 *      its decode attention;
 *   2. kv_seq_offload each (the writes run in the background; kv_seq_wait
 *      waits for them); kv_seq_residency: every page on the file, none in
 *      the pool;
 *   3. kv_store_offload_sync (records and index made durable), destroy;
 *   4. reopen with KV_OFFLOAD_OPEN: kv_store_seqs lists the same ids;
 *      kv_seq_prefetch + kv_seq_wait bring the pages back; every list and
 *      the attention over it equal the copies exactly.
 *
 * The page file and its index "<file>.idx" go in the directory given as the
 * first argument (default: $TMPDIR or /tmp), in a fresh subdirectory that is
 * removed at the end. Use a directory on the NVMe drive you would use in
 * production: the file is opened with O_DIRECT where the filesystem allows.
 *
 * Build: cc page_file.c $(pkg-config --cflags --libs kvpage)
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <kvpage/kvpage.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LAYERS = 4, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 64, N_SEQ = 3, MAX_TOK = 300 };

static const uint32_t n_tokens[N_SEQ] = {300, 17, 129};

#define KV_ELEMS (KV_HEADS * HEAD_DIM)
#define Q_ELEMS  (Q_HEADS * HEAD_DIM)

/* What a sequence holds, list by list, and its decode attention per layer. */
typedef struct snapshot {
    float k[LAYERS][KV_HEADS][MAX_TOK * HEAD_DIM];
    float v[LAYERS][KV_HEADS][MAX_TOK * HEAD_DIM];
    int32_t pos[LAYERS][KV_HEADS][MAX_TOK];
    float attn[LAYERS][Q_ELEMS];
} snapshot_t;

static char dir[4096], path[4200];
static int failed;

static int report(const char *what, int rc)
{
    if (rc)
        fprintf(stderr, "%s: %s (%d)\n", what, kv_strerror(rc), rc);
    failed |= rc != 0;
    return rc;
}

#define TRY(call) \
    if (report(#call, (call))) goto done

static kv_config_t config(uint32_t flags)
{
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = LAYERS;
    cfg.n_q_heads = Q_HEADS;
    cfg.n_kv_heads = KV_HEADS;
    cfg.head_dim = HEAD_DIM;
    cfg.host_pages = 1024;
    cfg.offload_path = path;
    cfg.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : 2048; /* slots of a new file */
    cfg.offload_flags = flags;
    return cfg;
}

/* n values in [-1, 1) from seed. */
static void fill(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) / (float)(1u << 23) - 1.0f;
    }
}

static int take_snapshot(kv_store_t *st, kv_seq_id_t seq, uint32_t n, snapshot_t *s)
{
    static float q[Q_ELEMS];
    fill(q, Q_ELEMS, 7);
    int rc = 0;
    for (uint32_t l = 0; l < LAYERS && !rc; l++) {
        for (uint32_t h = 0; h < KV_HEADS && !rc; h++)
            rc = kv_read(st, seq, l, h, 0, n, s->k[l][h], s->v[l][h], s->pos[l][h]);
        kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = q, .out = s->attn[l]};
        if (!rc)
            rc = kv_attn_decode(st, &d);
    }
    return rc;
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/kvpage-example-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    snprintf(path, sizeof path, "%s/pages.kv", dir);
    static snapshot_t before[N_SEQ], after[N_SEQ];
    static float k[MAX_TOK * KV_ELEMS], v[MAX_TOK * KV_ELEMS];
    kv_seq_id_t seq[N_SEQ], ids[N_SEQ + 1];
    kv_store_t *st = NULL;
    kv_stats_t s = {.struct_size = sizeof s};
    kv_residency_t r;
    uint32_t count = 0;

    /* 1. a new page file; sequences filled, snapshots taken */
    kv_config_t cfg = config(0);
    TRY(kv_store_create(&cfg, &st));
    for (uint32_t i = 0; i < N_SEQ; i++) {
        TRY(kv_seq_create(st, &seq[i]));
        for (uint32_t l = 0; l < LAYERS; l++) {
            fill(k, (size_t)n_tokens[i] * KV_ELEMS, 100 * i + 2 * l);
            fill(v, (size_t)n_tokens[i] * KV_ELEMS, 100 * i + 2 * l + 1);
            TRY(kv_append(st, seq[i], l, n_tokens[i], KV_DTYPE_F32, k, v, NULL));
        }
        TRY(take_snapshot(st, seq[i], n_tokens[i], &before[i]));
    }
    /* 2. every sequence to the file; their pool pages are freed */
    for (uint32_t i = 0; i < N_SEQ; i++)
        TRY(kv_seq_offload(st, seq[i]));
    for (uint32_t i = 0; i < N_SEQ; i++) {
        TRY(kv_seq_wait(st, seq[i]));
        TRY(kv_seq_residency(st, seq[i], &r));
        if (r.on_file != r.pages || r.resident != 0)
            goto mismatch;
    }
    TRY(kv_store_stats(st, &s));
    printf("offloaded: %llu pages on the file (%llu KiB written), %llu pages in the pool\n",
           (unsigned long long)s.pages_on_file, (unsigned long long)(s.bytes_out >> 10),
           (unsigned long long)s.pages_used);
    /* 3. durable, then gone */
    TRY(kv_store_offload_sync(st));
    kv_store_destroy(st);
    st = NULL;

    /* 4. a new store over the same file */
    cfg = config(KV_OFFLOAD_OPEN);
    TRY(kv_store_create(&cfg, &st));
    TRY(kv_store_seqs(st, ids, N_SEQ + 1, &count));
    if (count != N_SEQ)
        goto mismatch;
    for (uint32_t i = 0; i < N_SEQ; i++) {
        if (ids[i] != seq[i]) /* both in increasing order */
            goto mismatch;
        TRY(kv_seq_prefetch(st, seq[i]));
    }
    for (uint32_t i = 0; i < N_SEQ; i++) {
        TRY(kv_seq_wait(st, seq[i]));
        TRY(take_snapshot(st, seq[i], n_tokens[i], &after[i]));
        if (memcmp(&before[i], &after[i], sizeof before[i]) != 0)
            goto mismatch;
    }
    TRY(kv_store_stats(st, &s));
    printf("reopened: %u sequences restored, %llu pages read back (%llu KiB), "
           "every list and attention output bit-identical\n",
           count, (unsigned long long)s.pages_in, (unsigned long long)(s.bytes_in >> 10));
    goto done;
mismatch:
    fprintf(stderr, "page_file: what came back differs from what went out\n");
    failed = 1;
done:
    kv_store_destroy(st);
    char idx[4300];
    snprintf(idx, sizeof idx, "%s.idx", path);
    unlink(path);
    unlink(idx);
    rmdir(dir);
    return failed;
}
