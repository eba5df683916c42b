/* SPDX-License-Identifier: MIT */
/*
 * fuzz_spec.c — libFuzzer target for the two spec grammars of the public
 * API: policy specs (kv_policy_parse, e.g. "h2o:hh=0.1,rw=0.1+cam") and
 * memory-pressure ladders (kv_config_t.pressure at kv_store_create, e.g.
 * "int4,int2,evict:sink=4,recent=256"), both only through kvpage.h, so the
 * target does not care how the parsers are written.
 *
 * Input: byte 0 selects the grammar (bit 0: policy, else pressure; bit 1:
 * run an accepted policy on a sequence); the rest is the spec (cut at the
 * first NUL).
 * Properties, policy: a refusal is KV_EINVAL with a non-empty message; an
 * accepted spec's canonical form (kv_policy_describe) parses again and
 * describes to itself (a fixed point); attached to a fresh sequence of a
 * small store (2 layers x 2 kv heads, head_dim 16) it runs a prefill of 40
 * tokens with attention (under KVzip then one scoring pass: a fork marked
 * by kv_seq_score_begin attends over 4 more tokens), prefill end, and 3
 * decode steps, each call returning 0 or a documented error (KV_ENOTSUP at
 * attach, KV_ENOMEM later),
 * and the store passes kv_store_check. Pressure: kv_store_create returns 0
 * or KV_EINVAL / KV_ERANGE / KV_ENOTSUP; a created store reports a ladder
 * in kv_store_config and is destroyed cleanly.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "kvpage/kvpage.h"

#define T "fuzz_spec"
#define L 2u
#define H 2u
#define D 16u
#define N 40u

static kv_store_t *g_st;

static kv_config_t cfg(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L;
    c.n_q_heads = H;
    c.n_kv_heads = H;
    c.head_dim = D;
    c.host_pages = 512;
    c.max_seqs = 4;
    c.n_threads = 1;
    c.residual = 16;
    return c;
}

static int ok_or(int rc, int a, int b)
{
    return rc == 0 || rc == a || rc == b;
}

/* KVzip: one scoring pass of s over its first N tokens, through a fork
 * that attends over 4 tokens of its own (k, v, q: the caller's rows). */
static int score_pass(kv_seq_id_t s, const float *k, const float *v, const float *q,
                      float *out)
{
    kv_seq_id_t pass;
    int rc = kv_seq_fork(g_st, s, &pass);
    fz_check(ok_or(rc, KV_ENOMEM, KV_ENOMEM), T, "fork for the scoring pass");
    if (rc)
        return rc;
    rc = kv_seq_score_begin(g_st, pass, s, 0, N);
    fz_check(ok_or(rc, KV_ENOMEM, KV_ENOMEM), T, "score begin");
    for (uint32_t l = 0; rc == 0 && l < L; l++) {
        rc = kv_append(g_st, pass, l, 4, KV_DTYPE_F32, k, v, NULL);
        fz_check(ok_or(rc, KV_ENOMEM, KV_ENOMEM), T, "scoring pass append");
        kv_prefill_t pf = {.layer = l, .seq = pass, .n_new = 4, .q = q, .out = out};
        if (rc == 0)
            fz_check(ok_or(rc = kv_attn_prefill(g_st, &pf), KV_ENOMEM, KV_ENOMEM), T,
                     "scoring pass attention");
    }
    fz_check(kv_seq_free(g_st, pass) == 0, T, "free the scoring pass");
    return rc;
}

/* Prefill and a few decode steps under policy p. */
static void run_policy(const kv_policy_t *p)
{
    static float k[N * H * D], v[N * H * D], q[N * H * D], out[N * H * D];
    for (uint32_t i = 0; i < N * H * D; i++) {
        k[i] = (float)((int)(i * 37 % 101) - 50) / 50.0f;
        v[i] = (float)((int)(i * 53 % 97) - 48) / 48.0f;
        q[i] = (float)((int)(i * 29 % 89) - 44) / 44.0f;
    }
    kv_seq_id_t s;
    fz_check(kv_seq_create(g_st, &s) == 0, T, "seq create");
    int rc = kv_seq_set_policy(g_st, s, p);
    fz_check(ok_or(rc, KV_ENOTSUP, KV_EINVAL), T, "set_policy: 0 or not for this store");
    for (uint32_t l = 0; rc == 0 && l < L; l++) {
        rc = kv_append(g_st, s, l, N, KV_DTYPE_F32, k, v, NULL);
        fz_check(ok_or(rc, KV_ENOMEM, KV_ENOMEM), T, "append");
        kv_prefill_t pf = {.layer = l, .seq = s, .n_new = N, .q = q, .out = out};
        if (rc == 0)
            fz_check(ok_or(rc = kv_attn_prefill(g_st, &pf), KV_ENOMEM, KV_ENOMEM), T,
                     "prefill attention");
    }
    kv_policy_info_t in;
    if (rc == 0 && !kv_policy_info(p, L, N, &in) && (in.methods & KV_POLICY_KVZIP))
        rc = score_pass(s, k, v, q, out);
    if (rc == 0)
        fz_check(ok_or(rc = kv_seq_prefill_end(g_st, s), KV_ENOMEM, KV_ENOMEM), T, "prefill end");
    for (uint32_t step = 0; rc == 0 && step < 3; step++) {
        for (uint32_t l = 0; rc == 0 && l < L; l++) {
            rc = kv_append(g_st, s, l, 1, KV_DTYPE_F32, k + step * H * D, v + step * H * D,
                           NULL);
            fz_check(ok_or(rc, KV_ENOMEM, KV_ENOMEM), T, "decode append");
            kv_decode_t d = {.layer = l, .batch = 1, .seqs = &s, .q = q, .out = out};
            if (rc == 0)
                fz_check(ok_or(rc = kv_attn_decode(g_st, &d), KV_ENOMEM, KV_ESTATE), T,
                         "decode attention");
        }
        if (rc == 0)
            fz_check(ok_or(rc = kv_seq_step_end(g_st, s), KV_ENOMEM, KV_ENOMEM), T, "step end");
    }
    fz_check(kv_store_check(g_st) == 0, T, "the store passes its check");
    fz_check(kv_seq_free(g_st, s) == 0, T, "free");
}

static void policy(const char *spec, int run)
{
    kv_policy_t *p = NULL, *p2 = NULL;
    char err[256] = "";
    int rc = kv_policy_parse(spec, &p, err, sizeof err);
    if (rc) {
        fz_check(rc == KV_EINVAL && p == NULL && err[0], T, "a refusal says why");
        return;
    }
    static char a[65536], b[65536];
    fz_check(kv_policy_describe(p, a, sizeof a) == 0, T, "describe");
    rc = kv_policy_parse(a, &p2, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s: '%s' -> '%s' refused: %s\n", T, spec, a, err);
    fz_check(rc == 0, T, "the canonical form parses");
    fz_check(kv_policy_describe(p2, b, sizeof b) == 0 && !strcmp(a, b), T,
             "the canonical form is a fixed point");
    if (run)
        run_policy(p);
    kv_policy_destroy(p);
    kv_policy_destroy(p2);
}

static void pressure(const char *spec)
{
    kv_config_t c = cfg();
    c.host_pages = 64;
    c.pressure = spec;
    kv_store_t *st = NULL;
    int rc = kv_store_create(&c, &st);
    fz_check(rc == 0 || rc == KV_EINVAL || rc == KV_ERANGE || rc == KV_ENOTSUP, T,
             "pressure: 0 or a documented error");
    if (rc == 0) {
        kv_config_t got;
        fz_check(kv_store_config(st, &got) == 0, T, "config");
        fz_check(!*spec || (got.pressure && *got.pressure), T, "a created store has a ladder");
        kv_store_destroy(st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *s = malloc(size);
    if (!s)
        return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = 0;
    if (data[0] & 1)
        policy(s, (data[0] >> 1) & 1);
    else
        pressure(s);
    free(s);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    kv_config_t c = cfg();
    if (kv_store_create(&c, &g_st)) {
        fprintf(stderr, "%s: no store\n", T);
        exit(1);
    }
    return 0;
}
