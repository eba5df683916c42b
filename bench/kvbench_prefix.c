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
 * hash_ns_per_token: kv_prefix_hash_blocks over the whole prompt with a
 * hasher made for it (what a match does), median of 15.
 * Tiers not built yet (file, redis, redis-cluster) are not in the results.
 *
 * Usage: kvbench-prefix [--json] [--threads N] [--tokens N] [--cached N]
 *                       [--reps N] [--model FILE]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_bench_util.h"
#include "kv_model.h"
#include "kvpage/kvpage.h"
#include "prefix/kv_prefix_hash.h"

typedef struct opts {
    int json, threads;
    uint32_t tokens, cached, reps;
    const char *model;
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
    *o = (opts_t){.tokens = 4096, .cached = 3968, .reps = 5};
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
        } else if (!strcmp(a, "--model") && v) {
            o->model = v, i++;
        } else {
            fprintf(stderr, "usage: kvbench-prefix [--json] [--threads N] [--tokens N] "
                            "[--cached N] [--reps N] [--model FILE]\n");
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
    if (!(rc = kv_model_session_prefix(s, ids, n, NULL, 0, matched)))
        rc = kv_model_forward(s, ids + *matched, n - *matched, logits, 1);
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
    const uint32_t B = c->page_bytes / (4u * c->head_dim), blocks = n / B;
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
    if (pub < 0) {
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
    kv_stats_t sts;
    kv_store_stats(st, &sts);
    if (o.json) {
        printf("{\"bench\":\"prefix\",\"model\":\"SmolLM2-135M\",\"prompt_tokens\":%u,"
               "\"cached_tokens\":%u,\"hash_ns_per_token\":%.2f,\"redis_get_gbps\":null,"
               "\"threads\":%u,\"reps\":%u,\"results\":["
               "{\"tier\":\"cold\",\"ttft_s\":%.4f,\"speedup_vs_cold\":1.0,"
               "\"tokens_prefilled\":%u},"
               "{\"tier\":\"host\",\"ttft_s\":%.4f,\"speedup_vs_cold\":%.2f,"
               "\"tokens_matched\":%u,\"tokens_prefilled\":%u,\"fetch_gbps\":null,"
               "\"max_abs_logit_diff_vs_cold\":%.6g}],"
               "\"prefix_nodes\":%llu,\"prefix_pages\":%llu}\n",
               o.tokens, pub, hash_ns, cfg.n_threads, o.reps, cold_s, o.tokens, host_s,
               cold_s / host_s, hit, o.tokens - hit, maxd,
               (unsigned long long)sts.prefix_nodes, (unsigned long long)sts.prefix_pages);
    } else {
        printf("kvbench-prefix: %u-token prompt, %d tokens cached, %u threads\n", o.tokens,
               pub, cfg.n_threads);
        printf("  hashing                 %8.2f ns/token\n", hash_ns);
        printf("  cold  ttft              %8.3f s\n", cold_s);
        printf("  host  ttft (median %u)   %8.3f s   %.1fx faster, %u matched, "
               "max |dlogit| vs cold %.3g\n",
               o.reps, host_s, cold_s / host_s, hit, maxd);
    }
    free(hv);
    free(ids);
    free(lc);
    free(lh);
    kv_store_destroy(st);
    kv_model_free(m);
    return 0;
}
