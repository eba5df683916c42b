/* SPDX-License-Identifier: MIT */
/*
 * kvbench_hash.c — cost of the prefix block hashes (prefix/kv_prefix_hash.h).
 *
 *   kvbench-hash [--json] [--tokens N] [--block B] [--reps R]
 *
 * Hashes an N-token prompt (default 4096, SmolLM2's vocabulary range) in
 * blocks of B tokens (default 16) with kv_prefix_hash_blocks, and in the
 * same run two baselines over the same bytes:
 *   - "sha256-stream": one SHA-256 over all the block encodings back to back
 *     (N/B * (80 + 4B) bytes): the compression work alone, the floor;
 *   - "evp-oneshot": EVP_Digest of each block's encoding with libcrypto's
 *     one-shot call (a fresh context per block, what code that does not
 *     reuse contexts pays).
 * Each row is the median over R reps (default 15) of the best of 20
 * repetitions of the whole prompt; ns_per_token = that time / N. Never in
 * CTest. Target of issue 14: kvpage <= 100 ns per token.
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_bench_util.h"
#include "kvpage/kvpage.h"
#include "prefix/kv_prefix_hash.h"

enum { ROW_KV, ROW_STREAM, ROW_ONESHOT, N_ROWS };
static const char *row_name[N_ROWS] = {"kvpage", "sha256-stream", "evp-oneshot"};

int main(int argc, char **argv)
{
    int json = 0;
    long n = 4096, block = 16, reps = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--tokens") == 0)
            n = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--block") == 0)
            block = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0)
            reps = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--json] [--tokens N] [--block B] [--reps R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n < 1 || n > (1 << 24) || block < 1 || block > (long)KV_PREFIX_MAX_BLOCK_TOKENS ||
        n < block || reps < 1 || reps > 1000) {
        fprintf(stderr, "kvbench-hash: bad --tokens/--block/--reps\n");
        return 2;
    }
    size_t nb = (size_t)(n / block), enc_bytes = 80 + 4 * (size_t)block;
    uint32_t *toks = malloc((size_t)n * 4);
    kv_prefix_hash_t *out = malloc(nb * sizeof *out);
    uint8_t *enc = malloc(nb * enc_bytes);
    uint8_t model[32] = {1};
    kv_prefix_fp_t fp = {.model = model, .model_len = 32, .n_layers = 30, .n_kv_heads = 3,
                         .head_dim = 64, .page_bytes = 4096, .block_tokens = (uint32_t)block,
                         .state = "fp16", .state_len = 4, .salt = "tenant", .salt_len = 6};
    kv_prefix_hasher_t *h = NULL;
    int rc = toks && out && enc ? kv_prefix_hash_create(&fp, &h) : KV_ENOMEM;
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (rc || !md || !ctx) {
        fprintf(stderr, "kvbench-hash: setup failed: %s\n", kv_strerror(rc));
        return 1;
    }
    uint64_t seed = 7;
    for (long i = 0; i < n; i++)
        toks[i] = (uint32_t)(kv_bench_rand(&seed) % 49152);
    /* the block encodings, for the baselines (exactly what kvpage hashes) */
    if (kv_prefix_hash_blocks(h, NULL, toks, (size_t)n, out, nb) != (int)nb)
        return 1;
    for (size_t b = 0; b < nb; b++) {
        size_t len = 0;
        kv_prefix_hash_encode_block(h, b ? &out[b - 1] : NULL, toks + b * block,
                                    enc + b * enc_bytes, enc_bytes, &len);
    }
    double *t[N_ROWS];
    for (int r = 0; r < N_ROWS; r++)
        t[r] = calloc((size_t)reps, sizeof(double));
    uint8_t dig[32];
    unsigned int dlen;
    int bad = 0;
    for (long rep = 0; rep < reps; rep++) {
        double best[N_ROWS] = {1e30, 1e30, 1e30};
        for (int it = 0; it < 20; it++) {
            double t0 = kv_bench_now();
            bad |= kv_prefix_hash_blocks(h, NULL, toks, (size_t)n, out, nb) != (int)nb;
            double t1 = kv_bench_now();
            bad |= !EVP_DigestInit_ex2(ctx, md, NULL) ||
                   !EVP_DigestUpdate(ctx, enc, nb * enc_bytes) ||
                   !EVP_DigestFinal_ex(ctx, dig, &dlen);
            double t2 = kv_bench_now();
            for (size_t b = 0; b < nb; b++)
                bad |= !EVP_Digest(enc + b * enc_bytes, enc_bytes, dig, &dlen, md, NULL);
            double t3 = kv_bench_now();
            double d[N_ROWS] = {t1 - t0, t2 - t1, t3 - t2};
            for (int r = 0; r < N_ROWS; r++)
                best[r] = d[r] < best[r] ? d[r] : best[r];
        }
        for (int r = 0; r < N_ROWS; r++)
            t[r][rep] = best[r];
    }
    if (bad) {
        fprintf(stderr, "kvbench-hash: a digest failed\n");
        return 1;
    }
    double ns[N_ROWS];
    for (int r = 0; r < N_ROWS; r++)
        ns[r] = kv_bench_median(t[r], (size_t)reps) * 1e9 / (double)n;
    if (json) {
        printf("{\"bench\":\"hash\",\"prompt_tokens\":%ld,\"block_tokens\":%ld,"
               "\"bytes_per_block\":%zu,\"reps\":%ld,\"hash_ns_per_token\":%.2f,\"results\":[",
               n, block, enc_bytes, reps, ns[ROW_KV]);
        for (int r = 0; r < N_ROWS; r++)
            printf("%s{\"impl\":\"%s\",\"ns_per_token\":%.2f,\"ns_per_block\":%.1f}",
                   r ? "," : "", row_name[r], ns[r], ns[r] * (double)block);
        printf("]}\n");
    } else {
        printf("%ld tokens, blocks of %ld (%zu bytes each)\n", n, block, enc_bytes);
        for (int r = 0; r < N_ROWS; r++)
            printf("  %-14s %8.2f ns/token %9.1f ns/block\n", row_name[r], ns[r],
                   ns[r] * (double)block);
    }
    for (int r = 0; r < N_ROWS; r++)
        free(t[r]);
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
    kv_prefix_hash_destroy(h);
    free(toks);
    free(out);
    free(enc);
    return 0;
}
