/* SPDX-License-Identifier: MIT */
/*
 * kv_tok_chat.c — the ChatML prompt of SmolLM2-Instruct (its GGUF
 * tokenizer.chat_template with one system and one user message and
 * add_generation_prompt):
 *
 *   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n
 *
 * HF renders this string and tokenizes it with special tokens split first,
 * so each stretch between two markers is one pre-tokenizer input; we encode
 * exactly those stretches ("system\n" + system as one text, not two) with
 * the marker ids between them. Message texts are never searched for
 * special tokens. Scratch: one buffer for the longest stretch.
 *
 * kv_tok_chat_split encodes the user stretch as two texts, head then tail,
 * so that the ids up to the end of head are exactly those of a prompt that
 * stops there (what a cache holds for a context before its question).
 */
#include <string.h>

#include "kv_tok_int.h"

/* The ChatML markers' control ids, or KV_ENOTSUP. */
static int markers(const kv_tok_t *t, int32_t *start, int32_t *end)
{
    if (kv_tok_find(t, "<|im_start|>", 12, start) != 0 ||
        kv_tok_find(t, "<|im_end|>", 10, end) != 0 || t->types[*start] != KV_TOK_CONTROL ||
        t->types[*end] != KV_TOK_CONTROL)
        return KV_ENOTSUP;
    return 0;
}

/* The ChatML prompt with the user stretch encoded as head, then tail (tail
 * NULL: one text); *n_head = the ids through head. */
static int chat_encode(const kv_tok_t *t, const char *system, const char *head,
                       const char *tail, int32_t *ids, size_t cap, size_t *n, size_t *n_head)
{
    static const char *const role[3] = {"system\n", "user\n", "assistant\n"};
    int32_t start, end;
    int rc;

    if (!t || !head || !n || (!ids && cap))
        return KV_EINVAL;
    if ((rc = markers(t, &start, &end)))
        return rc;
    if (!system)
        system = KV_TOK_DEFAULT_SYSTEM;

    const char *msg[3] = {system, head, ""};
    size_t msg_len[3] = {strlen(system), strlen(head), 0};
    size_t tail_len = tail ? strlen(tail) : 0;
    size_t longest = msg_len[0] > msg_len[1] ? msg_len[0] : msg_len[1];
    size_t buf_len = 16 + (longest > tail_len ? longest : tail_len);
    uint8_t *buf = kv_tok_mem(t, buf_len);
    if (!buf)
        return KV_ENOMEM;

    kv_tok_scratch_t sc;
    kv_tok_sink_t out = {.ids = ids, .cap = cap, .n = 0};
    size_t through_head = 0;
    kv_tok_scratch_init(&sc);
    rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        size_t rl = strlen(role[i]);
        memcpy(buf, role[i], rl);
        memcpy(buf + rl, msg[i], msg_len[i]);
        kv_tok_emit(&out, start);
        rc = kv_tok_encode_sink(t, buf, rl + msg_len[i], 0, &sc, &out);
        if (i == 1) {
            through_head = out.n;
            if (rc == 0 && tail_len)
                rc = kv_tok_encode_sink(t, (const uint8_t *)tail, tail_len, 0, &sc, &out);
        }
        if (rc == 0 && i < 2) {
            kv_tok_emit(&out, end);
            rc = kv_tok_encode_sink(t, (const uint8_t *)"\n", 1, 0, &sc, &out);
        }
    }
    kv_tok_scratch_fini(t, &sc);
    kv_tok_mem_free(t, buf, buf_len);
    if (rc != 0)
        return rc;
    *n = out.n;
    if (n_head)
        *n_head = through_head;
    if (!ids)
        return 0;
    return out.n > cap ? KV_ERANGE : 0;
}

int kv_tok_chat(const kv_tok_t *t, const char *system, const char *user,
                int32_t *ids, size_t cap, size_t *n)
{
    return chat_encode(t, system, user, NULL, ids, cap, n, NULL);
}

int kv_tok_chat_split(const kv_tok_t *t, const char *system, const char *head,
                      const char *tail, int32_t *ids, size_t cap, size_t *n, size_t *n_head)
{
    if (!tail || !n_head)
        return KV_EINVAL;
    return chat_encode(t, system, head, tail, ids, cap, n, n_head);
}

int kv_tok_chat_reply(const kv_tok_t *t, int32_t *ids, size_t cap, size_t *n)
{
    int32_t start, end;
    int rc;
    if (!t || !n || (!ids && cap))
        return KV_EINVAL;
    if ((rc = markers(t, &start, &end)))
        return rc;
    kv_tok_scratch_t sc;
    kv_tok_sink_t out = {.ids = ids, .cap = cap, .n = 0};
    kv_tok_scratch_init(&sc);
    kv_tok_emit(&out, end);
    rc = kv_tok_encode_sink(t, (const uint8_t *)"\n", 1, 0, &sc, &out);
    kv_tok_emit(&out, start);
    if (rc == 0)
        rc = kv_tok_encode_sink(t, (const uint8_t *)"assistant\n", 10, 0, &sc, &out);
    kv_tok_scratch_fini(t, &sc);
    if (rc != 0)
        return rc;
    *n = out.n;
    if (!ids)
        return 0;
    return out.n > cap ? KV_ERANGE : 0;
}
