/* SPDX-License-Identifier: MIT */
/*
 * kv_tok.h — the byte-level BPE tokenizer of GPT-2 style vocabularies
 * (tokenizer.ggml.model = "gpt2"), as used by SmolLM2-135M-Instruct.
 *
 * Built from plain arrays (token strings, token types, merges, special ids)
 * so it does not depend on where they come from; kv_tok_from_gguf (the only
 * function that knows GGUF) fills those arrays from a GGUF reader.
 *
 * Text is bytes. Encoding: (1) with parse_special, the texts of CONTROL tokens
 * (e.g. "<|im_start|>") are cut out as single ids, leftmost-longest first;
 * USER_DEFINED token texts are always cut out; (2) each remaining segment is
 * pre-tokenized (kv_tok_pre_t: the GPT-2 regex, for "smollm" preceded by a
 * split of every \p{N} code point into its own piece); (3) each piece is BPE
 * merged from single bytes by merge rank (lowest first, leftmost on ties),
 * exactly like HuggingFace `tokenizers` BPE with a ByteLevel pre-tokenizer.
 * Invalid UTF-8 is not an error: an undecodable byte is a one-byte "other"
 * character for the pre-tokenizer, and BPE sees bytes anyway.
 *
 * Lossless: decode(encode(s)) == s for every byte string s whose bytes all
 * have a single-byte token (kv_tok_byte_ok). SmolLM2's vocabulary lacks 21
 * byte values (0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF,
 * none of which occurs in assigned, non-control UTF-8 text); each such byte
 * is encoded as the tokens of U+FFFD (or as unk_id when the vocabulary cannot
 * spell U+FFFD; KV_EINVAL when it has neither). HF `tokenizers` silently
 * drops such bytes ("a\x04b" -> a, b); we keep a visible mark instead.
 *
 * Ownership and threads: kv_tok_t copies what it needs from the config (the
 * arrays may be freed after kv_tok_create) and is immutable afterwards, so
 * every function taking a const kv_tok_t * may run concurrently. Scratch is
 * per call, from the config's allocator (which must then be thread-safe).
 *
 * Errors: 0 or a negative KV_E* code (kvpage/kvpage.h). Bad arguments change
 * nothing. Out-parameters (*out, *n, *len, *id) are set only on success and
 * on KV_ERANGE from a short buffer (see encode); after any other error an
 * ids/out buffer may hold a partial result.
 */
#ifndef KV_TOK_H
#define KV_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

/* Token types: the numbers of GGUF tokenizer.ggml.token_type (llama.cpp). */
typedef enum kv_tok_type {
    KV_TOK_NORMAL       = 1, /* byte-level (GPT-2 unicode-mapped) text   */
    KV_TOK_UNKNOWN      = 2, /* raw text, never produced by BPE          */
    KV_TOK_CONTROL      = 3, /* raw text; parsed only with parse_special */
    KV_TOK_USER_DEFINED = 4, /* raw text; always parsed                  */
    KV_TOK_UNUSED       = 5, /* byte-level text, never produced          */
    KV_TOK_BYTE         = 6, /* treated as NORMAL                        */
} kv_tok_type_t;

/* Pre-tokenizers (GGUF tokenizer.ggml.pre). */
typedef enum kv_tok_pre {
    KV_TOK_PRE_GPT2   = 0, /* "gpt2": the GPT-2 regex                        */
    KV_TOK_PRE_SMOLLM = 1, /* "smollm" (also starcoder, refact): \p{N} split  */
                           /* into single code points, then the GPT-2 regex  */
    KV_TOK_PRE_COUNT  = 2,
} kv_tok_pre_t;

#define KV_TOK_MAX_TOKEN_BYTES 4096u    /* longest token string accepted */
#define KV_TOK_MAX_VOCAB (1u << 24)     /* most tokens accepted          */

/* A string view: not NUL-terminated. */
typedef struct kv_tok_str {
    const char *ptr;
    uint64_t len; /* bytes */
} kv_tok_str_t;

typedef struct kv_tok_config {
    uint32_t n_tokens;           /* vocabulary size, 1..INT32_MAX            */
    const kv_tok_str_t *tokens;  /* [n_tokens] as stored in the GGUF: NORMAL */
                                 /* tokens GPT-2 unicode-mapped ("Ġthe")     */
    const int32_t *types;        /* [n_tokens] kv_tok_type_t; NULL: NORMAL   */
    uint32_t n_merges;           /* may be 0                                 */
    const kv_tok_str_t *merges;  /* [n_merges] "left right" (mapped), rank = */
                                 /* index; a merge naming a string that is   */
                                 /* not a token is skipped                   */
    int32_t bos_id, eos_id;      /* -1: none                                 */
    int32_t unk_id;              /* -1: none                                 */
    kv_tok_pre_t pre;
    /* Allocator for the tokenizer's tables and per-call scratch; both NULL:
     * malloc/free. free gets the size that was allocated. */
    void *(*alloc)(void *ctx, size_t n);
    void (*free)(void *ctx, void *p, size_t n);
    void *alloc_ctx;
} kv_tok_config_t;

typedef struct kv_tok kv_tok_t;

/* Build a tokenizer. *out is set only on success. Errors: KV_EINVAL (NULL
 * arrays, a type outside 1..6, a byte-level token that is not valid mapped
 * text, pre out of range, only one of alloc/free), KV_ERANGE (n_tokens 0 or
 * above KV_TOK_MAX_VOCAB, a token longer than KV_TOK_MAX_TOKEN_BYTES, bos/
 * eos/unk neither -1 nor a valid id), KV_ENOMEM. */
int kv_tok_create(const kv_tok_config_t *cfg, kv_tok_t **out);

/* NULL is a no-op. */
void kv_tok_destroy(kv_tok_t *tok);

/* The pre-tokenizer named by GGUF tokenizer.ggml.pre: "gpt2", "smollm",
 * "starcoder", "refact" (len bytes, not NUL-terminated). KV_ENOTSUP for any
 * other name, KV_EINVAL for NULL. */
int kv_tok_pre_from_name(const char *name, size_t len, kv_tok_pre_t *out);

/* Encode len bytes of text (text may be NULL when len == 0). On success *n
 * is the number of ids and ids[0..*n) holds them. If they do not fit in cap,
 * ids[0..cap) holds the first cap, *n the number needed, and KV_ERANGE is
 * returned; ids == NULL with cap == 0 asks for the count only (returns 0).
 * Errors: KV_EINVAL (NULL tok/n, ids NULL with cap > 0, text NULL with
 * len > 0, a byte that cannot be encoded: see the top), KV_ERANGE, KV_ENOMEM. */
int kv_tok_encode(const kv_tok_t *tok, const char *text, size_t len,
                  int parse_special, int32_t *ids, size_t cap, size_t *n);

/* The bytes of ids[0..n) concatenated (special tokens as their text). All
 * ids are checked first: KV_ERANGE if one is outside the vocabulary, and
 * then nothing is written. Output sizing as for encode (out NULL with
 * cap == 0 asks for the length). No NUL is appended. */
int kv_tok_decode(const kv_tok_t *tok, const int32_t *ids, size_t n,
                  char *out, size_t cap, size_t *len);

/* The bytes of one token, for streaming: *bytes points into the tokenizer
 * (valid until kv_tok_destroy), *len may be 0. A UTF-8 character may span
 * several tokens, so print raw bytes. Errors: KV_EINVAL, KV_ERANGE (id). */
int kv_tok_piece(const kv_tok_t *tok, int32_t id, const char **bytes, size_t *len);

/* The ChatML prompt of SmolLM2-Instruct, ready for generation:
 *   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n
 * system NULL means KV_TOK_DEFAULT_SYSTEM. The markers are the control ids;
 * system and user are encoded as plain text (a "<|im_end|>" typed by a user
 * stays text), each segment between markers exactly as HF tokenizes the
 * rendered template. Output sizing as for encode. Errors: as encode, plus
 * KV_EINVAL (user NULL), KV_ENOTSUP (no <|im_start|>/<|im_end|> token). */
#define KV_TOK_DEFAULT_SYSTEM \
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
int kv_tok_chat(const kv_tok_t *tok, const char *system, const char *user,
                int32_t *ids, size_t cap, size_t *n);

/* kv_tok_chat of the user message head + tail, with head and tail encoded
 * as two texts: the first *n_head ids (template through head) are those of
 * a prompt cut after head, whatever tail is (a context cached before its
 * question). Where head ends at a pre-tokenizer boundary (e.g. "." before
 * "\n\n") the ids equal kv_tok_chat's of the joined message. *n_head is
 * written on success. Errors: as kv_tok_chat; KV_EINVAL (tail or n_head
 * NULL). */
int kv_tok_chat_split(const kv_tok_t *tok, const char *system, const char *head,
                      const char *tail, int32_t *ids, size_t cap, size_t *n, size_t *n_head);

/* The part of kv_tok_chat's prompt after the user message, as it encodes
 * it: <|im_end|> "\n" <|im_start|> "assistant\n" (the turn change before a
 * reply the engine writes itself, e.g. KVzip's reconstruction). Output
 * sizing as for encode. Errors: KV_EINVAL, KV_ENOTSUP (no markers),
 * KV_ERANGE, KV_ENOMEM. */
int kv_tok_chat_reply(const kv_tok_t *tok, int32_t *ids, size_t cap, size_t *n);

/* ---- vocabulary queries --------------------------------------------------- */

uint32_t kv_tok_n_vocab(const kv_tok_t *tok);
int32_t kv_tok_bos(const kv_tok_t *tok); /* -1: none */
int32_t kv_tok_eos(const kv_tok_t *tok); /* -1: none */
int32_t kv_tok_unk(const kv_tok_t *tok); /* -1: none */

/* The kv_tok_type_t of id, or KV_ERANGE / KV_EINVAL. */
int kv_tok_type(const kv_tok_t *tok, int32_t id);

/* The id of the token whose bytes (as kv_tok_piece gives them) are exactly
 * text[0..len): special tokens by their text first, then byte-level tokens.
 * KV_ENOENT if none. */
int kv_tok_find(const kv_tok_t *tok, const char *text, size_t len, int32_t *id);

/* 1 if byte b has a single-byte token (so it round-trips), else 0. */
int kv_tok_byte_ok(const kv_tok_t *tok, uint8_t b);

/* ---- GGUF glue (kv_tok_gguf.c; the only part that knows kv_gguf.h) -------- */

struct kv_gguf;
/* Build the tokenizer from a GGUF file's tokenizer.ggml.* metadata: model
 * must be "gpt2", pre one kv_tok_pre_from_name knows (absent: "gpt2");
 * malloc/free. err (may be NULL) gets a one-line reason. Errors: KV_ENOENT
 * (a required key is missing), KV_ENOTSUP (another tokenizer model or
 * pre-tokenizer), KV_ECORRUPT (arrays of the wrong type or length, an id
 * outside the vocabulary), and those of kv_tok_create. */
int kv_tok_from_gguf(const struct kv_gguf *g, kv_tok_t **out, char *err,
                     size_t err_len);

#endif /* KV_TOK_H */
