/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_mac.c — authentication of remote values: HMAC-SHA-256 (OpenSSL
 * libcrypto) under a deployment key, for the signed frame (layout version
 * 2, docs/prefix.md "Signed values"):
 *
 *   MAC = HMAC-SHA-256(key, header bytes 0..63 | u8 len(ns) | ns | payload)
 *
 * stored in header bytes 64..95. Header bytes 56..59 carry the signing
 * key's id, the first 4 bytes of HMAC-SHA-256(key, "kvpage remote key id"):
 * a reader picks the key it holds under that id (current or previous), so
 * a value costs one HMAC whichever key signed it. The id says nothing
 * useful about a key of 32 random bytes.
 *
 * A mac state holds up to two keys (slot 0 signs and checks, slot 1 only
 * checks: the key before a rotation), each as an HMAC context keyed once
 * and re-initialised per value (EVP_MAC_init with a NULL key keeps the
 * key). Comparison is constant-time (CRYPTO_memcmp). Key bytes live only
 * inside the contexts; the copy in the caller's config is the caller's.
 *
 * Ownership: the state is kv_mem memory; one thread uses it at a time (it
 * belongs to one client). Errors: 0 or a negative KV_E* code.
 */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

struct kv_remote_mac {
    EVP_MAC *mac;              /* HMAC, fetched once                          */
    EVP_MAC_CTX *ctx[2];       /* [0] current key, [1] previous (may be NULL) */
    uint32_t id[2];            /* their key ids                               */
};

static int kv_mac_key(kv_remote_mac_t *m, int slot, const uint8_t *key, size_t len)
{
    static const char idmsg[] = "kvpage remote key id";
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    uint8_t out[32];
    size_t ol = 0;
    m->ctx[slot] = EVP_MAC_CTX_new(m->mac);
    if (!m->ctx[slot])
        return KV_ENOMEM;
    if (!EVP_MAC_init(m->ctx[slot], key, len, params) ||
        !EVP_MAC_update(m->ctx[slot], (const uint8_t *)idmsg, sizeof idmsg - 1) ||
        !EVP_MAC_final(m->ctx[slot], out, &ol, sizeof out) || ol != sizeof out)
        return KV_EIO;
    m->id[slot] = (uint32_t)out[0] | (uint32_t)out[1] << 8 | (uint32_t)out[2] << 16 |
                  (uint32_t)out[3] << 24;
    OPENSSL_cleanse(out, sizeof out);
    return 0;
}

void kv_remote_mac_destroy(kv_remote_mac_t *m)
{
    if (!m)
        return;
    EVP_MAC_CTX_free(m->ctx[0]); /* (frees and cleanses the key) */
    EVP_MAC_CTX_free(m->ctx[1]);
    EVP_MAC_free(m->mac);
    kv_mem_free(m, sizeof *m);
}

int kv_remote_mac_check_key(const void *key, uint32_t len)
{
    return !key ? (len ? KV_EINVAL : 0)
         : len < KV_REMOTE_MAC_KEY_MIN || len > KV_REMOTE_MAC_KEY_MAX ? KV_ERANGE : 0;
}

int kv_remote_mac_create(const uint8_t *key, size_t len, const uint8_t *prev, size_t prev_len,
                         kv_remote_mac_t **out)
{
    kv_remote_mac_t *m = kv_mem_calloc(1, sizeof *m);
    if (!m)
        return KV_ENOMEM;
    m->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    int rc = m->mac ? kv_mac_key(m, 0, key, len) : KV_ENOTSUP;
    if (!rc && prev)
        rc = kv_mac_key(m, 1, prev, prev_len);
    if (rc) {
        kv_remote_mac_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

uint32_t kv_remote_mac_id(const kv_remote_mac_t *m)
{
    return m->id[0];
}

/* HMAC of (hdr[0..63], ns, payload pieces) under slot's key into out. */
static int kv_mac_run(kv_remote_mac_t *m, int slot, const uint8_t *hdr, const char *ns,
                      const struct iovec *iov, int iovcnt, uint8_t out[32])
{
    EVP_MAC_CTX *c = m->ctx[slot];
    size_t nl = strlen(ns), ol = 0;
    uint8_t nlb = (uint8_t)nl;
    int ok = EVP_MAC_init(c, NULL, 0, NULL) && EVP_MAC_update(c, hdr, 64) &&
             EVP_MAC_update(c, &nlb, 1) && EVP_MAC_update(c, (const uint8_t *)ns, nl);
    for (int i = 0; ok && i < iovcnt; i++)
        if (iov[i].iov_len)
            ok = EVP_MAC_update(c, iov[i].iov_base, iov[i].iov_len);
    ok = ok && EVP_MAC_final(c, out, &ol, 32) && ol == 32;
    return ok ? 0 : KV_EIO;
}

int kv_remote_mac_sign(kv_remote_mac_t *m, const uint8_t *hdr, const char *ns,
                       const struct iovec *iov, int iovcnt, uint8_t out[32])
{
    return kv_mac_run(m, 0, hdr, ns, iov, iovcnt, out);
}

int kv_remote_mac_verify(kv_remote_mac_t *m, const uint8_t *hdr, const char *ns,
                         const void *payload, size_t len)
{
    uint32_t id = (uint32_t)hdr[56] | (uint32_t)hdr[57] << 8 | (uint32_t)hdr[58] << 16 |
                  (uint32_t)hdr[59] << 24;
    int slot = id == m->id[0] ? 0 : m->ctx[1] && id == m->id[1] ? 1 : -1;
    if (slot < 0)
        return KV_ECORRUPT; /* signed with a key we do not hold */
    uint8_t want[32];
    struct iovec iov = {(void *)payload, len};
    int rc = kv_mac_run(m, slot, hdr, ns, &iov, 1, want);
    if (!rc && CRYPTO_memcmp(want, hdr + 64, 32) != 0)
        rc = KV_ECORRUPT;
    OPENSSL_cleanse(want, sizeof want);
    return rc ? KV_ECORRUPT : 0;
}
