/* SPDX-License-Identifier: MIT */
/*
 * kv_sha256.h — SHA-256 (FIPS 180-4), to check the model file against the
 * hash pinned in kv_model.h. Streaming: init, update any number of times,
 * final. No allocation.
 */
#ifndef KV_SHA256_H
#define KV_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_sha256 {
    uint32_t h[8];       /* chaining state                  */
    uint64_t len;        /* message bytes so far            */
    uint8_t buf[64];     /* partial block                   */
    uint32_t fill;       /* bytes in buf                    */
} kv_sha256_t;

void kv_sha256_init(kv_sha256_t *s);
void kv_sha256_update(kv_sha256_t *s, const void *data, size_t n);
void kv_sha256_final(kv_sha256_t *s, uint8_t out[32]);

/* Lowercase hex of a digest into hex[65]. */
void kv_sha256_hex(const uint8_t d[32], char hex[65]);

#endif /* KV_SHA256_H */
