/* SPDX-License-Identifier: MIT */
/*
 * fuzz_remote.c — libFuzzer target for what the remote tier reads from a
 * server or a user: the value frame check (remote/kv_remote_frame.c) and
 * the url parser (remote/kv_remote_url.c).
 *
 * Input: byte 0 % 3 selects.
 *   0: the rest is a value read under key hash bytes 1..32 (zero-padded) in
 *      namespace "kvp"; property: the check never reads outside the value,
 *      and a value it accepts re-frames (header built from its payload,
 *      format, key and namespace) to exactly its own bytes.
 *   1: the rest (up to a NUL) is a url; property: parsing returns 0 with
 *      1..64 seeds, each with a non-empty host and a port in 1..65535, or
 *      KV_EINVAL / KV_ERANGE, and never crashes; its redaction
 *      (kv_remote_url_redact) hides the password it parsed.
 *   2: bytes 1..2 = a position (little-endian), byte 3 = an xor mask, the
 *      rest = a payload: a valid value is framed around it and the byte at
 *      the position (if inside) is xored; property: the check accepts it
 *      exactly when nothing changed (every single-byte change is caught).
 * With byte 0 >= 128, modes 0 and 2 use signed values (layout 2) under a
 * fixed MAC key, checked by a keyed reader (kv_remote_frame_open): the same
 * properties, and a value is never accepted by the other kind of reader.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote.h"
#include "remote/kv_remote_int.h"

/* The keyed reader's MAC state (a fixed key), made once. */
static kv_remote_mac_t *fuzz_mac(void)
{
    static kv_remote_mac_t *m;
    static const uint8_t key[32] = "kvpage fuzz_remote fixed mac key";
    if (!m && kv_remote_mac_create(key, sizeof key, NULL, 0, &m))
        abort();
    return m;
}

/* Signed values: modes 0 and 2 of the header comment, for a keyed reader. */
static void fuzz_signed(int mode, const uint8_t *p, size_t n)
{
    const size_t H = KV_REC_FRAME_SIGNED_BYTES;
    kv_remote_mac_t *mac = fuzz_mac();
    kv_remote_key_t key;
    const uint8_t *payload;
    size_t plen;
    uint32_t format;
    if (mode == 2) {
        if (n < 3)
            return;
        size_t pos = (size_t)p[0] | (size_t)p[1] << 8, len = n - 3, vlen = H + len;
        uint8_t mask = p[2], *v = malloc(vlen);
        memset(&key, 0x4B, sizeof key);
        struct iovec io = {(void *)(p + 3), len};
        memcpy(v + H, p + 3, len);
        if (kv_remote_frame_header_signed(mac, "kvp", &key, 7, &io, 1, len, v) != 0)
            abort();
        int changed = pos < vlen && mask != 0;
        if (pos < vlen)
            v[pos] ^= mask;
        int rc = kv_remote_frame_open(mac, "kvp", &key, v, vlen, &payload, &plen, &format);
        if ((rc == 0) == changed || (rc == 0 && (plen != len || format != 7)) ||
            kv_remote_frame_check("kvp", &key, v, vlen, &payload, &plen, &format) == 0)
            abort();
        free(v);
        return;
    }
    memset(&key, 0, sizeof key);
    memcpy(key.hash, p, n < 32 ? n : 32);
    uint8_t *v = malloc(n ? n : 1); /* exact size: ASan sees any overread */
    memcpy(v, p, n);
    if (kv_remote_frame_open(mac, "kvp", &key, v, n, &payload, &plen, &format) == 0) {
        uint8_t hdr[KV_REC_FRAME_SIGNED_BYTES];
        struct iovec io = {(void *)payload, plen};
        if (plen + H != n || payload != v + H ||
            kv_remote_frame_header_signed(mac, "kvp", &key, format, &io, 1, plen, hdr) != 0 ||
            memcmp(hdr, v, H) != 0 ||
            kv_remote_frame_check("kvp", &key, v, n, &payload, &plen, &format) == 0)
            abort();
    }
    free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (data[0] >= 128 && data[0] % 3 != 1) {
        fuzz_signed(data[0] % 3, p, n);
        return 0;
    }
    if (data[0] % 3 == 2) {
        if (n < 3)
            return 0;
        size_t pos = (size_t)p[0] | (size_t)p[1] << 8, len = n - 3, vlen, plen;
        uint8_t mask = p[2], *v = malloc(KV_REC_FRAME_BYTES + len);
        kv_remote_key_t key;
        memset(&key, 0x4B, sizeof key);
        struct iovec io = {(void *)(p + 3), len};
        memcpy(v + KV_REC_FRAME_BYTES, p + 3, len);
        if (kv_remote_frame_header("kvp", &key, 7, &io, 1, len, v) != 0)
            abort();
        vlen = KV_REC_FRAME_BYTES + len;
        int changed = pos < vlen && mask != 0;
        if (pos < vlen)
            v[pos] ^= mask;
        const uint8_t *payload;
        uint32_t format;
        int rc = kv_remote_frame_check("kvp", &key, v, vlen, &payload, &plen, &format);
        if ((rc == 0) == changed || (rc == 0 && (plen != len || format != 7)))
            abort();
        free(v);
        return 0;
    }
    if (data[0] % 3 == 0) {
        kv_remote_key_t key;
        memset(&key, 0, sizeof key);
        memcpy(key.hash, p, n < 32 ? n : 32);
        uint8_t *v = malloc(n ? n : 1); /* exact size: ASan sees any overread */
        memcpy(v, p, n);
        const uint8_t *payload;
        size_t len;
        uint32_t format;
        if (kv_remote_frame_check("kvp", &key, v, n, &payload, &len, &format) == 0) {
            uint8_t hdr[KV_REC_FRAME_BYTES];
            struct iovec io = {(void *)payload, len};
            if (len + KV_REC_FRAME_BYTES != n || payload != v + KV_REC_FRAME_BYTES ||
                kv_remote_frame_header("kvp", &key, format, &io, 1, len, hdr) != 0 ||
                memcmp(hdr, v, KV_REC_FRAME_BYTES) != 0)
                abort();
        }
        free(v);
        return 0;
    }
    char *url = malloc(n + 1);
    memcpy(url, p, n);
    url[n] = 0;
    kv_remote_url_t u;
    int rc = kv_remote_url_parse(url, &u);
    const int had_pass = rc == 0 && u.pass[0]; /* (u.pass is wiped below) */
    if (rc == 0) {
        if (u.n < 1 || u.n > KV_REMOTE_MAX_SEEDS || ((u.user[0] || u.pass[0]) && !strchr(url, '@')))
            abort();
        for (uint32_t i = 0; i < u.n; i++)
            if (!u.seeds[i].host[0] || u.seeds[i].port == 0)
                abort();
        kv_mem_free(u.seeds, u.n * sizeof *u.seeds);
    } else if (rc != KV_EINVAL && rc != KV_ENOMEM && rc != KV_ERANGE) {
        abort();
    }
    kv_remote_wipe(u.pass, sizeof u.pass);
    /* a redacted url never holds the password */
    char red[2048];
    int rl = kv_remote_url_redact(url, red, sizeof red);
    if (rl < 0 || (had_pass && (size_t)rl < sizeof red && !strstr(red, ":***@")))
        abort();
    free(url);
    return 0;
}
