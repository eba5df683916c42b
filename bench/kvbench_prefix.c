/* SPDX-License-Identifier: MIT */
/*
 * kvbench_prefix.c — time to first token of SmolLM2-135M with the prefix
 * cache (docs/prefix.md): a cold prefill against a hit from the host tier,
 * measured in the same run, and the cost of hashing the prompt.
 *
 * One store with the cache on (kv_config_t.prefix_cache, fingerprint: the
 * model file's SHA-256). The prompt is --tokens pseudo-random ordinary token
 * ids (default 4096; the speed does not depend on the text).
 *   cold  a fresh session: kv_model_session_prefix (a miss), the prefill of
 *         the whole prompt in chunks of 256 and the logits of its last row:
 *         the time to first token. The first --cached tokens (default 3968)
 *         are then published (kv_seq_prefix_publish). Once (it is slow).
 *   host  --reps times (default 5, median): a fresh session matches the
 *         prompt (--cached tokens attached from the pool), prefills the rest
 *         and computes the last row's logits. Also reported: max |logit
 *         difference| of the last row against the cold run (the hit's chunk
 *         boundary at --cached differs from the cold run's 256-token chunks,
 *         so FP16 roundings may differ; measured, not asserted).
 *   redis, redis-cluster
 *         the cold store publishes to its own redis-server (started here,
 *         scripts/kv_redis.sh, loopback); its values are then copied to a
 *         3-master cluster (kv_remote_get / kv_remote_set: the same frames).
 *         --reps times each: a fresh store (empty host tier) with that
 *         remote matches (fetch + validation + install of --cached tokens'
 *         nodes), prefills the rest; ttft median; fetch_gbps = value bytes
 *         installed / the match's time.
 *   redis-mac
 *         the same values signed (docs/prefix.md, "Deployments"): copied on
 *         the same server from the key prefix --remote-ns (default kvp,
 *         unsigned) to "<ns>-mac", signed with the MAC key --remote-mac SRC
 *         (file:PATH or env:NAME; default: a random key made for the run);
 *         then as redis, with a store that has that prefix and key: the
 *         signing's cost beside the unsigned row of the same run.
 *   redis-tls
 *         the same against a third server that speaks TLS only (--tls-port,
 *         --port 0; certificates made here with the openssl command, in a
 *         mkdtemp() directory under --dir, removed at the end): rediss://,
 *         the server verified against that CA (prefix_remote_tls_ca), the
 *         values copied from the first server as for the cluster.
 * redis_get_gbps: Redis's own GET throughput for the same values: every
 * stored value fetched with pipelined GETs on one plain hiredis connection
 * (no check, no copy), bytes / time, median of 3, in the same run.
 * hash_ns_per_token: kv_prefix_hash_blocks over the whole prompt with a
 * hasher made for it (what a match does), median of 15.
 *   file  after a restart: the cold store has a page file (in --dir, default
 *         the current directory: a mkdtemp() directory, removed at the
 *         end); destroying it after the host runs writes its nodes there
 *         (kv_store_destroy syncs the cache's host nodes). --reps times: a
 *         store opened on that file (KV_OFFLOAD_OPEN, the nodes restored
 *         as nodes on the file, open_s = that kv_store_create), a fresh
 *         session matches the prompt (its nodes read back from the file
 *         and installed: fetch_gbps = page bytes read / the match's time),
 *         prefills the rest; the store is destroyed again (the nodes keep
 *         their copies: nothing rewritten). ttft median; max |logit diff|
 *         against the host hit's logits (the same pages: 0 expected).
 *   ctx-cold, ctx-host
 *         compressed contexts (docs/prefix.md), policy --compressed (default
 *         kvzip:c=0.2,ada=1+int4; "none" skips them), in a store of their
 *         own: the first --cached tokens are the context, the rest the
 *         question. ctx-cold: a fresh session forwards the context (chunks
 *         of 256), runs KVzip's scoring pass (kv_model_kvzip_score), ends
 *         the prefill, publishes the compressed context, forwards the rest
 *         (the last row's logits) and calls kv_seq_step_end: its ttft. Once.
 *         ctx-host, --reps times: a fresh session installs the context
 *         (kv_model_session_context), forwards the rest, step end; ttft
 *         median; logits_equal_cold: memcmp of the last row's logits
 *         against ctx-cold's (a hit must equal the cold run bit for bit).
 *         Bytes per cached prefix: the FP16 blocks' pool pages (the host
 *         tier's nodes of the first --cached tokens) against the context
 *         node's pool pages plus its host metadata (node block and policy
 *         state: the meta_bytes the publish added).
 *
 * Usage: kvbench-prefix [--json] [--threads N] [--tokens N] [--cached N]
 *                       [--reps N] [--model FILE] [--no-redis] [--dir DIR]
 *                       [--remote-ns NS] [--remote-mac SRC]
 *                       [--compressed SPEC|none]
 */
#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "kv_bench_util.h"
#include "kv_model.h"
#include "kv_tok.h"
#include "tests/kv_test_redis.h"
#include "formats/kv_fmt_layout.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload.h"
#include "prefix/kv_prefix_hash.h"
#include "remote/kv_remote.h"

int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms); /* store/kv_store_int.h */

typedef struct opts {
    int json, threads, no_redis;
    uint32_t tokens, cached, reps;
    const char *model, *dir;
    const char *compressed; /* policy of the compressed-context rows, NULL: none */
    const char *ns, *mac; /* --remote-ns (default "kvp"), --remote-mac (NULL: a random key) */
} opts_t;

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.tokens = 4096, .cached = 3968, .reps = 5, .dir = ".", .ns = "kvp",
                  .compressed = "kvzip:c=0.2,ada=1+int4"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t u;
        if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--threads") && v && !parse_u32(v, 0, 1024, &u)) {
            o->threads = (int)u, i++;
        } else if (!strcmp(a, "--tokens") && v && !parse_u32(v, 32, 1u << 20, &u)) {
            o->tokens = u, i++;
        } else if (!strcmp(a, "--cached") && v && !parse_u32(v, 16, 1u << 20, &u)) {
            o->cached = u, i++;
        } else if (!strcmp(a, "--reps") && v && !parse_u32(v, 1, 1000, &u)) {
            o->reps = u, i++;
        } else if (!strcmp(a, "--no-redis")) {
            o->no_redis = 1;
        } else if (!strcmp(a, "--model") && v) {
            o->model = v, i++;
        } else if (!strcmp(a, "--dir") && v) {
            o->dir = v, i++;
        } else if (!strcmp(a, "--compressed") && v) {
            o->compressed = strcmp(v, "none") ? v : NULL, i++;
        } else if (!strcmp(a, "--remote-ns") && v && v[0] && strlen(v) <= 60) {
            o->ns = v, i++;
        } else if (!strcmp(a, "--remote-mac") && v && !kv_remote_secret_check(v)) {
            o->mac = v, i++;
        } else {
            fprintf(stderr, "usage: kvbench-prefix [--json] [--threads N] [--tokens N] "
                            "[--cached N] [--reps N] [--model FILE] [--no-redis] "
                            "[--dir DIR] [--remote-ns NS] [--remote-mac file:PATH|env:NAME]\n"
                            "                      [--compressed SPEC|none]\n"
                            "  --remote-ns: key prefix of the remote rows (1..60 bytes; "
                            "default kvp;\n    the signed row uses NS-mac)\n"
                            "  --remote-mac: the signed row's MAC key source (64..128 hex "
                            "digits;\n    default: a random key made for the run)\n"
                            "  --compressed: the compressed-context rows' policy (default "
                            "kvzip:c=0.2,ada=1+int4;\n    none: no such rows)\n");
            return -1;
        }
    }
    if (o->cached >= o->tokens) {
        fprintf(stderr, "kvbench-prefix: --cached must be below --tokens\n");
        return -1;
    }
    return 0;
}

/* Seconds from an empty session to the last prompt row's logits; *matched
 * tokens came from the cache. The session is returned in *out. */
static double match_s; /* the last ttft()'s match time */

static int ttft(const kv_model_t *m, kv_store_t *st, const int32_t *ids, uint32_t n,
                int threads, float *logits, uint32_t *matched, kv_model_session_t **out,
                double *sec)
{
    kv_model_session_opts_t so = {.store = st, .max_ctx = n, .chunk = 256,
                                  .n_threads = threads};
    kv_model_session_t *s = NULL;
    int rc = kv_model_session_create(m, &so, &s);
    if (rc)
        return rc;
    double t0 = kv_bench_now();
    if (!(rc = kv_model_session_prefix(s, ids, n, NULL, 0, matched))) {
        match_s = kv_bench_now() - t0;
        rc = kv_model_forward(s, ids + *matched, n - *matched, logits, 1);
    }
    *sec = kv_bench_now() - t0;
    if (rc)
        kv_model_session_free(s);
    else
        *out = s;
    return rc;
}

static double hash_ns_per_token(const kv_config_t *c, const int32_t *ids, uint32_t n)
{
    double v[15];
    const uint32_t B = kv_fmt_fp16_tpp(c->head_dim, c->page_bytes), blocks = n / B;
    kv_prefix_hash_t *h = malloc((size_t)blocks * sizeof *h);
    if (!h)
        return -1;
    for (int r = 0; r < 15; r++) {
        kv_prefix_fp_t fp = {.model = c->prefix_model, .model_len = c->prefix_model_len,
                             .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                             .head_dim = c->head_dim, .page_bytes = c->page_bytes,
                             .block_tokens = B, .state = "fp16", .state_len = 4};
        double t0 = kv_bench_now();
        kv_prefix_hasher_t *hs = NULL;
        if (kv_prefix_hash_create(&fp, &hs) ||
            kv_prefix_hash_blocks(hs, NULL, (const uint32_t *)ids, (size_t)blocks * B, h,
                                  blocks) != (int)blocks) {
            kv_prefix_hash_destroy(hs);
            free(h);
            return -1;
        }
        kv_prefix_hash_destroy(hs);
        v[r] = (kv_bench_now() - t0) * 1e9 / ((double)blocks * B);
    }
    free(h);
    return kv_bench_median(v, 15);
}

/* Every ns:* key of node 0 of t: n keys as kv_remote_key_t (malloc'd). */
static kv_remote_key_t *all_keys(const kv_tredis_t *t, const char *ns, size_t *n)
{
    redisReply *r = kv_tredis_cmd(t, 0, "KEYS %s:*", ns);
    const size_t nl = strlen(ns);
    *n = 0;
    kv_remote_key_t *k = r && r->type == REDIS_REPLY_ARRAY
                             ? malloc((r->elements + 1) * sizeof *k) : NULL;
    for (size_t i = 0; k && i < r->elements; i++) {
        const char *h = r->element[i]->str + nl + 1;
        if (r->element[i]->len != nl + 1 + 64)
            continue;
        for (int j = 0; j < 32; j++) {
            unsigned v;
            sscanf(h + 2 * j, "%2x", &v);
            k[*n].hash[j] = (uint8_t)v;
        }
        (*n)++;
    }
    freeReplyObject(r);
    return k;
}

/* Copy keys from one server set (and key prefix) to another through the
 * remote client (the same payloads; framed, or signed when ct has a MAC
 * key): the number copied. */
static size_t copy_keys(kv_remote_config_t cf, kv_remote_config_t ct, const kv_remote_key_t *k,
                        size_t n)
{
    cf.timeout_ms = ct.timeout_ms = 10000;
    kv_remote_t *a = NULL, *b = NULL;
    size_t done = 0, cap = 8u << 20;
    uint8_t *buf = malloc(cap);
    if (buf && !kv_remote_create(&cf, &a) && !kv_remote_create(&ct, &b))
        for (size_t i = 0; i < n; i++) {
            kv_remote_get_t g = {.key = k[i], .dst = buf, .cap = cap};
            if (kv_remote_get(a, &g, 1) != 1)
                continue;
            struct iovec iov = {buf, g.len};
            kv_remote_set_t st = {.key = k[i], .format = g.format, .iov = &iov, .iovcnt = 1};
            done += kv_remote_set(b, &st, 1) == 1;
        }
    kv_remote_destroy(a);
    kv_remote_destroy(b);
    free(buf);
    return done;
}

/* Redis's own GET throughput (GB/s) for the values under keys on node 0 of
 * t: pipelined GETs on one plain hiredis connection, median of 3. */
static double raw_get_gbps(const kv_tredis_t *t, const char *ns, const kv_remote_key_t *k,
                           size_t n)
{
    redisContext *c = kv_tredis_connect(t, 0);
    double v[3] = {0, 0, 0};
    for (int r = 0; c && r < 3; r++) {
        double t0 = kv_bench_now();
        size_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            char key[160];
            kv_remote_key_string(ns, &k[i], key, sizeof key);
            redisAppendCommand(c, "GET %s", key);
        }
        for (size_t i = 0; i < n; i++) {
            redisReply *rep = NULL;
            if (redisGetReply(c, (void **)&rep) != REDIS_OK)
                break;
            bytes += rep && rep->type == REDIS_REPLY_STRING ? rep->len : 0;
            freeReplyObject(rep);
        }
        v[r] = (double)bytes / (kv_bench_now() - t0) / 1e9;
    }
    if (c)
        redisFree(c);
    return kv_bench_median(v, 3);
}

typedef struct tier_res {
    double ttft_s, fetch_gbps;
    uint32_t matched;
    uint64_t bad, errors;
} tier_res_t;

/* --reps stores made from cfg, each matching the prompt and prefilling the
 * rest: the median time to first token, fetch rate (tier bytes in / the
 * match's time), checks failed and errors. remote: cfg with that remote (a
 * fresh, empty pool each time); NULL: cfg's page file reopened (a restart
 * each; *open_s = the median kv_store_create). See the file comment. */
static int tier_reps(const kv_model_t *m, const kv_config_t *cfg, const char *remote,
                     const opts_t *o, const int32_t *ids, float *logits, tier_res_t *res,
                     double *open_s)
{
    double *tv = calloc(o->reps, sizeof *tv), *gv = calloc(o->reps, sizeof *gv);
    double *ov = calloc(o->reps, sizeof *ov);
    int rc = tv && gv && ov ? 0 : KV_ENOMEM;
    memset(res, 0, sizeof *res);
    for (uint32_t r = 0; rc == 0 && r < o->reps; r++) {
        kv_config_t c = *cfg;
        c.prefix_remote = remote;
        c.prefix_remote_timeout_ms = remote ? 10000 : 0;
        if (!remote) {
            c.offload_pages = 0;
            c.offload_flags |= KV_OFFLOAD_OPEN;
        }
        kv_store_t *st = NULL;
        kv_model_session_t *s = NULL;
        double t0 = kv_bench_now();
        if ((rc = kv_store_create(&c, &st)))
            break;
        ov[r] = kv_bench_now() - t0;
        if ((rc = ttft(m, st, ids, o->tokens, o->threads, logits, &res->matched, &s, &tv[r]))) {
            kv_store_destroy(st);
            break;
        }
        kv_stats_t sts = {.struct_size = sizeof sts};
        kv_store_stats(st, &sts);
        gv[r] = (double)(remote ? sts.prefix_remote_bytes_in : sts.prefix_file_bytes_in) /
                match_s / 1e9;
        res->bad += remote ? sts.prefix_remote_bad : sts.prefix_file_bad;
        res->errors += remote ? sts.prefix_remote_errors : sts.io_errors;
        kv_model_session_free(s);
        kv_store_destroy(st);
        fprintf(stderr, "kvbench-prefix: %s hit %u/%u (store made in %.3f s): %u tokens "
                "matched, %.3f s (match %.3f s)\n", remote ? remote : "file", r + 1, o->reps,
                ov[r], res->matched, tv[r], match_s);
    }
    if (rc == 0) {
        res->ttft_s = kv_bench_median(tv, o->reps);
        res->fetch_gbps = kv_bench_median(gv, o->reps);
        if (open_s)
            *open_s = kv_bench_median(ov, o->reps);
    }
    free(tv);
    free(gv);
    free(ov);
    return rc;
}

/* The compressed-context rows (file comment). */
typedef struct ctx_res {
    double cold_s, hit_s;        /* ttft: cold (once), hit (median)          */
    uint64_t page_bytes, meta;   /* the context node's pool pages, metadata  */
    uint32_t kept;               /* tokens the context keeps, all lists      */
    int same;                    /* every hit's logits == the cold run's     */
} ctx_res_t;

static int ctx_session(const kv_model_t *m, kv_store_t *st, const opts_t *o,
                       const kv_policy_t *pol, kv_model_session_t **s, kv_seq_id_t *seq)
{
    kv_model_session_opts_t so = {.store = st, .max_ctx = o->tokens, .chunk = 256,
                                  .n_threads = o->threads};
    int rc = kv_model_session_create(m, &so, s);
    if (!rc && ((rc = kv_model_session_seq(*s, seq)) || (rc = kv_seq_set_policy(st, *seq, pol))))
        kv_model_session_free(*s);
    return rc;
}

static int ctx_rows(const kv_model_t *m, const kv_config_t *cfg0, const opts_t *o,
                    const int32_t *ids, ctx_res_t *res)
{
    const uint32_t V = kv_model_hparams(m)->vocab;
    kv_tok_t *tok = NULL;
    kv_policy_t *pol = NULL;
    kv_store_t *st = NULL;
    kv_model_session_t *s = NULL;
    kv_seq_id_t seq;
    char err[256] = "";
    float *lc = malloc((size_t)V * 4), *lh = malloc((size_t)V * 4);
    double *hv = calloc(o->reps, sizeof *hv);
    kv_config_t c;
    int rc = lc && lh && hv ? 0 : KV_ENOMEM;
    if (!rc && (rc = kv_policy_parse(o->compressed, &pol, err, sizeof err)))
        fprintf(stderr, "kvbench-prefix: --compressed: %s\n", err);
    if (!rc)
        rc = kv_tok_from_gguf(kv_model_gguf(m), &tok, err, sizeof err);
    if (!rc && !(rc = kv_model_store_config(m, o->tokens + kv_model_kvzip_room(
                                                               KV_MODEL_KVZIP_CHUNK),
                                            3, (uint32_t)o->threads, &c))) {
        c.prefix_cache = 1;
        c.prefix_model = cfg0->prefix_model;
        c.prefix_model_len = cfg0->prefix_model_len;
        if (!(rc = kv_store_create(&c, &st)))
            rc = kv_store_config(st, &c); /* the page size chosen */
    }
    kv_policy_info_t pin;
    const int kvzip = pol && !kv_policy_info(pol, 1, 0, &pin) && (pin.methods & KV_POLICY_KVZIP);
    fprintf(stderr, "kvbench-prefix: compressed context (%s): cold run...\n", o->compressed);
    double t0 = kv_bench_now();
    if (!rc && !(rc = ctx_session(m, st, o, pol, &s, &seq))) {
        kv_stats_t a = {.struct_size = sizeof a}, b = {.struct_size = sizeof b};
        if (!(rc = kv_model_forward(s, ids, o->cached, NULL, 0)) && kvzip)
            rc = kv_model_kvzip_score(s, tok, ids, o->cached, 0, KV_MODEL_KVZIP_CHUNK);
        if (!rc && !(rc = kv_seq_prefill_end(st, seq))) {
            kv_store_stats(st, &a);
            rc = kv_seq_prefix_publish_compressed(st, seq, ids, o->cached, NULL, 0);
            kv_store_stats(st, &b);
            res->page_bytes = b.prefix_pages * c.page_bytes;
            res->meta = b.meta_bytes - a.meta_bytes;
            res->kept = (uint32_t)b.tokens;
        }
        if (!rc && !(rc = kv_model_forward(s, ids + o->cached, o->tokens - o->cached, lc, 1)))
            rc = kv_seq_step_end(st, seq);
        res->cold_s = kv_bench_now() - t0;
        kv_model_session_free(s);
    }
    res->same = 1;
    for (uint32_t r = 0; !rc && r < o->reps; r++) {
        uint32_t got = 0;
        t0 = kv_bench_now();
        if ((rc = ctx_session(m, st, o, pol, &s, &seq)))
            break;
        if (!(rc = kv_model_session_context(s, ids, o->cached, NULL, 0, &got)) &&
            got != o->cached)
            rc = KV_ESTATE; /* a miss: the context was published above */
        if (!rc && !(rc = kv_model_forward(s, ids + o->cached, o->tokens - o->cached, lh, 1)))
            rc = kv_seq_step_end(st, seq);
        hv[r] = kv_bench_now() - t0;
        res->same &= !rc && memcmp(lc, lh, (size_t)V * 4) == 0;
        kv_model_session_free(s);
        fprintf(stderr, "kvbench-prefix: compressed context hit %u/%u: %.3f s\n", r + 1,
                o->reps, hv[r]);
    }
    if (!rc)
        res->hit_s = kv_bench_median(hv, o->reps);
    kv_store_destroy(st);
    kv_policy_destroy(pol);
    kv_tok_destroy(tok);
    free(lc), free(lh), free(hv);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse(argc, argv, &o))
        return 2;
    char path[4096], err[512], fp[65];
    int pinned, rc;
    kv_model_t *m = NULL;
    if (kv_model_find(o.model, path, sizeof path, &pinned, err, sizeof err) ||
        kv_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "kvbench-prefix: %s\n", err);
        return 1;
    }
    const kv_model_hparams_t *hp = kv_model_hparams(m);
    if (o.tokens > hp->n_ctx) {
        fprintf(stderr, "kvbench-prefix: --tokens %u exceeds the model's context %u\n",
                o.tokens, hp->n_ctx);
        return 2;
    }
    const uint32_t V = hp->vocab;
    int32_t *ids = malloc((size_t)o.tokens * sizeof *ids);
    float *lc = malloc((size_t)V * 4), *lh = malloc((size_t)V * 4);
    kv_config_t cfg;
    kv_store_t *st = NULL;
    if (!ids || !lc || !lh || (rc = kv_model_file_sha256(path, pinned, fp)) ||
        kv_model_store_config(m, o.tokens, 3, (uint32_t)o.threads, &cfg)) {
        fprintf(stderr, "kvbench-prefix: set-up failed\n");
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < o.tokens; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        ids[i] = 200 + (int32_t)((x * 2685821657736338717ull >> 33) % 20000);
    }
    cfg.prefix_cache = 1;
    cfg.prefix_model = fp;
    cfg.prefix_model_len = 64;
    kv_config_t cfg0 = cfg; /* without a remote or a page file */
    /* the page file: room for the cached nodes' pages and records */
    char dir[4096], pfile[4200];
    snprintf(dir, sizeof dir, "%s/kvbench-prefix-XXXXXX", o.dir);
    if (!mkdtemp(dir)) {
        perror("kvbench-prefix: mkdtemp");
        return 1;
    }
    snprintf(pfile, sizeof pfile, "%s/pages", dir);
    {
        const uint32_t pb = cfg.page_bytes ? cfg.page_bytes : 64u * cfg.head_dim; /* 0: default */
        const uint32_t B = kv_fmt_fp16_tpp(cfg.head_dim, pb), lists = cfg.n_layers * cfg.n_kv_heads;
        const uint64_t rec = (128ull + 32ull * lists + pb - 1) / pb;
        cfg.offload_path = pfile;
        cfg.offload_pages = (uint32_t)((o.cached / B + 1) * (lists + rec) + 1024);
    }
    const kv_config_t cfg_file = cfg;
    static kv_tredis_t single, cluster, tls; /* static: kv_test_redis.h's atexit */
    char tls_dir[4096] = "", tls_ca[4200] = "", tls_url[128] = "";
    if (!o.no_redis) {
        kv_tredis_start(&single, "single");
        kv_tredis_start(&cluster, "cluster");
        char sargs[13000], cargs[4300];
        snprintf(tls_dir, sizeof tls_dir, "%s/kvbench-tls-XXXXXX", o.dir);
        char *abs = mkdtemp(tls_dir) ? realpath(tls_dir, NULL) : NULL; /* (redis-server */
        if (!abs) {                                       /* reads them after its chdir) */
            perror("kvbench-prefix: mkdtemp");
            return 1;
        }
        snprintf(tls_dir, sizeof tls_dir, "%s", abs);
        free(abs);
        kv_tredis_certs(tls_dir);
        snprintf(tls_ca, sizeof tls_ca, "%s/ca.crt", tls_dir);
        snprintf(sargs, sizeof sargs, "--tls-cert-file %s/srv.crt --tls-key-file %s/srv.key "
                 "--tls-ca-cert-file %s --tls-auth-clients no", tls_dir, tls_dir, tls_ca);
        snprintf(cargs, sizeof cargs, "--tls --cacert %s", tls_ca);
        kv_tredis_start_ex(&tls, "single", sargs, cargs, 1, NULL);
        snprintf(tls_url, sizeof tls_url, "rediss://127.0.0.1:%d", tls.port[0]);
        cfg.prefix_remote = single.url;
        cfg.prefix_remote_timeout_ms = 10000;
        cfg.prefix_remote_ns = o.ns;
    }
    if ((rc = kv_store_create(&cfg, &st)) || (rc = kv_store_config(st, &cfg))) {
        fprintf(stderr, "kvbench-prefix: kv_store_create: %s\n", kv_strerror(rc));
        return 1;
    }
    const double hash_ns = hash_ns_per_token(&cfg, ids, o.tokens);

    /* cold, then publish the first --cached tokens */
    fprintf(stderr, "kvbench-prefix: cold prefill of %u tokens...\n", o.tokens);
    kv_model_session_t *s = NULL;
    kv_seq_id_t seq;
    uint32_t matched = 0;
    double cold_s = 0;
    if ((rc = ttft(m, st, ids, o.tokens, o.threads, lc, &matched, &s, &cold_s)) ||
        (rc = kv_model_session_seq(s, &seq))) {
        fprintf(stderr, "kvbench-prefix: cold run: %s\n", kv_strerror(rc));
        return 1;
    }
    int pub = kv_seq_prefix_publish(st, seq, ids, o.cached, NULL, 0);
    kv_model_session_free(s);
    if (pub < 0 || (!o.no_redis && kv_store_prefix_flush(st, 60000))) {
        fprintf(stderr, "kvbench-prefix: publish: %s\n", kv_strerror(pub));
        return 1;
    }

    /* host hits */
    double *hv = malloc(o.reps * sizeof *hv), maxd = 0;
    uint32_t hit = 0;
    for (uint32_t r = 0; hv && r < o.reps; r++) {
        if ((rc = ttft(m, st, ids, o.tokens, o.threads, lh, &hit, &s, &hv[r]))) {
            fprintf(stderr, "kvbench-prefix: host run: %s\n", kv_strerror(rc));
            return 1;
        }
        kv_model_session_free(s);
        fprintf(stderr, "kvbench-prefix: host hit %u/%u: %u tokens matched, %.3f s\n", r + 1,
                o.reps, hit, hv[r]);
    }
    if (!hv)
        return 1;
    for (uint32_t i = 0; i < V; i++)
        maxd = fmax(maxd, fabs((double)lc[i] - lh[i]));
    const double host_s = kv_bench_median(hv, o.reps);
    kv_stats_t sts = {.struct_size = sizeof sts};
    kv_store_stats(st, &sts);
    /* the page file: the cold store's nodes written at its destroy, then
     * restarts */
    kv_store_destroy(st);
    st = NULL;
    tier_res_t fr = {0};
    double open_s = 0, maxdf = 0;
    float *lf = malloc((size_t)V * 4);
    if (!lf || (rc = tier_reps(m, &cfg_file, NULL, &o, ids, lf, &fr, &open_s))) {
        fprintf(stderr, "kvbench-prefix: file run: %s\n", kv_strerror(rc));
        return 1;
    }
    for (uint32_t i = 0; i < V; i++)
        maxdf = fmax(maxdf, fabs((double)lh[i] - lf[i]));
    kv_offload_unlink(pfile);
    rmdir(dir);
    /* the remote tiers */
    tier_res_t rr = {0}, rc2 = {0}, rm = {0}, rt = {0};
    double get_gbps = 0;
    size_t n_keys = 0, copied = 0, signed_n = 0, copied_tls = 0;
    if (!o.no_redis) {
        /* the signed row's key: --remote-mac, or a random one for this run */
        char hex[2 * KV_REMOTE_MAC_KEY_MIN + 1], ns_mac[80];
        uint8_t key[KV_REMOTE_MAC_KEY_MAX];
        size_t kl = 0;
        if (!o.mac) {
            FILE *ur = fopen("/dev/urandom", "rb");
            int got = ur && fread(key, 1, KV_REMOTE_MAC_KEY_MIN, ur) == KV_REMOTE_MAC_KEY_MIN;
            if (ur)
                fclose(ur);
            for (unsigned i = 0; got && i < KV_REMOTE_MAC_KEY_MIN; i++)
                snprintf(hex + 2 * i, 3, "%02x", key[i]);
            if (!got || setenv("KVBENCH_PREFIX_MAC", hex, 1)) {
                fprintf(stderr, "kvbench-prefix: no random MAC key\n");
                return 1;
            }
            o.mac = "env:KVBENCH_PREFIX_MAC";
        }
        if ((rc = kv_remote_secret_load(o.mac, key, &kl))) {
            fprintf(stderr, "kvbench-prefix: --remote-mac %s: %s\n", o.mac, kv_strerror(rc));
            return 1;
        }
        snprintf(ns_mac, sizeof ns_mac, "%s-mac", o.ns);
        kv_remote_key_t *keys = all_keys(&single, o.ns, &n_keys);
        kv_remote_config_t from = {.url = single.url, .ns = o.ns};
        kv_remote_config_t to_cluster = {.url = cluster.url, .ns = o.ns};
        kv_remote_config_t to_signed = {.url = single.url, .ns = ns_mac, .mac_key = key,
                                        .mac_key_len = (uint32_t)kl};
        kv_remote_config_t to_tls = {.url = tls_url, .ns = o.ns, .tls_ca_file = tls_ca};
        copied = keys ? copy_keys(from, to_cluster, keys, n_keys) : 0;
        copied_tls = keys ? copy_keys(from, to_tls, keys, n_keys) : 0;
        signed_n = keys ? copy_keys(from, to_signed, keys, n_keys) : 0;
        memset(key, 0, sizeof key);
        get_gbps = keys ? raw_get_gbps(&single, o.ns, keys, n_keys) : 0;
        free(keys);
        fprintf(stderr, "kvbench-prefix: %zu values on the server, %zu copied to the cluster, "
                "%zu signed, %zu to the TLS server, raw GET %.3f GB/s\n", n_keys, copied,
                signed_n, copied_tls, get_gbps);
        cfg0.prefix_remote_ns = o.ns;
        kv_config_t cfg_mac = cfg0;
        cfg_mac.prefix_remote_ns = ns_mac;
        cfg_mac.prefix_remote_mac = o.mac;
        kv_config_t cfg_tls = cfg0;
        cfg_tls.prefix_remote_tls_ca = tls_ca;
        if ((rc = tier_reps(m, &cfg0, single.url, &o, ids, lh, &rr, NULL)) ||
            (rc = tier_reps(m, &cfg_mac, single.url, &o, ids, lh, &rm, NULL)) ||
            (rc = tier_reps(m, &cfg0, cluster.url, &o, ids, lh, &rc2, NULL)) ||
            (rc = tier_reps(m, &cfg_tls, tls_url, &o, ids, lh, &rt, NULL))) {
            fprintf(stderr, "kvbench-prefix: remote run: %s\n", kv_strerror(rc));
            return 1;
        }
        kv_tredis_stop(&tls);
        char rmcmd[4200];
        snprintf(rmcmd, sizeof rmcmd, "rm -rf '%s'", tls_dir);
        if (system(rmcmd) != 0)
            fprintf(stderr, "kvbench-prefix: could not remove %s\n", tls_dir);
    }
    ctx_res_t cr = {0};
    if (o.compressed && (rc = ctx_rows(m, &cfg0, &o, ids, &cr))) {
        fprintf(stderr, "kvbench-prefix: compressed context: %s\n", kv_strerror(rc));
        return 1;
    }
    const uint64_t fp16_bytes = sts.prefix_pages * cfg.page_bytes;
    const double ctx_ratio = cr.page_bytes + cr.meta
                                 ? (double)fp16_bytes / (double)(cr.page_bytes + cr.meta)
                                 : 0;
    if (o.json) {
        printf("{\"bench\":\"prefix\",\"model\":\"SmolLM2-135M\",\"prompt_tokens\":%u,"
               "\"cached_tokens\":%u,\"hash_ns_per_token\":%.2f,\"redis_get_gbps\":%.4f,"
               "\"threads\":%u,\"reps\":%u,\"remote_values\":%zu,\"results\":["
               "{\"tier\":\"cold\",\"ttft_s\":%.4f,\"speedup_vs_cold\":1.0,"
               "\"tokens_prefilled\":%u},"
               "{\"tier\":\"host\",\"ttft_s\":%.4f,\"speedup_vs_cold\":%.2f,"
               "\"tokens_matched\":%u,\"tokens_prefilled\":%u,\"fetch_gbps\":null,"
               "\"max_abs_logit_diff_vs_cold\":%.6g}",
               o.tokens, pub, hash_ns, get_gbps, cfg.n_threads, o.reps, n_keys, cold_s,
               o.tokens, host_s, cold_s / host_s, hit, o.tokens - hit, maxd);
        printf(",{\"tier\":\"file\",\"ttft_s\":%.4f,\"speedup_vs_cold\":%.2f,"
               "\"tokens_matched\":%u,\"fetch_gbps\":%.4f,\"after\":\"restart\","
               "\"open_s\":%.4f,\"file_bad\":%llu,\"io_errors\":%llu,"
               "\"max_abs_logit_diff_vs_host\":%.6g}",
               fr.ttft_s, cold_s / fr.ttft_s, fr.matched, fr.fetch_gbps, open_s,
               (unsigned long long)fr.bad, (unsigned long long)fr.errors, maxdf);
        const tier_res_t *tr[4] = {&rr, &rm, &rc2, &rt};
        static const char *const names[4] = {"redis", "redis-mac", "redis-cluster",
                                             "redis-tls"};
        for (int i = 0; i < 4 && !o.no_redis; i++)
            printf(",{\"tier\":\"%s\",\"signed\":%s,\"ttft_s\":%.4f,"
                   "\"speedup_vs_cold\":%.2f,"
                   "\"tokens_matched\":%u,\"fetch_gbps\":%.4f,\"fetch_vs_raw_get\":%.3f,"
                   "\"remote_bad\":%llu,\"remote_errors\":%llu}",
                   names[i], i == 1 ? "true" : "false", tr[i]->ttft_s,
                   cold_s / tr[i]->ttft_s, tr[i]->matched,
                   tr[i]->fetch_gbps, get_gbps > 0 ? tr[i]->fetch_gbps / get_gbps : 0,
                   (unsigned long long)tr[i]->bad, (unsigned long long)tr[i]->errors);
        if (o.compressed)
            printf(",{\"tier\":\"ctx-cold\",\"policy\":\"%s\",\"ttft_s\":%.4f,"
                   "\"speedup_vs_cold\":%.2f,\"tokens_prefilled\":%u},"
                   "{\"tier\":\"ctx-host\",\"policy\":\"%s\",\"ttft_s\":%.4f,"
                   "\"speedup_vs_cold\":%.2f,\"speedup_vs_ctx_cold\":%.2f,"
                   "\"vs_host_fp16_hit\":%.3f,\"tokens_matched\":%u,"
                   "\"tokens_prefilled\":%u,\"logits_equal_ctx_cold\":%s}",
                   o.compressed, cr.cold_s, cold_s / cr.cold_s, o.tokens, o.compressed,
                   cr.hit_s, cold_s / cr.hit_s, cr.cold_s / cr.hit_s, cr.hit_s / host_s,
                   o.cached, o.tokens - o.cached, cr.same ? "true" : "false");
        printf("],\"prefix_nodes\":%llu,\"prefix_pages\":%llu", (unsigned long long)sts.prefix_nodes,
               (unsigned long long)sts.prefix_pages);
        if (o.compressed)
            printf(",\"bytes_per_prefix\":{\"fp16_blocks_page_bytes\":%llu,"
                   "\"ctx_page_bytes\":%llu,\"ctx_meta_bytes\":%llu,\"ctx_tokens_kept\":%u,"
                   "\"fp16_over_ctx\":%.2f}",
                   (unsigned long long)fp16_bytes, (unsigned long long)cr.page_bytes,
                   (unsigned long long)cr.meta, cr.kept, ctx_ratio);
        printf("}\n");
    } else {
        printf("kvbench-prefix: %u-token prompt, %d tokens cached, %u threads\n", o.tokens,
               pub, cfg.n_threads);
        printf("  hashing                 %8.2f ns/token\n", hash_ns);
        printf("  cold  ttft              %8.3f s\n", cold_s);
        printf("  host  ttft (median %u)   %8.3f s   %.1fx faster, %u matched, "
               "max |dlogit| vs cold %.3g\n",
               o.reps, host_s, cold_s / host_s, hit, maxd);
        printf("  file  ttft (restart)    %8.3f s   %.1fx faster, %u matched, read %.3f "
               "GB/s, open %.3f s, max |dlogit| vs host %.3g\n",
               fr.ttft_s, cold_s / fr.ttft_s, fr.matched, fr.fetch_gbps, open_s, maxdf);
        if (!o.no_redis) {
            printf("  redis ttft              %8.3f s   %.1fx faster, fetch %.3f GB/s "
                   "(raw GET %.3f GB/s)\n", rr.ttft_s, cold_s / rr.ttft_s, rr.fetch_gbps,
                   get_gbps);
            printf("  redis-mac ttft          %8.3f s   %.1fx faster, fetch %.3f GB/s "
                   "(signed values)\n", rm.ttft_s, cold_s / rm.ttft_s, rm.fetch_gbps);
            printf("  redis-cluster ttft      %8.3f s   %.1fx faster, fetch %.3f GB/s\n",
                   rc2.ttft_s, cold_s / rc2.ttft_s, rc2.fetch_gbps);
            printf("  redis-tls ttft          %8.3f s   %.1fx faster, fetch %.3f GB/s\n",
                   rt.ttft_s, cold_s / rt.ttft_s, rt.fetch_gbps);
        }
    }
    if (o.compressed && !o.json) {
        printf("  ctx-cold ttft           %8.3f s   %s: context prefill, scoring, prefill end, "
               "publish, rest\n", cr.cold_s, o.compressed);
        printf("  ctx-host ttft (median)  %8.3f s   %.1fx faster than cold, %.2fx the FP16 host "
               "hit; logits == ctx-cold: %s\n", cr.hit_s, cold_s / cr.hit_s, cr.hit_s / host_s,
               cr.same ? "yes" : "NO");
        printf("  bytes per cached prefix FP16 blocks %llu, compressed %llu pages + %llu meta: "
               "%.2fx smaller\n", (unsigned long long)fp16_bytes,
               (unsigned long long)cr.page_bytes, (unsigned long long)cr.meta, ctx_ratio);
    }
    free(hv);
    free(ids);
    free(lc);
    free(lh);
    free(lf);
    kv_model_free(m);
    return 0;
}
