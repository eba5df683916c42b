/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tok.c — libFuzzer target for the tokenizer (model/kv_tok*).
 *
 * Input: byte 0 = flags (bit 0: parse_special), the rest = text. Property:
 * decode(encode(text)) reproduces text byte for byte, except that a byte
 * the vocabulary has no token for comes back as U+FFFD (EF BF BD); the
 * pieces of the ids spell the same bytes; a size query (cap 0) gives the
 * same count; a one-short buffer gives KV_ERANGE. With the real vocabulary
 * the text (up to its first NUL) is also the user message of kv_tok_chat,
 * whose decode must be the rendered ChatML prompt.
 *
 * Vocabulary: SmolLM2's real one when the model file is found (kv_model_find:
 * KVPAGE_MODEL, KVPAGE_MODEL_DIR, the user cache), unless FUZZ_TOK_SYNTH=1;
 * otherwise a synthetic one (all 256 bytes, a few merges, two specials), in
 * which every byte round-trips exactly. Which one is printed at start.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_gguf.h"
#include "kv_model.h"
#include "kv_tok.h"

static kv_tok_t *tok;
static int real_vocab;

/* ---- the synthetic vocabulary ---------------------------------------------- */

static char syn_text[300][8];
static kv_tok_str_t syn_tokens[300];
static int32_t syn_types[300];

static uint32_t gpt2_cp(uint32_t b) /* the GPT-2 byte -> code point map */
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    return b <= 0x20 ? 256 + b : b <= 0xA0 ? 256 + 33 + (b - 0x7F) : 256 + 67;
}

static kv_tok_t *synthetic(void)
{
    static const char *const extra[] = {
        "ab", "abc", "\xC4\xA0\x61" /* "Ġa" */, "aa", "<|s|>", "<u>",
    };
    static const int32_t extra_type[] = {1, 1, 1, 1, 3, 4};
    static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 a", "a a"};
    kv_tok_str_t m[4];
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; b++, n++) {
        uint32_t cp = gpt2_cp(b);
        if (cp < 0x80) {
            syn_text[n][0] = (char)cp;
        } else {
            syn_text[n][0] = (char)(0xC0 | (cp >> 6));
            syn_text[n][1] = (char)(0x80 | (cp & 0x3F));
        }
        syn_types[n] = 1;
    }
    for (uint32_t i = 0; i < 6; i++, n++) {
        strcpy(syn_text[n], extra[i]);
        syn_types[n] = extra_type[i];
    }
    for (uint32_t i = 0; i < n; i++)
        syn_tokens[i] = (kv_tok_str_t){.ptr = syn_text[i], .len = strlen(syn_text[i])};
    for (int i = 0; i < 4; i++)
        m[i] = (kv_tok_str_t){.ptr = merges[i], .len = strlen(merges[i])};
    kv_tok_config_t cfg = {
        .n_tokens = n, .tokens = syn_tokens, .types = syn_types, .n_merges = 4,
        .merges = m, .bos_id = -1, .eos_id = 260, .unk_id = -1, .pre = KV_TOK_PRE_SMOLLM,
    };
    kv_tok_t *t = NULL;
    return kv_tok_create(&cfg, &t) == 0 ? t : NULL;
}

static kv_tok_t *real(void)
{
    char path[4096], err[256];
    int pinned;
    kv_gguf_t *g = NULL;
    kv_tok_t *t = NULL;
    const char *syn = getenv("FUZZ_TOK_SYNTH");
    if ((syn && *syn == '1') || kv_model_find(NULL, path, sizeof path, &pinned, err, sizeof err))
        return NULL;
    if (kv_gguf_open(path, &g, err, sizeof err) == 0) {
        if (kv_tok_from_gguf(g, &t, err, sizeof err) != 0)
            t = NULL;
        kv_gguf_close(g);
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tok = real();
    real_vocab = tok != NULL;
    if (!tok)
        tok = synthetic();
    if (!tok)
        abort();
    fprintf(stderr, "fuzz_tok: %s vocabulary (%u tokens)\n",
            real_vocab ? "SmolLM2 (real)" : "synthetic", kv_tok_n_vocab(tok));
    return 0;
}

/* ---- the property ---------------------------------------------------------- */

/* want = s with bytes lacking a token replaced by U+FFFD (room for 3n). */
static size_t expect(const uint8_t *s, size_t n, char *want)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (kv_tok_byte_ok(tok, s[i])) {
            want[k++] = (char)s[i];
        } else {
            memcpy(want + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
    }
    return k;
}

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_tok: property failed: %s\n", what);
        abort();
    }
}

static void round_trip(const uint8_t *text, size_t n, int special)
{
    size_t cap = 3 * n + 1, nids = 0, q = 0, len = 0; /* U+FFFD: <= 3 ids a byte */
    int32_t *ids = malloc(cap * sizeof *ids);
    char *back = malloc(3 * n + 1), *want = malloc(3 * n + 1);
    check(ids && back && want, "malloc");

    check(kv_tok_encode(tok, (const char *)text, n, special, NULL, 0, &q) == 0, "size query");
    check(kv_tok_encode(tok, (const char *)text, n, special, ids, cap, &nids) == 0, "encode");
    check(q == nids && nids <= 3 * n, "count");
    if (nids > 0) {
        size_t m = 0;
        check(kv_tok_encode(tok, (const char *)text, n, special, ids, nids - 1, &m) == KV_ERANGE &&
                  m == nids, "short buffer");
        check(kv_tok_encode(tok, (const char *)text, n, special, ids, cap, &nids) == 0, "encode");
    }
    check(kv_tok_decode(tok, ids, nids, back, 3 * n + 1, &len) == 0, "decode");
    size_t wl = expect(text, n, want);
    check(len == wl && memcmp(back, want, wl) == 0, "decode(encode(s)) == s");
    size_t k = 0;
    for (size_t i = 0; i < nids; i++) {
        const char *p;
        size_t pl;
        check(kv_tok_piece(tok, ids[i], &p, &pl) == 0, "piece");
        check(k + pl <= wl && memcmp(want + k, p, pl) == 0, "pieces spell the text");
        k += pl;
    }
    check(k == wl, "pieces cover the text");
    free(ids);
    free(back);
    free(want);
}

static void chat(const uint8_t *text, size_t n)
{
    static const char pre[] = "<|im_start|>system\n" KV_TOK_DEFAULT_SYSTEM
                              "<|im_end|>\n<|im_start|>user\n";
    static const char post[] = "<|im_end|>\n<|im_start|>assistant\n";
    char *user = malloc(n + 1);
    check(user != NULL, "malloc");
    memcpy(user, text, n);
    user[n] = 0;
    size_t un = strlen(user), cap = 3 * un + 64, nids = 0, len = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *back = malloc(3 * un + sizeof pre + sizeof post);
    char *want = malloc(3 * un + sizeof pre + sizeof post);
    check(ids && back && want, "malloc");
    check(kv_tok_chat(tok, NULL, user, ids, cap, &nids) == 0, "chat");
    check(kv_tok_decode(tok, ids, nids, back, 3 * un + sizeof pre + sizeof post, &len) == 0,
          "chat decode");
    size_t wl = 0;
    memcpy(want, pre, sizeof pre - 1);
    wl += sizeof pre - 1;
    wl += expect((const uint8_t *)user, un, want + wl);
    memcpy(want + wl, post, sizeof post - 1);
    wl += sizeof post - 1;
    check(len == wl && memcmp(back, want, wl) == 0, "chat decodes to the template");
    free(user);
    free(ids);
    free(back);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int special = data[0] & 1;
    round_trip(data + 1, size - 1, special);
    if (real_vocab)
        chat(data + 1, size - 1);
    return 0;
}
