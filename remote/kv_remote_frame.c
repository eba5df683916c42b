/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_frame.c — what the remote tier writes into a server: the key
 * string of a hash, its cluster hash slot, and the value header (64 bytes,
 * or 96 when signed; see kv_remote.h). Pure functions: the only state, a
 * client's MAC keys, is passed in.
 *
 * Header bytes: the value frame "KVRM" of util/kv_rec.h, layout version 1
 * (unsigned, 64 bytes) or 2 (signed, a client with a MAC key, 96 bytes;
 * kv_remote_mac.c).
 * A reader takes only the layout its configuration expects: a keyed one
 * only version 2 under a key it holds, an unkeyed one only version 1; the
 * other layout is refused as unauthenticated, an unknown one as corrupt.
 */
#include <string.h>

#include "kvpage/kvpage.h"
#include "util/kv_crc32c.h"
#include "util/kv_le.h"
#include "util/kv_rec.h"
#include "remote/kv_remote.h"
#include "remote/kv_remote_int.h"

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

/* Bytes 0..55 of a header of either layout. */
static void kv_frame_common(uint8_t *hdr, unsigned version, unsigned hbytes, const char *ns,
                            const kv_remote_key_t *key, uint32_t format, size_t len)
{
    kv_le_put32(hdr, KV_REC_FRAME_MAGIC);
    kv_le_put16(hdr + 4, version);
    kv_le_put16(hdr + 6, hbytes);
    kv_le_put32(hdr + 8, format);
    kv_le_put32(hdr + 12, kv_crc32c(0, ns, strlen(ns)));
    kv_le_put64(hdr + 16, len);
    memcpy(hdr + 24, key->hash, KV_REMOTE_HASH_BYTES);
}

/* The checks both layouts share on arguments and the iov. */
static int kv_frame_args(const char *ns, const kv_remote_key_t *key, const void *hdr,
                         const struct iovec *iov, int iovcnt, size_t len)
{
    size_t have = 0;
    if (!ns || !key || !hdr)
        return KV_EINVAL;
    int rc = kv_remote_iov_len(iov, iovcnt, &have);
    if (rc)
        return rc;
    return have != len ? KV_ERANGE : 0;
}

int kv_remote_frame_header(const char *ns, const kv_remote_key_t *key, uint32_t format,
                           const struct iovec *iov, int iovcnt, size_t len,
                           uint8_t hdr[KV_REC_FRAME_BYTES])
{
    int rc = kv_frame_args(ns, key, hdr, iov, iovcnt, len);
    if (rc)
        return rc;
    kv_frame_common(hdr, KV_REC_FRAME_VERSION, KV_REC_FRAME_BYTES, ns, key, format, len);
    kv_le_put32(hdr + 56, 0);
    uint32_t crc = kv_crc32c(0, hdr, 60);
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len)
            crc = kv_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    kv_le_put32(hdr + 60, crc);
    return 0;
}

int kv_remote_frame_header_signed(kv_remote_mac_t *mac, const char *ns,
                                  const kv_remote_key_t *key, uint32_t format,
                                  const struct iovec *iov, int iovcnt, size_t len,
                                  uint8_t hdr[KV_REC_FRAME_SIGNED_BYTES])
{
    int rc = mac ? kv_frame_args(ns, key, hdr, iov, iovcnt, len) : KV_EINVAL;
    if (rc)
        return rc;
    kv_frame_common(hdr, KV_REC_FRAME_SIGNED, KV_REC_FRAME_SIGNED_BYTES, ns, key, format, len);
    kv_le_put32(hdr + 56, kv_remote_mac_id(mac));
    kv_le_put32(hdr + 60, 0);
    return kv_remote_mac_sign(mac, hdr, ns, iov, iovcnt, hdr + 64);
}

int kv_remote_frame_open(kv_remote_mac_t *mac, const char *ns, const kv_remote_key_t *key,
                         const void *value, size_t n, const uint8_t **payload, size_t *len,
                         uint32_t *format)
{
    const uint8_t *v = value;
    if (!ns || !key || !v || !payload || !len || !format || n < 8 ||
        kv_le_get32(v) != KV_REC_FRAME_MAGIC)
        return KV_ECORRUPT;
    const unsigned version = kv_le_get16(v + 4);
    const size_t hb = version == KV_REC_FRAME_SIGNED ? KV_REC_FRAME_SIGNED_BYTES
                                                    : KV_REC_FRAME_BYTES;
    if (version != KV_REC_FRAME_VERSION && version != KV_REC_FRAME_SIGNED)
        return KV_ECORRUPT; /* a layout this reader does not know */
    if ((version == KV_REC_FRAME_SIGNED) != (mac != NULL))
        return KV_REMOTE_UNAUTH; /* signed for a keyed reader only, and back */
    if (n < hb || kv_le_get16(v + 6) != hb)
        return KV_ECORRUPT;
    uint64_t plen = kv_le_get64(v + 16);
    if (plen != n - hb || plen > KV_REMOTE_MAX_PAYLOAD)
        return KV_ECORRUPT;
    if (mac && kv_remote_mac_verify(mac, v, ns, v + hb, (size_t)plen))
        return KV_REMOTE_UNAUTH; /* before anything else of it is believed */
    if (kv_le_get32(v + 12) != kv_crc32c(0, ns, strlen(ns)) ||
        memcmp(v + 24, key->hash, KV_REMOTE_HASH_BYTES) != 0 ||
        kv_le_get32(v + (mac ? 60 : 56)) != 0 ||
        (!mac && kv_le_get32(v + 60) != kv_crc32c(kv_crc32c(0, v, 60), v + hb, plen)))
        return KV_ECORRUPT;
    *payload = v + hb;
    *len = (size_t)plen;
    *format = kv_le_get32(v + 8);
    return 0;
}

int kv_remote_frame_check(const char *ns, const kv_remote_key_t *key, const void *value,
                          size_t n, const uint8_t **payload, size_t *len, uint32_t *format)
{
    return kv_remote_frame_open(NULL, ns, key, value, n, payload, len, format) ? KV_ECORRUPT
                                                                                : 0;
}
