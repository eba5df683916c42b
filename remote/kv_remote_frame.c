/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_frame.c — what the remote tier writes into a server: the key
 * string of a hash, its cluster hash slot, and the 64-byte value header
 * (see kv_remote.h). Pure functions, no state.
 *
 * Header bytes (little-endian):
 *   0 "KVRM" | 4 u16 version (1) | 6 u16 header bytes (64) | 8 u32 format
 *   12 u32 crc32c(namespace) | 16 u64 payload length | 24 hash[32]
 *   56 u32 reserved (0) | 60 u32 crc32c(bytes 0..59, then the payload)
 */
#include <string.h>

#include "kvpage/kvpage.h"
#include "offload/kv_crc32c.h"
#include "remote/kv_remote.h"
#include "remote/kv_remote_int.h"

#define KV_FRAME_VERSION 1u

int kv_remote_key_string(const char *ns, const kv_remote_key_t *key, char *buf, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    if (!ns || !key || !buf)
        return KV_EINVAL;
    size_t nl = strlen(ns), n = nl + 1 + 2 * KV_REMOTE_HASH_BYTES;
    if (cap < n + 1)
        return KV_ERANGE;
    memcpy(buf, ns, nl);
    buf[nl] = ':';
    for (unsigned i = 0; i < KV_REMOTE_HASH_BYTES; i++) {
        buf[nl + 1 + 2 * i] = hex[key->hash[i] >> 4];
        buf[nl + 2 + 2 * i] = hex[key->hash[i] & 15];
    }
    buf[n] = 0;
    return (int)n;
}

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0), as Redis Cluster's keyslot. */
static uint16_t kv_crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

uint32_t kv_remote_slot(const void *key, size_t len)
{
    const uint8_t *k = key;
    size_t s = 0;
    while (s < len && k[s] != '{')
        s++;
    if (s < len) {
        size_t e = s + 1;
        while (e < len && k[e] != '}')
            e++;
        if (e < len && e > s + 1) /* a non-empty tag: hash only it */
            return kv_crc16(k + s + 1, e - s - 1) & 16383u;
    }
    return kv_crc16(k, len) & 16383u;
}

static void kv_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void kv_le32(uint8_t *p, uint32_t v)
{
    kv_le16(p, (uint16_t)v);
    kv_le16(p + 2, (uint16_t)(v >> 16));
}

static uint32_t kv_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int kv_remote_iov_len(const struct iovec *iov, int iovcnt, size_t *len)
{
    size_t n = 0;
    if (iovcnt < 0 || iovcnt > KV_REMOTE_MAX_IOV || (iovcnt && !iov))
        return KV_EINVAL;
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len && !iov[i].iov_base)
            return KV_EINVAL;
        if (iov[i].iov_len > KV_REMOTE_MAX_PAYLOAD - n)
            return KV_ERANGE;
        n += iov[i].iov_len;
    }
    *len = n;
    return 0;
}

int kv_remote_frame_header(const char *ns, const kv_remote_key_t *key, uint32_t format,
                           const struct iovec *iov, int iovcnt, size_t len,
                           uint8_t hdr[KV_REMOTE_HDR_BYTES])
{
    size_t have = 0;
    if (!ns || !key || !hdr)
        return KV_EINVAL;
    int rc = kv_remote_iov_len(iov, iovcnt, &have);
    if (rc)
        return rc;
    if (have != len)
        return KV_ERANGE;
    memcpy(hdr, "KVRM", 4);
    kv_le16(hdr + 4, KV_FRAME_VERSION);
    kv_le16(hdr + 6, KV_REMOTE_HDR_BYTES);
    kv_le32(hdr + 8, format);
    kv_le32(hdr + 12, kv_crc32c(0, ns, strlen(ns)));
    kv_le32(hdr + 16, (uint32_t)len);
    kv_le32(hdr + 20, (uint32_t)((uint64_t)len >> 32));
    memcpy(hdr + 24, key->hash, KV_REMOTE_HASH_BYTES);
    kv_le32(hdr + 56, 0);
    uint32_t crc = kv_crc32c(0, hdr, 60);
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len)
            crc = kv_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    kv_le32(hdr + 60, crc);
    return 0;
}

int kv_remote_frame_check(const char *ns, const kv_remote_key_t *key, const void *value,
                          size_t n, const uint8_t **payload, size_t *len, uint32_t *format)
{
    const uint8_t *v = value;
    if (!ns || !key || !v || !payload || !len || !format || n < KV_REMOTE_HDR_BYTES)
        return KV_ECORRUPT;
    uint64_t plen = (uint64_t)kv_rd32(v + 16) | (uint64_t)kv_rd32(v + 20) << 32;
    if (memcmp(v, "KVRM", 4) != 0 || (v[4] | v[5] << 8) != KV_FRAME_VERSION ||
        (v[6] | v[7] << 8) != KV_REMOTE_HDR_BYTES || plen != n - KV_REMOTE_HDR_BYTES ||
        plen > KV_REMOTE_MAX_PAYLOAD || kv_rd32(v + 12) != kv_crc32c(0, ns, strlen(ns)) ||
        memcmp(v + 24, key->hash, KV_REMOTE_HASH_BYTES) != 0 || kv_rd32(v + 56) != 0 ||
        kv_rd32(v + 60) != kv_crc32c(kv_crc32c(0, v, 60), v + KV_REMOTE_HDR_BYTES, plen))
        return KV_ECORRUPT;
    *payload = v + KV_REMOTE_HDR_BYTES;
    *len = (size_t)plen;
    *format = kv_rd32(v + 8);
    return 0;
}
