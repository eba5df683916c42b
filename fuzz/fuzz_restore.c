/* SPDX-License-Identifier: MIT */
/*
 * fuzz_restore.c — libFuzzer target for a store's restart: sequence
 * records and the pages they name, as a page file holds them, restored by
 * kv_store_create with KV_OFFLOAD_OPEN (store/kv_store_offload_record.c),
 * then read back through the public API -- hostile page bytes included,
 * since the page file (or a remote tier behind it) is where they come from.
 *
 * Input: byte 0 flags (bit 0: prefetch odd-numbered sequences instead of
 * even ones), then slots, each
 *   u8 what       bit 0: 1 a page, 0 a record chunk; bits 1..3: sequence id
 *                 (bit 4 adds 8: beyond max_seqs); bit 5: a slot of the
 *                 prefix cache's page-file tier instead, bits 1..4 its copy
 *                 id (store/kv_store_prefix_file.c)
 *   page:         u8 layer, u8 kv_head, u16 entry index (prefix: the index
 *                 alone)
 *   record chunk: u8 chunk index
 *   u8 generation, u8 format tag, u16 tokens, u16 payload bytes - 1 (mod 384),
 *   then the payload (zero-padded when the input ends first)
 * written into a fresh page file (tmpfs) under the keys the store uses
 * (kv_offload_key for pages; bit 63 | seq << 24 | chunk for records; the
 * prefix tier's 3 << 62 | id << 24 | index, bit 23 for record chunks) with
 * valid checksums, so what is fuzzed is the record parsers and what they
 * let through, not the crc. The store's shape: 2 layers, 2 kv heads (4
 * query heads), head_dim 16, 384-byte pages (6-token blocks), max_seqs 8,
 * the prefix cache on.
 * Properties: the create returns 0 or an error (never crashes, asserts or
 * leaks); a created store passes kv_store_check; every restored sequence
 * has all its pages on the file; prefetch + wait of half of them returns 0
 * or an I/O error, and a sequence that came back reads (kv_read, every
 * list) and attends (kv_attn_decode, every layer) without error, whatever
 * its pages hold; a prefix match of the seeds' prompt (tokens 1..25) reads
 * back the restored nodes it reaches (pages of any bytes: a failed check
 * shortens it) and what it attaches reads and attends; the store still
 * passes kv_store_check; after destroy the file reopens and restores
 * exactly the sequences that stayed on it, and every node restored before
 * (nodes on the file stay there).
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"

#define T "fuzz_restore"
#define L 2u
#define H 2u
#define QH 4u
#define D 16u
#define PB 384u  /* 6 FP16 tokens, one 16-token INT4 or INT2 group */
#define MAXQ 8u
#define SLOTS 128u
#define REC_KEY(seq, chunk) (KV_REC_SEQ_KEY_BIT | ((uint64_t)(seq) << 24) | (chunk))
#define PROMPT 25u

static const char MODEL[] = "fuzz-model";

static char g_path[1024];

static kv_config_t store_cfg(uint32_t flags)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L;
    c.n_kv_heads = H;
    c.n_q_heads = QH;
    c.head_dim = D;
    c.page_bytes = PB;
    c.host_pages = 256;
    c.max_seqs = MAXQ;
    c.n_threads = 1;
    c.residual = 16;
    c.offload_path = g_path;
    c.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : SLOTS;
    c.offload_qd = 1; /* small staging: a few hundred KiB per open */
    c.offload_flags = flags | KV_OFFLOAD_PREAD;
    c.prefix_cache = 1;
    c.prefix_model = MODEL;
    c.prefix_model_len = sizeof MODEL - 1;
    return c;
}

static kv_offload_config_t file_cfg(void)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = SLOTS;
    c.ioq = KV_OFFLOAD_IOQ_PREAD;
    c.queue_depth = 4;
    c.max_io_bytes = 1; /* one slot per I/O: little staging memory to clear */
    c.flags = KV_OFFLOAD_BUFFERED;
    return c;
}

/* The input as a page file; 0, or -1 (nothing to test). */
static int lay_out(const uint8_t *data, size_t size)
{
    kv_offload_config_t c = file_cfg();
    kv_offload_file_t *f;
    kv_offload_unlink(g_path);
    if (kv_offload_create(g_path, &c, &f))
        return -1;
    static uint8_t pg[PB];
    size_t at = 1;
    for (uint32_t n = 0; n < SLOTS && at + 8 <= size; n++) {
        uint8_t what = data[at++];
        uint32_t seq = ((what >> 1) & 7u) + ((what & 16u) ? 8u : 0u);
        uint64_t key;
        if ((what & 32u) && (what & 1)) {
            key = KV_REC_PFX_KEY_NS | (uint64_t)seq << 24 |
                  (kv_le_get16(data + at + 2) & 0x7FFFFFu);
            at += 4;
        } else if (what & 32u) {
            key = KV_REC_PFX_KEY_NS | (uint64_t)seq << 24 | KV_REC_PFX_KEY_REC | data[at];
            at += 1;
        } else if (what & 1) {
            key = kv_offload_key(seq, data[at], data[at + 1], kv_le_get16(data + at + 2));
            at += 4;
        } else {
            key = REC_KEY(seq, data[at]);
            at += 1;
        }
        if (at + 6 > size)
            break;
        uint32_t gen = data[at], fmt = data[at + 1], tokens = kv_le_get16(data + at + 2);
        uint32_t bytes = kv_le_get16(data + at + 4);
        at += 6;
        bytes = bytes % PB + 1;
        size_t m = size - at < bytes ? size - at : bytes;
        memset(pg, 0, sizeof pg);
        memcpy(pg, data + at, m);
        at += m;
        kv_offload_wpage_t w = {.key = key, .generation = gen, .data = pg, .bytes = bytes,
                                .tokens = tokens, .format = fmt};
        kv_offload_slot_t s;
        if (kv_offload_write(f, &w, 1, &s, NULL))
            break;
    }
    return kv_offload_close(f) ? -1 : 0;
}

/* Ids of the live sequences as a bit set. */
static uint32_t live_set(kv_store_t *st)
{
    kv_seq_id_t ids[MAXQ];
    uint32_t n = 0, set = 0;
    fz_check(kv_store_seqs(st, ids, MAXQ, &n) == 0 && n <= MAXQ, T, "kv_store_seqs");
    for (uint32_t i = 0; i < n; i++)
        set |= 1u << ids[i];
    return set;
}

/* A sequence back in the pool: every list reads, every layer attends. */
static void use(kv_store_t *st, kv_seq_id_t q)
{
    static float k[4096 * D], v[4096 * D], qv[QH * D], out[QH * D];
    static int32_t pos[4096];
    for (uint32_t li = 0; li < L * H; li++) {
        uint32_t n = 0;
        fz_check(kv_seq_len(st, q, li / H, li % H, &n) == 0, T, "kv_seq_len");
        if (n > 4096)
            n = 4096;
        fz_check(kv_read(st, q, li / H, li % H, 0, n, k, v, pos) == 0, T,
                 "a restored list reads");
    }
    for (uint32_t i = 0; i < QH * D; i++)
        qv[i] = (float)((int)(i % 7) - 3) * 0.25f;
    for (uint32_t l = 0; l < L; l++) {
        kv_decode_t d = {.layer = l, .batch = 1, .seqs = &q, .q = qv, .out = out};
        int rc = kv_attn_decode(st, &d);
        fz_check(rc == 0 || rc == KV_ESTATE, T, "a restored layer attends (or is empty)");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9 || lay_out(data, size))
        return 0;
    kv_config_t c = store_cfg(KV_OFFLOAD_OPEN);
    kv_store_t *st = NULL;
    int rc = kv_store_create(&c, &st);
    if (rc) {
        fz_check(st == NULL && (rc == KV_EINVAL || rc == KV_ELIMIT || rc == KV_ECORRUPT ||
                                rc == KV_ENOMEM || rc == KV_ERANGE),
                 T, "a refused restore returns a documented error");
        kv_offload_unlink(g_path);
        return 0;
    }
    fz_check(kv_store_check(st) == 0, T, "restored store passes its check");
    uint32_t set = live_set(st), stay = 0;
    for (kv_seq_id_t q = 0; q < MAXQ; q++) {
        if (!(set >> q & 1))
            continue;
        kv_residency_t r;
        fz_check(kv_seq_residency(st, q, &r) == 0 && r.pages > 0 && r.on_file == r.pages &&
                     r.lost == 0, T, "a restored sequence is wholly on the file");
        if ((q & 1) != (data[0] & 1)) {
            stay |= 1u << q;
            continue;
        }
        fz_check(kv_seq_prefetch(st, q) == 0, T, "prefetch");
        rc = kv_seq_wait(st, q);
        fz_check(rc == 0 || rc == KV_ECORRUPT || rc == KV_EIO, T, "wait: 0 or an I/O error");
        if (rc == 0)
            use(st, q);
        else
            fz_check(kv_seq_free(st, q) == 0, T, "free a sequence with lost pages");
    }
    /* the seeds' prompt: restored nodes read back (any bytes), then used */
    static int32_t prompt[PROMPT];
    for (uint32_t i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)i + 1;
    kv_seq_id_t pq;
    uint32_t m = 0;
    if (kv_seq_create(st, &pq) == 0) {
        rc = kv_seq_prefix_match(st, pq, prompt, PROMPT, NULL, 0, &m);
        fz_check(rc == 0 || rc == KV_ENOMEM, T, "a match: 0 or KV_ENOMEM");
        fz_check(kv_store_check(st) == 0, T, "the store passes its check after a match");
        if (rc == 0 && m)
            use(st, pq);
        fz_check(kv_seq_free(st, pq) == 0, T, "free the matched sequence");
    }
    fz_check(kv_store_check(st) == 0, T, "the store passes its check after use");
    kv_stats_t ss = {.struct_size = sizeof ss};
    kv_store_stats(st, &ss);
    const uint64_t nodes = ss.prefix_nodes;
    kv_store_destroy(st);
    /* what stayed on the file comes back, nothing else */
    st = NULL;
    fz_check(kv_store_create(&c, &st) == 0, T, "the file reopens");
    fz_check(live_set(st) == stay, T, "exactly the sequences left on the file come back");
    kv_store_stats(st, &ss);
    fz_check(ss.prefix_file_restored == nodes, T, "every node comes back");
    fz_check(kv_store_check(st) == 0, T, "reopened store passes its check");
    kv_store_destroy(st);
    kv_offload_unlink(g_path);
    return 0;
}

/* ---- seeds: a real store's file, slot by slot -------------------------------- */

static size_t put_slot(uint8_t *out, const kv_offload_entry_t *e, const uint8_t *payload)
{
    size_t at = 0;
    if ((e->key & KV_REC_PFX_KEY_NS) == KV_REC_PFX_KEY_NS) {
        uint32_t id = (uint32_t)(e->key >> 24) & 15u;
        if (e->key & KV_REC_PFX_KEY_REC) {
            out[at++] = (uint8_t)(32u | ((id & 7u) << 1) | (id >= 8 ? 16u : 0u));
            out[at++] = (uint8_t)(e->key & 0xFFu);
        } else {
            out[at++] = (uint8_t)(33u | ((id & 7u) << 1) | (id >= 8 ? 16u : 0u));
            out[at++] = 0;
            out[at++] = 0;
            kv_le_put16(out + at, (uint32_t)(e->key & 0xFFFFu));
            at += 2;
        }
    } else if (e->key >> 63) {
        uint32_t seq = (uint32_t)(e->key >> 24) & 0xFFFFFFu;
        out[at++] = (uint8_t)(((seq & 7u) << 1) | (seq >= 8 ? 16u : 0u));
        out[at++] = (uint8_t)(e->key & 0xFFu);
    } else {
        uint32_t seq = (uint32_t)(e->key >> 40);
        out[at++] = (uint8_t)(1u | ((seq & 7u) << 1));
        out[at++] = (uint8_t)((e->key >> 28) & 0xFFFu);
        out[at++] = (uint8_t)((e->key >> 18) & 0x3FFu);
        kv_le_put16(out + at, (uint32_t)(e->key & 0x3FFFFu));
        at += 2;
    }
    out[at++] = (uint8_t)e->generation;
    out[at++] = (uint8_t)e->format;
    kv_le_put16(out + at, e->tokens);
    kv_le_put16(out + at + 2, e->bytes - 1);
    at += 4;
    memcpy(out + at, payload, e->bytes);
    return at + e->bytes;
}

static void fill(kv_store_t *st, kv_seq_id_t q, uint32_t n, int kind, uint32_t salt)
{
    static float k[256 * H * D], v[256 * H * D];
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t i = 0; i < n * H * D; i++) {
            k[i] = (float)((int)((i * 37 + l * 11 + salt) % 97) - 48) / 32.0f;
            v[i] = (float)((int)((i * 53 + l * 5 + salt) % 89) - 44) / 32.0f;
        }
        if (kind == 1 || kind == 2)
            kv_seq_set_format(st, q, l, kind == 1 ? KV_FMT_INT4 : KV_FMT_INT2);
        if (kv_append(st, q, l, n, KV_DTYPE_F32, k, v, NULL))
            exit(1);
        if (kind == 1 || kind == 2)
            kv_seq_quantize(st, q, l, 16);
    }
    if (kind == 3) { /* compacted: positions recorded */
        uint32_t keep[256], m = 0;
        for (uint32_t i = 0; i < n; i++)
            if (i % 3)
                keep[m++] = i;
        kv_compact(st, q, 1, 0, keep, m);
    }
}

static void write_seeds(const char *dir)
{
    static uint8_t in[65536], pg[PB];
    for (int variant = 0; variant < 6; variant++) {
        kv_offload_unlink(g_path);
        kv_config_t c = store_cfg(0);
        kv_store_t *st;
        if (kv_store_create(&c, &st))
            exit(1);
        if (variant >= 4) { /* prefix nodes of the prompt (5: and a sequence) */
            static int32_t prompt[PROMPT];
            for (uint32_t i = 0; i < PROMPT; i++)
                prompt[i] = (int32_t)i + 1;
            kv_seq_id_t q;
            if (kv_seq_create(st, &q))
                exit(1);
            const uint32_t n = variant == 4 ? 24 : 12; /* 5: with a sequence */
            fill(st, q, n, 0, (uint32_t)variant);
            if (kv_seq_prefix_publish(st, q, prompt, n, NULL, 0) != (int)n || kv_seq_free(st, q))
                exit(1);
        }
        for (int kind = 0; kind < 4 && (variant < 4 || variant == 5); kind++) {
            if ((variant < 3 && kind != variant && kind != 3) || (variant == 5 && kind))
                continue;
            kv_seq_id_t q;
            if (kv_seq_create(st, &q))
                exit(1);
            fill(st, q, kind == 0 ? 12 : kind == 3 ? 18 : 32, kind, (uint32_t)variant);
            if (kv_seq_offload(st, q) || kv_seq_wait(st, q))
                exit(1);
        }
        if (kv_store_offload_sync(st))
            exit(1);
        kv_store_destroy(st);
        kv_offload_config_t fc = file_cfg();
        fc.capacity = 0;
        kv_offload_file_t *f;
        if (kv_offload_open(g_path, &fc, &f))
            exit(1);
        uint64_t n = 0;
        static kv_offload_entry_t e[SLOTS];
        kv_offload_list(f, e, SLOTS, &n);
        size_t at = 0;
        in[at++] = (uint8_t)variant;
        for (uint64_t i = 0; i < n && at + 16 + PB < sizeof in; i++) {
            kv_offload_rpage_t r = {.slot = e[i].slot, .key = e[i].key,
                                    .generation = e[i].generation, .data = pg};
            if (kv_offload_read(f, &r, 1, NULL))
                exit(1);
            at += put_slot(in + at, &e[i], pg);
        }
        kv_offload_close(f);
        char name[32];
        snprintf(name, sizeof name, "store%d", variant);
        fz_seed(dir, name, in, at);
    }
    kv_offload_unlink(g_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_dir_make("restore");
    fz_path("s.kvp", g_path);
    const char *seeds = fz_seed_dir();
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}
