/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_model.c — the prefix cache on the real model (SmolLM2-135M):
 * a prefix hit gives the same logits, bit for bit, as the publisher's own
 * prefill with the same chunk boundary, for FP16 pages and KIVI INT4 / INT2
 * (kv_config_t.kv_format, R 128).
 *
 * For each format, in one store with the cache on: session A prefills
 * tokens [0, 256) of a 300-token chat prompt, publishes them
 * (kv_seq_prefix_publish), prefills [256, 300) and decodes 4 greedy tokens;
 * session B matches the prompt (kv_model_session_prefix: 256 tokens, the
 * last node at or below n - 1; KIVI nodes sit at multiples of R = 128),
 * prefills [256, 300) and decodes the same tokens. Every logit row of B's
 * prefill and decode must equal A's bit for bit (memcmp), B must share A's
 * pages for [0, 256) (pages used grow only by B's own), and kv_store_check
 * passes. Also printed (measured, not asserted): the max |logit difference|
 * of the last prompt row against a cold prefill of all 300 tokens in one
 * chunk (other chunk boundary: other FP16 roundings).
 */
#include <string.h>

#include "kv_model_test.h"

#define N 300
#define B 256
#define DEC 4
#define CTX 320

static kv_model_session_t *session(const kv_model_t *m, kv_store_t *st, uint32_t chunk)
{
    kv_model_session_opts_t o = {.store = st, .max_ctx = CTX, .chunk = chunk};
    kv_model_session_t *s = NULL;
    if (kv_model_session_create(m, &o, &s))
        exit(1);
    return s;
}

/* Prefill ids[from, N) (logits of every row into rows) and decode DEC
 * greedy tokens (their logits into dec). */
static int run_rest(kv_model_session_t *s, const int32_t *ids, uint32_t from, float *rows,
                    float *dec, uint32_t V)
{
    int rc = kv_model_forward(s, ids + from, N - from, rows, N - from);
    for (uint32_t i = 0; i < DEC && rc == 0; i++) {
        const float *last = i ? dec + (size_t)(i - 1) * V : rows + (size_t)(N - from - 1) * V;
        rc = kv_model_decode(s, kv_model_argmax(last, V), dec + (size_t)i * V);
    }
    return rc;
}

static void one_format(const kv_model_t *m, const int32_t *ids, uint32_t fmt, const char *name)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    kv_config_t cfg;
    kv_store_t *st = NULL;
    static const char fp[] = "SmolLM2-135M test fingerprint";
    CHECK_OK(kv_model_store_config(m, CTX, 3, 0, &cfg));
    cfg.kv_format = fmt;
    cfg.residual = 128;
    cfg.prefix_cache = 1;
    cfg.prefix_model = fp;
    cfg.prefix_model_len = sizeof fp - 1;
    if (kv_store_create(&cfg, &st))
        exit(1);
    float *ra = malloc((size_t)(N - B) * V * 4), *rb = malloc((size_t)(N - B) * V * 4);
    float *da = malloc((size_t)DEC * V * 4), *db = malloc((size_t)DEC * V * 4);
    float *cold = malloc((size_t)V * 4);
    if (!ra || !rb || !da || !db || !cold)
        exit(1);

    kv_model_session_t *a = session(m, st, 256), *b = session(m, st, 256);
    kv_seq_id_t sa;
    CHECK_OK(kv_model_session_seq(a, &sa));
    CHECK_OK(kv_model_forward(a, ids, B, NULL, 0));
    CHECK_EQ(kv_seq_prefix_publish(st, sa, ids, B, NULL, 0), B);
    CHECK_OK(run_rest(a, ids, B, ra, da, V));
    kv_stats_t s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    kv_store_stats(st, &s0);

    uint32_t got = 0;
    CHECK_OK(kv_model_session_prefix(b, ids, N, NULL, 0, &got));
    CHECK_EQ(got, B);
    CHECK_EQ(kv_model_session_pos(b), B);
    kv_store_stats(st, &s1);
    CHECK_EQ(s1.pages_used, s0.pages_used); /* shared, nothing copied */
    CHECK_OK(run_rest(b, ids, got, rb, db, V));
    CHECK(memcmp(ra, rb, (size_t)(N - B) * V * 4) == 0);
    CHECK(memcmp(da, db, (size_t)DEC * V * 4) == 0);
    CHECK_OK(kv_store_check(st));

    /* measured: a cold single-chunk prefill (another chunk boundary) */
    kv_model_session_t *c = session(m, st, 512);
    CHECK_OK(kv_model_forward(c, ids, N, cold, 1));
    double md = 0;
    for (uint32_t i = 0; i < V; i++) {
        double d = fabs((double)cold[i] - rb[(size_t)(N - B - 1) * V + i]);
        md = d > md ? d : md;
    }
    printf("%s: hit at %u of %u tokens: prefill and %u decode rows bit-identical to the "
           "publisher: %s; last row vs a cold one-chunk prefill: max |dlogit| %.3g\n",
           name, got, N, DEC,
           memcmp(ra, rb, (size_t)(N - B) * V * 4) || memcmp(da, db, (size_t)DEC * V * 4)
               ? "NO"
               : "yes",
           md);
    kv_model_session_free(a);
    kv_model_session_free(b);
    kv_model_session_free(c);
    CHECK_OK(kv_store_check(st));
    kv_store_destroy(st);
    free(ra), free(rb), free(da), free(db), free(cold);
}

int main(void)
{
    kv_tok_t *tok = NULL;
    kv_model_t *m = kvt_load(&tok);
    uint32_t n = 0;
    int32_t *ids = kvt_prefix_prompt(tok, &n);
    CHECK(n >= N);
    if (n >= N) {
        one_format(m, ids, KV_FMT_FP16, "fp16");
        one_format(m, ids, KV_FMT_INT4, "kivi-4");
        one_format(m, ids, KV_FMT_INT2, "kivi-2");
    }
    free(ids);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
