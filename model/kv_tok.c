/* SPDX-License-Identifier: MIT */
/*
 * kv_tok.c — building and querying a tokenizer: validates the config, turns
 * every token into its raw bytes ("piece"), and builds the two hash maps
 * BPE needs (piece -> id, (left, right) -> (rank, merged id)); see the
 * invariants in kv_tok_int.h. Encoding lives in kv_tok_bpe.c and
 * kv_tok_encode.c.
 *
 * Ownership: kv_tok_t owns every table below, allocated through the
 * config's allocator (default malloc) and freed in kv_tok_destroy; nothing
 * borrowed from the config is kept.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_tok_int.h"

/* ---- allocation ------------------------------------------------------------ */

static void *sys_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return malloc(n);
}

static void sys_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    (void)n;
    free(p);
}

void *kv_tok_mem(const kv_tok_t *t, size_t n)
{
    return n ? t->alloc(t->alloc_ctx, n) : NULL;
}

void kv_tok_mem_free(const kv_tok_t *t, void *p, size_t n)
{
    if (p)
        t->free(t->alloc_ctx, p, n);
}

/* ---- hash maps ------------------------------------------------------------- */

static uint32_t hash_bytes(const uint8_t *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a, then a final avalanche */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    return h;
}

static uint32_t hash_pair(uint32_t a, uint32_t b)
{
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) ^ (uint32_t)x;
}

/* Smallest power of two >= 2 * n, at least 16. */
static uint32_t table_size(uint32_t n)
{
    uint32_t c = 16;
    while (c < 2u * (uint64_t)n)
        c <<= 1;
    return c;
}

int32_t kv_tok_vocab_get(const kv_tok_t *t, const uint8_t *s, size_t n)
{
    for (uint32_t i = hash_bytes(s, n) & t->vmap_mask;; i = (i + 1) & t->vmap_mask) {
        uint32_t v = t->vmap[i];
        if (v == 0)
            return -1;
        uint32_t id = v - 1;
        if (kv_tok_piece_len(t, id) == n && memcmp(kv_tok_piece_ptr(t, id), s, n) == 0)
            return (int32_t)id;
    }
}

int kv_tok_merge_get(const kv_tok_t *t, int32_t a, int32_t b, uint32_t *rank,
                     int32_t *result)
{
    uint32_t ka = (uint32_t)a + 1u, kb = (uint32_t)b;
    for (uint32_t i = hash_pair(ka, kb) & t->mmap_mask;; i = (i + 1) & t->mmap_mask) {
        const kv_tok_mslot_t *m = &t->mmap[i];
        if (m->key_a == 0)
            return 0;
        if (m->key_a == ka && m->key_b == kb) {
            *rank = m->rank;
            *result = m->result;
            return 1;
        }
    }
}

/* Insert a merge unless (a, b) is already there (the lower rank stays). */
static void merge_put(kv_tok_t *t, int32_t a, int32_t b, uint32_t rank, int32_t result)
{
    uint32_t ka = (uint32_t)a + 1u, kb = (uint32_t)b;
    for (uint32_t i = hash_pair(ka, kb) & t->mmap_mask;; i = (i + 1) & t->mmap_mask) {
        kv_tok_mslot_t *m = &t->mmap[i];
        if (m->key_a == ka && m->key_b == kb)
            return;
        if (m->key_a == 0) {
            *m = (kv_tok_mslot_t){.key_a = ka, .key_b = kb, .rank = rank, .result = result};
            return;
        }
    }
}

/* ---- create ---------------------------------------------------------------- */

static int is_byte_level_type(int type)
{
    return type == KV_TOK_NORMAL || type == KV_TOK_UNUSED || type == KV_TOK_BYTE;
}

static int check_id(int32_t id, uint32_t n)
{
    return id == -1 || (id >= 0 && (uint32_t)id < n);
}

static int check_config(const kv_tok_config_t *cfg, size_t *total, uint32_t *n_special)
{
    if (!cfg->tokens || (cfg->n_merges && !cfg->merges) || (!cfg->alloc != !cfg->free))
        return KV_EINVAL;
    if ((unsigned)cfg->pre >= KV_TOK_PRE_COUNT)
        return KV_EINVAL;
    if (cfg->n_tokens == 0 || cfg->n_tokens > KV_TOK_MAX_VOCAB)
        return KV_ERANGE;
    if (!check_id(cfg->bos_id, cfg->n_tokens) || !check_id(cfg->eos_id, cfg->n_tokens) ||
        !check_id(cfg->unk_id, cfg->n_tokens))
        return KV_ERANGE;
    *total = 0;
    *n_special = 0;
    for (uint32_t i = 0; i < cfg->n_tokens; i++) {
        const kv_tok_str_t *s = &cfg->tokens[i];
        int type = cfg->types ? cfg->types[i] : KV_TOK_NORMAL;
        if (type < KV_TOK_NORMAL || type > KV_TOK_BYTE || (!s->ptr && s->len))
            return KV_EINVAL;
        if (s->len > KV_TOK_MAX_TOKEN_BYTES)
            return KV_ERANGE;
        *total += (size_t)s->len;
        if (kv_tok_is_raw_type(type) && s->len)
            (*n_special)++;
    }
    if (*total >= UINT32_MAX)
        return KV_ERANGE;
    return 0;
}

/* Pieces: raw bytes of each token (mapped text unmapped). */
static int fill_pieces(kv_tok_t *t, const kv_tok_config_t *cfg)
{
    uint32_t pos = 0, k = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const kv_tok_str_t *s = &cfg->tokens[i];
        int type = cfg->types ? cfg->types[i] : KV_TOK_NORMAL;
        t->types[i] = (uint8_t)type;
        t->off[i] = pos;
        if (kv_tok_is_raw_type(type)) {
            if (s->len)
                memcpy(t->bytes + pos, s->ptr, (size_t)s->len);
            pos += (uint32_t)s->len;
            if (s->len)
                t->special[k++] = (int32_t)i;
        } else {
            size_t n = 0;
            if (s->len && kv_tok_unmap(s->ptr, (size_t)s->len, t->bytes + pos, &n) != 0)
                return KV_EINVAL;
            pos += (uint32_t)n;
        }
    }
    t->off[t->n_vocab] = pos;
    return 0;
}

static void build_vocab_map(kv_tok_t *t)
{
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        size_t n = kv_tok_piece_len(t, id);
        if (!is_byte_level_type(t->types[id]) || n == 0)
            continue;
        const uint8_t *s = kv_tok_piece_ptr(t, id);
        uint32_t i = hash_bytes(s, n) & t->vmap_mask;
        for (;; i = (i + 1) & t->vmap_mask) {
            uint32_t v = t->vmap[i];
            if (v == 0) {
                t->vmap[i] = id + 1;
                break;
            }
            if (kv_tok_piece_len(t, v - 1) == n &&
                memcmp(kv_tok_piece_ptr(t, v - 1), s, n) == 0)
                break; /* duplicate piece: the lower id keeps it */
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = kv_tok_vocab_get(t, &c, 1);
    }
}

/* One merge "left right" (mapped text): both sides and their concatenation
 * must be byte-level tokens, else the merge is skipped. */
static void add_merge(kv_tok_t *t, const kv_tok_str_t *m, uint32_t rank)
{
    uint8_t buf[2 * KV_TOK_MAX_TOKEN_BYTES];
    size_t sp = 1, nl, nr;

    if (!m->ptr || m->len < 3 || m->len > 2 * KV_TOK_MAX_TOKEN_BYTES)
        return;
    while (sp < m->len && m->ptr[sp] != ' ')
        sp++;
    if (sp + 1 >= m->len)
        return;
    if (kv_tok_unmap(m->ptr, sp, buf, &nl) != 0 ||
        kv_tok_unmap(m->ptr + sp + 1, (size_t)m->len - sp - 1, buf + nl, &nr) != 0)
        return;
    int32_t a = kv_tok_vocab_get(t, buf, nl);
    int32_t b = kv_tok_vocab_get(t, buf + nl, nr);
    int32_t r = kv_tok_vocab_get(t, buf, nl + nr);
    if (a >= 0 && b >= 0 && r >= 0)
        merge_put(t, a, b, rank, r);
}

/* What stands for a byte without a token: the ids of U+FFFD, else unk. */
static int build_repl(kv_tok_t *t)
{
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    t->n_repl = 0;
    if (t->byte_id[0xEF] >= 0 && t->byte_id[0xBF] >= 0 && t->byte_id[0xBD] >= 0) {
        kv_tok_scratch_t sc;
        kv_tok_sink_t o = {.ids = t->repl, .cap = 3, .n = 0};
        kv_tok_scratch_init(&sc);
        int rc = kv_tok_bpe_word(t, fffd, 3, &sc, &o);
        kv_tok_scratch_fini(t, &sc);
        if (rc != 0)
            return rc;
        t->n_repl = (uint32_t)o.n;
    } else if (t->unk >= 0) {
        t->repl[0] = t->unk;
        t->n_repl = 1;
    }
    return 0;
}

void kv_tok_destroy(kv_tok_t *t)
{
    if (!t)
        return;
    kv_tok_mem_free(t, t->types, t->n_vocab);
    kv_tok_mem_free(t, t->off, ((size_t)t->n_vocab + 1) * sizeof *t->off);
    kv_tok_mem_free(t, t->bytes, t->bytes_size);
    kv_tok_mem_free(t, t->vmap, ((size_t)t->vmap_mask + 1) * sizeof *t->vmap);
    kv_tok_mem_free(t, t->mmap, ((size_t)t->mmap_mask + 1) * sizeof *t->mmap);
    kv_tok_mem_free(t, t->special, (size_t)t->n_special * sizeof *t->special);
    t->free(t->alloc_ctx, t, sizeof *t);
}

int kv_tok_create(const kv_tok_config_t *cfg, kv_tok_t **out)
{
    size_t total;
    uint32_t n_special;
    int rc;

    if (!cfg || !out)
        return KV_EINVAL;
    if ((rc = check_config(cfg, &total, &n_special)) != 0)
        return rc;

    void *(*alloc)(void *, size_t) = cfg->alloc ? cfg->alloc : sys_alloc;
    kv_tok_t *t = alloc(cfg->alloc_ctx, sizeof *t);
    if (!t)
        return KV_ENOMEM;
    memset(t, 0, sizeof *t);
    t->alloc = alloc;
    t->free = cfg->free ? cfg->free : sys_free;
    t->alloc_ctx = cfg->alloc_ctx;
    t->n_vocab = cfg->n_tokens;
    t->bos = cfg->bos_id;
    t->eos = cfg->eos_id;
    t->unk = cfg->unk_id;
    t->pre = cfg->pre;

    /* sizes first, so that destroy frees exactly what was allocated */
    uint32_t vcap = table_size(t->n_vocab), mcap = table_size(cfg->n_merges);
    t->bytes_size = total ? total : 1;
    t->types = kv_tok_mem(t, t->n_vocab);
    t->off = kv_tok_mem(t, ((size_t)t->n_vocab + 1) * sizeof *t->off);
    t->bytes = kv_tok_mem(t, t->bytes_size);
    t->vmap = kv_tok_mem(t, (size_t)vcap * sizeof *t->vmap);
    t->vmap_mask = t->vmap ? vcap - 1 : 0;
    t->mmap = kv_tok_mem(t, (size_t)mcap * sizeof *t->mmap);
    t->mmap_mask = t->mmap ? mcap - 1 : 0;
    if (n_special) {
        t->special = kv_tok_mem(t, (size_t)n_special * sizeof *t->special);
        t->n_special = t->special ? n_special : 0;
    }
    if (!t->types || !t->off || !t->bytes || !t->vmap || !t->mmap ||
        (n_special && !t->special)) {
        rc = KV_ENOMEM; /* destroy frees what was allocated (NULLs skipped) */
        goto fail;
    }
    memset(t->vmap, 0, (size_t)vcap * sizeof *t->vmap);
    memset(t->mmap, 0, (size_t)mcap * sizeof *t->mmap);

    if ((rc = fill_pieces(t, cfg)) != 0)
        goto fail;
    build_vocab_map(t);
    for (uint32_t i = 0; i < cfg->n_merges; i++)
        add_merge(t, &cfg->merges[i], i);
    for (uint32_t i = 0; i < t->n_special; i++) {
        int32_t id = t->special[i];
        int type = t->types[id];
        uint8_t first = *kv_tok_piece_ptr(t, (uint32_t)id);
        if (type == KV_TOK_CONTROL)
            t->special_first[first] |= 1u;
        else if (type == KV_TOK_USER_DEFINED)
            t->special_first[first] |= 2u;
    }
    if ((rc = build_repl(t)) != 0)
        goto fail;
    *out = t;
    return 0;

fail:
    kv_tok_destroy(t);
    return rc;
}

/* ---- queries --------------------------------------------------------------- */

uint32_t kv_tok_n_vocab(const kv_tok_t *t)
{
    return t ? t->n_vocab : 0;
}

int32_t kv_tok_bos(const kv_tok_t *t)
{
    return t ? t->bos : -1;
}

int32_t kv_tok_eos(const kv_tok_t *t)
{
    return t ? t->eos : -1;
}

int32_t kv_tok_unk(const kv_tok_t *t)
{
    return t ? t->unk : -1;
}

int kv_tok_type(const kv_tok_t *t, int32_t id)
{
    if (!t)
        return KV_EINVAL;
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return KV_ERANGE;
    return t->types[id];
}

int kv_tok_piece(const kv_tok_t *t, int32_t id, const char **bytes, size_t *len)
{
    if (!t || !bytes || !len)
        return KV_EINVAL;
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return KV_ERANGE;
    *bytes = (const char *)kv_tok_piece_ptr(t, (uint32_t)id);
    *len = kv_tok_piece_len(t, (uint32_t)id);
    return 0;
}

int kv_tok_find(const kv_tok_t *t, const char *text, size_t len, int32_t *id)
{
    if (!t || !id || (!text && len))
        return KV_EINVAL;
    if (len == 0)
        return KV_ENOENT;
    for (uint32_t i = 0; i < t->n_special; i++) {
        uint32_t s = (uint32_t)t->special[i];
        if (kv_tok_piece_len(t, s) == len && memcmp(kv_tok_piece_ptr(t, s), text, len) == 0) {
            *id = (int32_t)s;
            return 0;
        }
    }
    int32_t v = kv_tok_vocab_get(t, (const uint8_t *)text, len);
    if (v < 0)
        return KV_ENOENT;
    *id = v;
    return 0;
}

int kv_tok_byte_ok(const kv_tok_t *t, uint8_t b)
{
    return t && t->byte_id[b] >= 0;
}
