/* SPDX-License-Identifier: MIT */
/*
 * kv_prefix_hash.h — content addresses of KV blocks: a SHA-256 per full block
 * of tokens, chained on the block before it (as vLLM's prefix caching does),
 * so that a block's hash names the whole prefix up to and including it, under
 * everything else that makes KV differ for the same tokens (the "extra").
 *
 * The rule (docs/prefix.md, "The hashing rule", has the bytes):
 *   X       = SHA-256(encode_extra(fingerprint))         once per hasher
 *   h_0     = SHA-256(encode_block(first, 0^32, X, tokens[0 .. B-1]))
 *   h_i     = SHA-256(encode_block(chained, h_{i-1}, X, tokens[iB .. iB+B-1]))
 * B = fingerprint.block_tokens. Both encodings are length-prefixed and
 * little-endian with fixed field order, so no two different inputs encode
 * alike (each is injective); only full blocks are hashed.
 *
 * The fingerprint holds what the caller knows makes the KV of the same tokens
 * differ: the model (a fingerprint of its weights), the store's shape, the
 * page format and policy state (opaque bytes), and a salt (a tenant or
 * cache-isolation key: different salts never produce the same hash, short of
 * a SHA-256 collision).
 *
 * A hasher owns one reusable OpenSSL EVP digest context (libcrypto 3): it is
 * not thread-safe, use one per thread. It keeps no pointer into the
 * fingerprint given at create. Errors: 0 or a negative KV_E* code.
 */
#ifndef KV_PREFIX_HASH_H
#define KV_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KV_PREFIX_HASH_BYTES 32u            /* SHA-256                        */
#define KV_PREFIX_MAX_BLOCK_TOKENS 65536u   /* largest block_tokens           */
#define KV_PREFIX_MAX_FIELD_BYTES 65536u    /* largest model/state/salt field */

typedef struct kv_prefix_hash {
    uint8_t b[KV_PREFIX_HASH_BYTES];
} kv_prefix_hash_t;

/* What makes KV differ for the same tokens. Byte fields are copied into the
 * extra's digest at create; pointers may be NULL when their length is 0. */
typedef struct kv_prefix_fp {
    const void *model;     /* model fingerprint, e.g. SHA-256 of the weights */
    size_t model_len;      /* 1..KV_PREFIX_MAX_FIELD_BYTES                   */
    uint32_t n_layers;     /* store shape (any values; all are hashed)       */
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t page_bytes;
    uint32_t block_tokens; /* tokens per block, 1..KV_PREFIX_MAX_BLOCK_TOKENS */
    const void *state;     /* page format and policy state bytes             */
    size_t state_len;      /* 0..KV_PREFIX_MAX_FIELD_BYTES                   */
    const void *salt;      /* caller salt (tenant / isolation key)           */
    size_t salt_len;       /* 0..KV_PREFIX_MAX_FIELD_BYTES                   */
} kv_prefix_fp_t;

typedef struct kv_prefix_hasher kv_prefix_hasher_t;

/* A hasher for one fingerprint. Errors: KV_EINVAL (NULL, a NULL field with a
 * non-zero length, model_len 0), KV_ERANGE (block_tokens 0 or too large, a
 * field too long), KV_ENOMEM, KV_ENOTSUP (libcrypto has no SHA-256). */
int kv_prefix_hash_create(const kv_prefix_fp_t *fp, kv_prefix_hasher_t **out);
/* NULL is a no-op. */
void kv_prefix_hash_destroy(kv_prefix_hasher_t *h);

/* Tokens per block of the hasher (its fingerprint's block_tokens). */
uint32_t kv_prefix_hash_block_tokens(const kv_prefix_hasher_t *h);

/* X, the digest of the encoded fingerprint. Errors: KV_EINVAL. */
int kv_prefix_hash_extra(const kv_prefix_hasher_t *h, kv_prefix_hash_t *out);

/* The hashes of the full blocks of tokens[0..n_tokens-1]: out[i] is block i
 * chained on out[i-1], block 0 on parent (NULL: tokens starts a sequence).
 * Hashes min(n_tokens / block_tokens, cap) blocks and returns that count; a
 * partial last block is not hashed. Errors: KV_EINVAL (NULL h; tokens or
 * out NULL with something to hash; nothing written), KV_EIO (libcrypto
 * failed; out[] holds the blocks before the one that failed). */
int kv_prefix_hash_blocks(kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                          const uint32_t *tokens, size_t n_tokens,
                          kv_prefix_hash_t *out, size_t cap);

/* The key of a compressed context of nb * B + n_tokens tokens: the end
 * block (kind 2) of its last n_tokens (0 .. B-1) tokens after parent, the
 * hash of its last full block (NULL: none, the context is shorter than a
 * block). Distinct from every block hash by its kind. Errors: KV_EINVAL
 * (NULL h or out, tokens NULL with n_tokens, n_tokens >= B), KV_EIO. */
int kv_prefix_hash_end(kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                       const uint32_t *tokens, size_t n_tokens, kv_prefix_hash_t *out);
/* The encodings, for tests and for anyone re-implementing the rule. Each
 * writes the bytes into buf when they fit in cap, sets *len to their count,
 * and returns 0, or KV_ERANGE when cap is too small (*len still set; buf may
 * be NULL then). encode_extra errors as kv_prefix_hash_create; encode_block:
 * KV_EINVAL (NULL h, len, or tokens with block_tokens > 0). */
int kv_prefix_hash_encode_extra(const kv_prefix_fp_t *fp, uint8_t *buf, size_t cap,
                                size_t *len);
int kv_prefix_hash_encode_block(const kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                                const uint32_t *tokens, uint8_t *buf, size_t cap,
                                size_t *len);

#endif /* KV_PREFIX_HASH_H */
