/* SPDX-License-Identifier: MIT */
/*
 * kv_model_test.h — what the tests/model/ programs share: finding the model
 * file the way `kvpage run` does (exit 77 = skipped only when it is not
 * there), loading it with its tokenizer, and small helpers.
 */
#ifndef KV_MODEL_TEST_H
#define KV_MODEL_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model.h"
#include "kv_test.h"
#include "kv_tok.h"

/* Path of the model file: 0, or KV_ENOENT (with a message) when it was
 * never fetched. Other failures end the test (exit 1). */
static inline int kvt_find_model(char *path, size_t len)
{
    char err[512];
    int pinned;
    int rc = kv_model_find(NULL, path, len, &pinned, err, sizeof err);
    if (rc == KV_ENOENT) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    if (rc) {
        fprintf(stderr, "kv_model_find: %s\n", err);
        exit(1);
    }
    return 0;
}

/* Path of the model file, or skip the test when it was never fetched. */
static inline void kvt_model_path(char *path, size_t len)
{
    if (kvt_find_model(path, len))
        KV_TEST_SKIP("the model file is not there (scripts/fetch_model.sh fetches it)");
}

/* Load the model and its tokenizer; any failure ends the test (exit 1). */
static inline kv_model_t *kvt_load(kv_tok_t **tok)
{
    char path[4096], err[512];
    kvt_model_path(path, sizeof path);
    kv_model_t *m = NULL;
    int rc = kv_model_load(path, &m, err, sizeof err);
    if (!rc && tok)
        rc = kv_tok_from_gguf(kv_model_gguf(m), tok, err, sizeof err);
    if (rc) {
        fprintf(stderr, "loading %s: %s (%d)\n", path, err, rc);
        exit(1);
    }
    return m;
}

/* The chat-template ids of a user prompt (malloc'd); exits on failure. */
static inline int32_t *kvt_chat(const kv_tok_t *tok, const char *user, uint32_t *n)
{
    size_t cnt = 0;
    if (kv_tok_chat(tok, NULL, user, NULL, 0, &cnt) || !cnt)
        exit(1);
    int32_t *ids = malloc(cnt * sizeof *ids);
    if (!ids || kv_tok_chat(tok, NULL, user, ids, cnt, &cnt))
        exit(1);
    *n = (uint32_t)cnt;
    return ids;
}

/* The prefix-cache tests' prompt: the chat-template ids of 7 repeats of a
 * paragraph (about 370 tokens; malloc'd); exits on failure. */
static inline int32_t *kvt_prefix_prompt(const kv_tok_t *tok, uint32_t *n)
{
    static const char para[] =
        "The library keeps the keys and values of every layer in fixed-size pages taken "
        "from a pool, compresses cold pages, and computes attention directly over them. Two "
        "requests that share a long system prompt compute the same keys and values for it; "
        "a prefix cache computes them once and hands the pages to the next request "
        "copy-on-write. ";
    char text[8 * sizeof para];
    text[0] = '\0';
    for (int i = 0; i < 7; i++)
        strcat(text, para);
    return kvt_chat(tok, text, n);
}

#endif /* KV_MODEL_TEST_H */
