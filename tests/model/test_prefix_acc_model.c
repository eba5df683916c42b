/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_acc_model.c — prefix hits under the policies whose prefill
 * end reads attention summed over every prompt row (H2O, MiniKV), on the
 * real model (SmolLM2-135M): the statistics snapshot a node carries
 * (store/kv_store_prefix_acc.c) makes the hit's selection, and so its
 * decode, bit-identical to the publisher's.
 *
 * Per policy, in one store with the cache on (FP16 pages): session A
 * prefills a 300-token chat prompt in chunks [0,128) [128,256) [256,300),
 * publishing after the first two (snapshots at 128 and 256), then
 * kv_seq_prefill_end and 6 greedy decode tokens (kv_seq_step_end after
 * each). Session B matches the prompt (kv_model_session_prefix: 256, the
 * last node with a snapshot), prefills [256,300) (the same chunk as A),
 * kv_seq_prefill_end, decodes. Asserted: B's prompt rows and decode logits
 * equal A's bit for bit (memcmp), every list keeps the same tokens after
 * kv_seq_prefill_end (positions) and after the decode (positions, K, V
 * through kv_read), the selection evicted, 2 snapshots cached, kv_store_check. Printed (measured, not
 * asserted): against a cold session that prefills the 300 tokens in one
 * chunk (other float additions in the column sums, other FP16 roundings),
 * the tokens kept differently (summed over lists) and the max |logit
 * difference| of the last prompt row and of the decode rows (the cold
 * session decodes A's tokens).
 */
#include <math.h>
#include <string.h>

#include "kv_model_test.h"

#define N 300
#define CH 128
#define HIT 256
#define DEC 6
#define CTX 320

typedef struct kept {
    uint32_t n[90];        /* per list (layer * n_kv_heads + head)        */
    int32_t pos[90][CTX];  /* positions kept                             */
} kept_t;

static kv_model_session_t *session(const kv_model_t *m, kv_store_t *st, uint32_t chunk,
                                   const kv_policy_t *pol, kv_seq_id_t *seq)
{
    kv_model_session_opts_t o = {.store = st, .max_ctx = CTX, .chunk = chunk};
    kv_model_session_t *s = NULL;
    if (kv_model_session_create(m, &o, &s) || kv_model_session_seq(s, seq) ||
        kv_seq_set_policy(st, *seq, pol))
        exit(1);
    return s;
}

/* What every list of seq keeps; 0 or an error. */
static int kept_of(kv_store_t *st, kv_seq_id_t seq, uint32_t nl, uint32_t nkv, kept_t *k)
{
    for (uint32_t li = 0; li < nl * nkv; li++) {
        int rc = kv_seq_len(st, seq, li / nkv, li % nkv, &k->n[li]);
        if (!rc)
            rc = kv_read(st, seq, li / nkv, li % nkv, 0, k->n[li], NULL, NULL, k->pos[li]);
        if (rc)
            return rc;
    }
    return 0;
}

/* 1 if a and b keep the same tokens with the same K and V. */
static int same_kv(kv_store_t *st, kv_seq_id_t a, kv_seq_id_t b, uint32_t nl, uint32_t nkv,
                   uint32_t hd)
{
    size_t cnt = (size_t)CTX * hd;
    float *ka = malloc(cnt * 4), *va = malloc(cnt * 4), *kb = malloc(cnt * 4),
          *vb = malloc(cnt * 4);
    int same = ka && va && kb && vb;
    for (uint32_t li = 0; li < nl * nkv && same; li++) {
        uint32_t na = 0, nb = 0;
        same = !kv_seq_len(st, a, li / nkv, li % nkv, &na) &&
               !kv_seq_len(st, b, li / nkv, li % nkv, &nb) && na == nb &&
               !kv_read(st, a, li / nkv, li % nkv, 0, na, ka, va, NULL) &&
               !kv_read(st, b, li / nkv, li % nkv, 0, nb, kb, vb, NULL) &&
               !memcmp(ka, kb, (size_t)na * hd * 4) && !memcmp(va, vb, (size_t)na * hd * 4);
    }
    free(ka), free(va), free(kb), free(vb);
    return same;
}

/* Tokens kept by one of a, b but not the other, summed over lists. */
static uint64_t kept_diff(const kept_t *a, const kept_t *b, uint32_t lists, uint64_t *total)
{
    uint64_t d = 0;
    *total = 0;
    for (uint32_t li = 0; li < lists; li++) {
        uint8_t in[CTX] = {0};
        for (uint32_t i = 0; i < a->n[li]; i++)
            in[a->pos[li][i]] |= 1;
        for (uint32_t i = 0; i < b->n[li]; i++)
            in[b->pos[li][i]] |= 2;
        for (uint32_t t = 0; t < CTX; t++)
            d += in[t] == 1 || in[t] == 2;
        *total += a->n[li];
    }
    return d;
}

/* Decode DEC tokens (toks given, or greedy into toks when own != 0), logits
 * into dec, kv_seq_step_end after each. */
static int decode(kv_model_session_t *s, kv_store_t *st, kv_seq_id_t seq, const float *last,
                  int32_t *toks, int own, float *dec, uint32_t V)
{
    int rc = 0;
    for (uint32_t i = 0; i < DEC && rc == 0; i++) {
        if (own)
            toks[i] = kv_model_argmax(i ? dec + (size_t)(i - 1) * V : last, V);
        if (!(rc = kv_model_decode(s, toks[i], dec + (size_t)i * V)))
            rc = kv_seq_step_end(st, seq);
    }
    return rc;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        md = d > md ? d : md;
    }
    return md;
}

static void one_policy(const kv_model_t *m, const int32_t *ids, const char *spec)
{
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    const uint32_t V = hp->vocab, NL = hp->n_layers, NKV = hp->n_kv_heads, HD = hp->head_dim;
    CHECK(NL * NKV <= 90);
    if (NL * NKV > 90)
        return;
    kv_config_t cfg;
    kv_store_t *st = NULL;
    static const char fp[] = "SmolLM2-135M test fingerprint";
    CHECK_OK(kv_model_store_config(m, CTX, 3, 0, &cfg));
    cfg.prefix_cache = 1;
    cfg.prefix_model = fp;
    cfg.prefix_model_len = sizeof fp - 1;
    kv_policy_t *pol = NULL;
    char err[128];
    if (kv_store_create(&cfg, &st) || kv_policy_parse(spec, &pol, err, sizeof err))
        exit(1);
    const size_t R = (size_t)(N - HIT) * V, D = (size_t)DEC * V;
    float *ra = malloc(R * 4), *rb = malloc(R * 4), *da = malloc(D * 4), *db = malloc(D * 4);
    float *cold = malloc((size_t)V * 4), *dc = malloc(D * 4);
    kept_t *ka = malloc(sizeof *ka), *kb = malloc(sizeof *kb), *kc = malloc(sizeof *kc);
    int32_t toks[DEC], tb[DEC];
    if (!ra || !rb || !da || !db || !cold || !dc || !ka || !kb || !kc)
        exit(1);

    kv_seq_id_t sa, sb, sc;
    kv_model_session_t *a = session(m, st, CH, pol, &sa);
    CHECK_OK(kv_model_forward(a, ids, CH, NULL, 0));
    CHECK_EQ(kv_seq_prefix_publish(st, sa, ids, CH, NULL, 0), CH);
    CHECK_OK(kv_model_forward(a, ids + CH, HIT - CH, NULL, 0));
    CHECK_EQ(kv_seq_prefix_publish(st, sa, ids, HIT, NULL, 0), HIT);
    CHECK_OK(kv_model_forward(a, ids + HIT, N - HIT, ra, N - HIT));
    CHECK_OK(kv_seq_prefill_end(st, sa));
    CHECK_OK(kept_of(st, sa, NL, NKV, ka));
    CHECK_OK(decode(a, st, sa, ra + R - V, toks, 1, da, V));
    kv_stats_t s0 = {.struct_size = sizeof s0};
    kv_store_stats(st, &s0);
    CHECK_EQ(s0.prefix_snapshots, 2);
    CHECK_EQ(s0.prefix_snapshot_bytes, (uint64_t)NL * NKV * (CH + HIT) * 4);

    kv_model_session_t *b = session(m, st, CH, pol, &sb);
    uint32_t got = 0;
    CHECK_OK(kv_model_session_prefix(b, ids, N, NULL, 0, &got));
    CHECK_EQ(got, HIT);
    CHECK_OK(kv_model_forward(b, ids + HIT, N - HIT, rb, N - HIT));
    CHECK_OK(kv_seq_prefill_end(st, sb));
    CHECK_OK(kept_of(st, sb, NL, NKV, kb));
    uint64_t total = 0;
    const uint64_t dab = kept_diff(ka, kb, NL * NKV, &total);
    CHECK_EQ(dab, 0);
    CHECK(total < (uint64_t)N * NL * NKV); /* the selection evicted */
    CHECK_OK(decode(b, st, sb, rb + R - V, tb, 1, db, V));
    CHECK(memcmp(ra, rb, R * 4) == 0);
    CHECK(memcmp(da, db, D * 4) == 0);
    CHECK(memcmp(toks, tb, sizeof toks) == 0);
    CHECK(same_kv(st, sa, sb, NL, NKV, HD));
    CHECK_OK(kv_store_check(st));

    /* measured: a cold one-chunk prefill decoding A's tokens */
    kv_model_session_free(a); /* room in the pool (A's pages stay cached) */
    kv_model_session_t *c = session(m, st, 512, pol, &sc);
    CHECK_OK(kv_model_forward(c, ids, N, cold, 1));
    CHECK_OK(kv_seq_prefill_end(st, sc));
    CHECK_OK(kept_of(st, sc, NL, NKV, kc));
    CHECK_OK(decode(c, st, sc, cold, toks, 0, dc, V));
    uint64_t tc = 0;
    const uint64_t dcold = kept_diff(ka, kc, NL * NKV, &tc);
    printf("%s: hit at %u of %u tokens (chunks of %u): prompt rows, kept tokens and %u decode "
           "rows bit-identical to the publisher: %s; vs a cold one-chunk prefill: %llu of "
           "%llu kept tokens differ (over %u lists), max |dlogit| last prompt row %.3g, "
           "decode rows %.3g\n",
           spec, got, N, CH, DEC,
           !memcmp(ra, rb, R * 4) && !memcmp(da, db, D * 4) && dab == 0 ? "yes" : "NO",
           (unsigned long long)dcold, (unsigned long long)total, NL * NKV,
           max_diff(cold, ra + R - V, V), max_diff(dc, da, D));
    kv_model_session_free(b);
    kv_model_session_free(c);
    CHECK_OK(kv_store_check(st));
    kv_policy_destroy(pol);
    kv_store_destroy(st);
    free(ra), free(rb), free(da), free(db), free(cold), free(dc);
    free(ka), free(kb), free(kc);
}

int main(void)
{
    kv_tok_t *tok = NULL;
    kv_model_t *m = kvt_load(&tok);
    uint32_t n = 0;
    int32_t *ids = kvt_prefix_prompt(tok, &n);
    CHECK(n >= N);
    if (n >= N) {
        one_policy(m, ids, "h2o:hh=0.1,rw=0.1");
        one_policy(m, ids, "minikv:hh=0.1,rw=0.1");
    }
    free(ids);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
