/* SPDX-License-Identifier: MIT */
/*
 * test_policy_env.h — synthetic inputs for the policy tests (included by
 * tests/unit/test_policy_*.c and tests/integration/test_api_policy.c).
 *
 * A store of L layers, H kv heads, G query heads per kv head, D = 16.
 * Prompts: token t's key is a small pseudo-random vector, except "hot"
 * tokens whose key is A * e0 (every query is B * e0 plus noise, so hot
 * tokens receive most of the attention); values are pseudo-random. Each
 * layer can have its own hot set (pe_layer_hot). Prefill runs kv_attn_prefill
 * in chunks; a decode step appends one token per layer, runs
 * kv_attn_decode and kv_seq_step_end.
 */
#ifndef TEST_POLICY_ENV_H
#define TEST_POLICY_ENV_H

#include <string.h>

#include "kv_test.h"

#define PE_D 16u
#define PE_MAX_T 4096u

typedef struct pe {
    kv_store_t *s;
    uint32_t L, H, Hq;
    int32_t hot[8][8];   /* [layer][i] hot positions, -1 ends               */
    uint32_t chunk;      /* prefill rows per kv_attn_prefill call            */
} pe_t;

static inline float pe_rand(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t x = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ c * 2246822519u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (float)(x % 2001u) / 1000.0f - 1.0f; /* [-1, 1] */
}

static inline int pe_open(pe_t *e, uint32_t L, uint32_t H, uint32_t G, uint32_t residual,
                   uint64_t pages)
{
    memset(e, 0, sizeof *e);
    memset(e->hot, 0xff, sizeof e->hot);
    e->L = L, e->H = H, e->Hq = H * G, e->chunk = 64;
    kv_config_t c = kv_config_default();
    c.n_layers = L, c.n_kv_heads = H, c.n_q_heads = H * G, c.head_dim = PE_D;
    c.host_pages = pages, c.n_threads = 1, c.residual = residual;
    return kv_store_create(&c, &e->s);
}

static inline int pe_is_hot(const pe_t *e, uint32_t layer, int32_t pos)
{
    for (int i = 0; i < 8 && e->hot[layer % 8][i] >= 0; i++)
        if (e->hot[layer % 8][i] == pos)
            return 1;
    return 0;
}

/* K/V rows of one token at position pos of a layer: [H][D] each. */
static inline void pe_token(const pe_t *e, uint32_t layer, int32_t pos, float *k, float *v)
{
    for (uint32_t h = 0; h < e->H; h++)
        for (uint32_t d = 0; d < PE_D; d++) {
            float *kk = k + h * PE_D + d;
            *kk = 0.1f * pe_rand((uint32_t)pos, layer * 31 + h, d);
            if (pe_is_hot(e, layer, pos))
                *kk = d == 0 ? 10.0f : 0.0f;
            v[h * PE_D + d] = pe_rand((uint32_t)pos + 7777u, layer * 31 + h, d);
        }
}

static inline void pe_query(const pe_t *e, uint32_t layer, int32_t pos, float *q)
{
    for (uint32_t h = 0; h < e->Hq; h++)
        for (uint32_t d = 0; d < PE_D; d++)
            q[h * PE_D + d] = (d == 0 ? 3.0f : 0.0f) +
                              0.1f * pe_rand((uint32_t)pos + 99u, layer * 7 + h, d);
}

/* Append and prefill T prompt tokens on every layer. */
static inline int pe_prefill(pe_t *e, kv_seq_id_t seq, uint32_t T)
{
    static float k[PE_MAX_T * 8 * PE_D], v[PE_MAX_T * 8 * PE_D];
    static float q[PE_MAX_T * 32 * PE_D], out[PE_MAX_T * 32 * PE_D];
    uint32_t done = 0;
    while (done < T) {
        uint32_t n = T - done < e->chunk ? T - done : e->chunk;
        for (uint32_t l = 0; l < e->L; l++) {
            for (uint32_t i = 0; i < n; i++) {
                pe_token(e, l, (int32_t)(done + i), k + i * e->H * PE_D, v + i * e->H * PE_D);
                pe_query(e, l, (int32_t)(done + i), q + i * e->Hq * PE_D);
            }
            int rc = kv_append(e->s, seq, l, n, KV_DTYPE_F32, k, v, NULL);
            if (rc)
                return rc;
            kv_prefill_t a = {.layer = l, .seq = seq, .n_new = n, .q = q, .out = out};
            if ((rc = kv_attn_prefill(e->s, &a)))
                return rc;
        }
        done += n;
    }
    return 0;
}

/* One decode step at position pos on every layer (no kv_seq_step_end). */
static inline int pe_decode(pe_t *e, kv_seq_id_t seq, int32_t pos)
{
    float k[8 * PE_D], v[8 * PE_D], q[32 * PE_D], out[32 * PE_D];
    for (uint32_t l = 0; l < e->L; l++) {
        pe_token(e, l, pos, k, v);
        pe_query(e, l, pos, q);
        int rc = kv_append(e->s, seq, l, 1, KV_DTYPE_F32, k, v, &pos);
        if (rc)
            return rc;
        kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = q, .out = out};
        if ((rc = kv_attn_decode(e->s, &d)))
            return rc;
    }
    return 0;
}

/* pe_decode, then kv_seq_step_end. */
static inline int pe_step(pe_t *e, kv_seq_id_t seq, int32_t pos)
{
    int rc = pe_decode(e, seq, pos);
    return rc ? rc : kv_seq_step_end(e->s, seq);
}

static inline uint32_t pe_len(const pe_t *e, kv_seq_id_t seq, uint32_t l, uint32_t h)
{
    uint32_t n = 0;
    kv_seq_len(e->s, seq, l, h, &n);
    return n;
}

/* 1 if (seq, l, h) holds position p. */
static inline int pe_has(const pe_t *e, kv_seq_id_t seq, uint32_t l, uint32_t h, int32_t p)
{
    static int32_t pos[PE_MAX_T];
    uint32_t n = pe_len(e, seq, l, h);
    if (kv_read(e->s, seq, l, h, 0, n, NULL, NULL, pos))
        return 0;
    for (uint32_t i = 0; i < n; i++)
        if (pos[i] == p)
            return 1;
    return 0;
}

/* A new sequence with policy spec. */
static inline int pe_seq(pe_t *e, const char *spec, kv_seq_id_t *seq)
{
    kv_policy_t *p;
    char err[256];
    int rc = kv_policy_parse(spec, &p, err, sizeof err);
    if (rc) {
        fprintf(stderr, "parse '%s': %s\n", spec, err);
        return rc;
    }
    if (!(rc = kv_seq_create(e->s, seq)))
        rc = kv_seq_set_policy(e->s, *seq, p);
    kv_policy_destroy(p);
    return rc;
}

#endif /* TEST_POLICY_ENV_H */
