/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_gguf.c — the glue from a GGUF file's tokenizer.ggml.* metadata to
 * kv_tok_create; the only tokenizer file that knows the GGUF reader.
 *
 * Keys: model (must be "gpt2"), pre (optional, default "gpt2"), tokens
 * (string array, required), token_type (i32/u32 array of the same length,
 * optional: all NORMAL), merges (string array, required), bos/eos/
 * unknown_token_id (optional: -1). The string views point into the reader's
 * mapping and are only borrowed for the duration of kv_tok_create, which
 * copies what it keeps; the two temporary view arrays are freed here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_tok.h"

static int fail(char *err, size_t err_len, int rc, const char *what)
{
    if (err && err_len)
        snprintf(err, err_len, "tokenizer: %s", what);
    return rc;
}

/* A string array as kv_tok_str_t views (malloc'd, *n elements). */
static int get_strings(const kv_gguf_t *g, const char *key, kv_tok_str_t **out,
                       uint32_t *n)
{
    const kv_gguf_kv_t *kv;
    int rc = kv_gguf_get_arr(g, key, KV_GGUF_STRING, &kv);
    if (rc == KV_EINVAL)
        return KV_ECORRUPT; /* there, but not an array of strings */
    if (rc != 0)
        return rc;
    if (kv->arr_n > KV_TOK_MAX_VOCAB)
        return KV_ERANGE;
    size_t cnt = (size_t)kv->arr_n;
    kv_gguf_str_t *views = malloc((cnt ? cnt : 1) * sizeof *views);
    kv_tok_str_t *strs = malloc((cnt ? cnt : 1) * sizeof *strs);
    if (!views || !strs) {
        free(views);
        free(strs);
        return KV_ENOMEM;
    }
    int64_t got = kv_gguf_arr_strings(kv, views, cnt);
    if (got != (int64_t)cnt) {
        free(views);
        free(strs);
        return got < 0 ? (int)got : KV_ECORRUPT;
    }
    for (size_t i = 0; i < cnt; i++)
        strs[i] = (kv_tok_str_t){.ptr = views[i].ptr, .len = views[i].len};
    free(views);
    *out = strs;
    *n = (uint32_t)cnt;
    return 0;
}

/* token_type as int32 (NULL when absent). */
static int get_types(const kv_gguf_t *g, uint32_t n, int32_t **out)
{
    const kv_gguf_kv_t *kv;
    *out = NULL;
    int rc = kv_gguf_get_arr(g, "tokenizer.ggml.token_type", KV_GGUF_I32, &kv);
    if (rc == KV_EINVAL)
        rc = kv_gguf_get_arr(g, "tokenizer.ggml.token_type", KV_GGUF_U32, &kv);
    if (rc == KV_ENOENT)
        return 0;
    if (rc != 0)
        return KV_ECORRUPT;
    if (kv->arr_n != n)
        return KV_ECORRUPT;
    int32_t *types = malloc((n ? n : 1) * sizeof *types);
    if (!types)
        return KV_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        int64_t v;
        if (kv_gguf_arr_int(kv, i, &v) != 0 || v < INT32_MIN || v > INT32_MAX) {
            free(types);
            return KV_ECORRUPT;
        }
        types[i] = (int32_t)v;
    }
    *out = types;
    return 0;
}

/* An optional token id: -1 when absent; KV_ECORRUPT when not a valid id. */
static int get_id(const kv_gguf_t *g, const char *key, uint32_t n, int32_t *id)
{
    uint32_t v;
    int rc = kv_gguf_get_u32(g, key, &v);
    if (rc == KV_ENOENT) {
        *id = -1;
        return 0;
    }
    if (rc != 0 || v >= n)
        return KV_ECORRUPT;
    *id = (int32_t)v;
    return 0;
}

int kv_tok_from_gguf(const struct kv_gguf *g, kv_tok_t **out, char *err, size_t err_len)
{
    kv_gguf_str_t s;
    kv_tok_config_t cfg;
    kv_tok_str_t *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    int rc;

    if (!g || !out)
        return fail(err, err_len, KV_EINVAL, "no GGUF reader or output");
    memset(&cfg, 0, sizeof cfg);

    rc = kv_gguf_get_str(g, "tokenizer.ggml.model", &s);
    if (rc != 0)
        return fail(err, err_len, rc == KV_ENOENT ? KV_ENOENT : KV_ECORRUPT,
                    "tokenizer.ggml.model missing or not a string");
    if (!kv_gguf_str_eq(s, "gpt2"))
        return fail(err, err_len, KV_ENOTSUP, "tokenizer.ggml.model is not \"gpt2\"");

    cfg.pre = KV_TOK_PRE_GPT2;
    rc = kv_gguf_get_str(g, "tokenizer.ggml.pre", &s);
    if (rc == 0) {
        if (kv_tok_pre_from_name(s.ptr, (size_t)s.len, &cfg.pre) != 0)
            return fail(err, err_len, KV_ENOTSUP, "unknown tokenizer.ggml.pre");
    } else if (rc != KV_ENOENT) {
        return fail(err, err_len, KV_ECORRUPT, "tokenizer.ggml.pre is not a string");
    }

    if ((rc = get_strings(g, "tokenizer.ggml.tokens", &tokens, &cfg.n_tokens)) != 0) {
        fail(err, err_len, rc, "tokenizer.ggml.tokens missing or malformed");
        goto out;
    }
    if ((rc = get_strings(g, "tokenizer.ggml.merges", &merges, &cfg.n_merges)) != 0) {
        fail(err, err_len, rc, "tokenizer.ggml.merges missing or malformed");
        goto out;
    }
    if ((rc = get_types(g, cfg.n_tokens, &types)) != 0) {
        fail(err, err_len, rc, "tokenizer.ggml.token_type malformed");
        goto out;
    }
    if ((rc = get_id(g, "tokenizer.ggml.bos_token_id", cfg.n_tokens, &cfg.bos_id)) != 0 ||
        (rc = get_id(g, "tokenizer.ggml.eos_token_id", cfg.n_tokens, &cfg.eos_id)) != 0 ||
        (rc = get_id(g, "tokenizer.ggml.unknown_token_id", cfg.n_tokens, &cfg.unk_id)) != 0) {
        fail(err, err_len, rc, "a bos/eos/unknown token id is not a valid id");
        goto out;
    }
    cfg.tokens = tokens;
    cfg.merges = merges;
    cfg.types = types;
    if ((rc = kv_tok_create(&cfg, out)) != 0 && err && err_len)
        snprintf(err, err_len, "tokenizer: cannot build the byte-level BPE tokenizer: %s",
                 kv_strerror(rc));

out:
    free(tokens);
    free(merges);
    free(types);
    return rc;
}
