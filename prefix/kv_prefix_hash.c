/* SPDX-License-Identifier: MIT */
/*
 * kv_prefix_hash.c — chained SHA-256 block hashes (see kv_prefix_hash.h).
 *
 * Encodings (all integers little-endian u32; magics and version in
 * util/kv_rec.h):
 *   extra = "KVPX" version
 *           1 len(model) model
 *           2 20 n_layers n_kv_heads head_dim page_bytes block_tokens
 *           3 len(state) state
 *           4 len(salt)  salt
 *   block = "KVPB" version kind parent[32] X[32] n_tokens token[0] .. token[n-1]
 *           kind 0: the first block of a sequence, parent all zero;
 *           kind 1: chained on parent;
 *           kind 2: the end of a compressed context (its last 0 .. B-1
 *           tokens, after the full block `parent` or, all zero, none).
 * Every variable-length part carries its length and the field order is
 * fixed, so each encoding is injective; the block's variable part (the
 * tokens) is last and counted.
 *
 * Speed: a block of 16 tokens is 144 bytes, 3 SHA-256 compressions. The
 * header goes in as one 80-byte update and the tokens straight from the
 * caller's array (on a little-endian host); the EVP context and the fetched
 * SHA-256 implementation are made once per hasher and reused.
 */
#include "prefix/kv_prefix_hash.h"

#include <openssl/evp.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"


struct kv_prefix_hasher {
    EVP_MD *md;               /* SHA-256, fetched once                      */
    EVP_MD_CTX *ctx;          /* reused for every digest                    */
    uint32_t block_tokens;    /* B                                          */
    kv_prefix_hash_t extra;   /* X = SHA-256(encode_extra(fingerprint))     */
};

/* A length-prefixed field: id, length, bytes (into buf when it fits). */
static size_t kv_put_field(uint8_t *buf, size_t cap, size_t at, uint32_t id,
                           const void *bytes, size_t n)
{
    if (buf && at + 8 + n <= cap) {
        kv_le_put32(buf + at, id);
        kv_le_put32(buf + at + 4, (uint32_t)n);
        if (n)
            memcpy(buf + at + 8, bytes, n);
    }
    return at + 8 + n;
}

static int kv_prefix_fp_check(const kv_prefix_fp_t *fp)
{
    if (!fp || !fp->model || fp->model_len == 0 || (fp->state_len && !fp->state) ||
        (fp->salt_len && !fp->salt))
        return KV_EINVAL;
    if (fp->block_tokens == 0 || fp->block_tokens > KV_PREFIX_MAX_BLOCK_TOKENS ||
        fp->model_len > KV_PREFIX_MAX_FIELD_BYTES ||
        fp->state_len > KV_PREFIX_MAX_FIELD_BYTES || fp->salt_len > KV_PREFIX_MAX_FIELD_BYTES)
        return KV_ERANGE;
    return 0;
}

int kv_prefix_hash_encode_extra(const kv_prefix_fp_t *fp, uint8_t *buf, size_t cap,
                                size_t *len)
{
    int rc = kv_prefix_fp_check(fp);
    if (rc || !len)
        return rc ? rc : KV_EINVAL;
    uint8_t shape[20], head[8];
    const uint32_t dims[5] = {fp->n_layers, fp->n_kv_heads, fp->head_dim, fp->page_bytes,
                              fp->block_tokens};
    for (int i = 0; i < 5; i++)
        kv_le_put32(shape + 4 * i, dims[i]);
    kv_le_put32(head, KV_REC_HASH_FP_MAGIC);
    kv_le_put32(head + 4, KV_REC_HASH_VERSION);
    size_t n = 8 + 4 * 8 + fp->model_len + sizeof shape + fp->state_len + fp->salt_len;
    *len = n;
    if (!buf || cap < n)
        return KV_ERANGE;
    memcpy(buf, head, 8);
    size_t at = kv_put_field(buf, cap, 8, 1, fp->model, fp->model_len);
    at = kv_put_field(buf, cap, at, 2, shape, sizeof shape);
    at = kv_put_field(buf, cap, at, 3, fp->state, fp->state_len);
    kv_put_field(buf, cap, at, 4, fp->salt, fp->salt_len);
    return 0;
}

/* The block encoding's fixed part: kind 0/1 (by parent) for n_tok = B, or
 * kind 2 (end) for 0 .. B-1 tokens. */
static void kv_block_header(const kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                            int end, uint32_t n_tok, uint8_t hdr[KV_REC_HASH_BLOCK_HDR_BYTES])
{
    uint8_t *p = hdr + 12;
    kv_le_put32(hdr, KV_REC_HASH_BLOCK_MAGIC);
    kv_le_put32(hdr + 4, KV_REC_HASH_VERSION);
    kv_le_put32(hdr + 8, end ? 2u : parent ? 1u : 0u);
    if (parent)
        memcpy(p, parent->b, KV_PREFIX_HASH_BYTES);
    else
        memset(p, 0, KV_PREFIX_HASH_BYTES);
    memcpy(p + 32, h->extra.b, KV_PREFIX_HASH_BYTES);
    kv_le_put32(p + 64, n_tok);
}

/* Token ids as little-endian u32 into dst (n tokens). */
static void kv_put_tokens(uint8_t *dst, const uint32_t *tokens, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, tokens, n * 4);
#else
    for (size_t i = 0; i < n; i++)
        kv_le_put32(dst + 4 * i, tokens[i]);
#endif
}

int kv_prefix_hash_encode_block(const kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                                const uint32_t *tokens, uint8_t *buf, size_t cap,
                                size_t *len)
{
    if (!h || !len || !tokens)
        return KV_EINVAL;
    size_t n = KV_REC_HASH_BLOCK_HDR_BYTES + 4 * (size_t)h->block_tokens;
    *len = n;
    if (!buf || cap < n)
        return KV_ERANGE;
    kv_block_header(h, parent, 0, h->block_tokens, buf);
    kv_put_tokens(buf + KV_REC_HASH_BLOCK_HDR_BYTES, tokens, h->block_tokens);
    return 0;
}

/* out = SHA-256(a[0..na-1] || the n_tok token ids as little-endian u32). */
static int kv_digest(kv_prefix_hasher_t *h, const void *a, size_t na, const uint32_t *tok,
                     size_t n_tok, kv_prefix_hash_t *out)
{
    unsigned int olen = 0;
    int ok = EVP_DigestInit_ex2(h->ctx, h->md, NULL) && EVP_DigestUpdate(h->ctx, a, na);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    ok = ok && (!n_tok || EVP_DigestUpdate(h->ctx, tok, 4 * n_tok));
#else
    uint8_t tmp[4 * 256];
    for (size_t t = 0; ok && t < n_tok; t += 256) {
        size_t m = n_tok - t < 256 ? n_tok - t : 256;
        kv_put_tokens(tmp, tok + t, m);
        ok = EVP_DigestUpdate(h->ctx, tmp, 4 * m);
    }
#endif
    ok = ok && EVP_DigestFinal_ex(h->ctx, out->b, &olen) && olen == KV_PREFIX_HASH_BYTES;
    return ok ? 0 : KV_EIO;
}

void kv_prefix_hash_destroy(kv_prefix_hasher_t *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->ctx);
    EVP_MD_free(h->md);
    kv_mem_free(h, sizeof *h);
}

int kv_prefix_hash_create(const kv_prefix_fp_t *fp, kv_prefix_hasher_t **out)
{
    size_t n = 0;
    int rc = out ? kv_prefix_fp_check(fp) : KV_EINVAL;
    if (rc)
        return rc;
    kv_prefix_hash_encode_extra(fp, NULL, 0, &n); /* the length only */
    kv_prefix_hasher_t *h = kv_mem_calloc(1, sizeof *h);
    uint8_t *enc = kv_mem_alloc(n);
    rc = KV_ENOMEM;
    if (!h || !enc)
        goto fail;
    h->block_tokens = fp->block_tokens;
    h->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    h->ctx = EVP_MD_CTX_new();
    rc = !h->md ? KV_ENOTSUP : !h->ctx ? KV_ENOMEM : 0;
    if (!rc)
        rc = kv_prefix_hash_encode_extra(fp, enc, n, &n);
    if (!rc)
        rc = kv_digest(h, enc, n, NULL, 0, &h->extra);
    if (rc)
        goto fail;
    kv_mem_free(enc, n);
    *out = h;
    return 0;
fail:
    kv_mem_free(enc, n);
    kv_prefix_hash_destroy(h);
    return rc;
}

uint32_t kv_prefix_hash_block_tokens(const kv_prefix_hasher_t *h)
{
    return h ? h->block_tokens : 0;
}

int kv_prefix_hash_extra(const kv_prefix_hasher_t *h, kv_prefix_hash_t *out)
{
    if (!h || !out)
        return KV_EINVAL;
    *out = h->extra;
    return 0;
}

int kv_prefix_hash_blocks(kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                          const uint32_t *tokens, size_t n_tokens,
                          kv_prefix_hash_t *out, size_t cap)
{
    if (!h)
        return KV_EINVAL;
    size_t nb = n_tokens / h->block_tokens;
    if (nb > cap)
        nb = cap;
    if (nb == 0)
        return 0;
    if (!tokens || !out)
        return KV_EINVAL;
    if (nb > (size_t)INT32_MAX)
        nb = INT32_MAX;
    const size_t B = h->block_tokens;
    uint8_t hdr[KV_REC_HASH_BLOCK_HDR_BYTES];
    kv_prefix_hash_t prev;
    for (size_t i = 0; i < nb; i++) {
        kv_block_header(h, i ? &prev : parent, 0, (uint32_t)B, hdr);
        int rc = kv_digest(h, hdr, sizeof hdr, tokens + i * B, B, &prev);
        if (rc)
            return rc;
        out[i] = prev;
    }
    return (int)nb;
}

int kv_prefix_hash_end(kv_prefix_hasher_t *h, const kv_prefix_hash_t *parent,
                       const uint32_t *tokens, size_t n_tokens, kv_prefix_hash_t *out)
{
    if (!h || !out || (n_tokens && !tokens) || n_tokens >= h->block_tokens)
        return KV_EINVAL;
    uint8_t hdr[KV_REC_HASH_BLOCK_HDR_BYTES];
    kv_block_header(h, parent, 1, (uint32_t)n_tokens, hdr);
    return kv_digest(h, hdr, sizeof hdr, tokens, n_tokens, out);
}
